"""``run()`` and ``for_decode_definition()``: validate the call, then launch the kernel on CUDA or in the interpreter.

One validation and one launch serve every definition of the family: the shape constants
(query heads, KV heads, head dim, page size) come from a ``KernelShape``, the seed's for
``run`` and the definition's for what ``for_decode_definition`` returns.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._kernel import gqa_paged_decode_kernel
from .interpreter_compat import interpreter_enabled

NUM_QO_HEADS = 32
NUM_KV_HEADS = 4
HEAD_DIM = 128
PAGE_SIZE = 1
BLOCK_N = 128
# tl.dot's M is the padded head count: a power of two, at least 16. The head-dim limits are what the
# kernel's tiles ([BLOCK_N, head_dim] K and V blocks, a [heads, head_dim] accumulator) are written for.
MIN_BLOCK_H, MAX_BLOCK_H = 16, 128
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256

_INDEX_DTYPES = (torch.int32, torch.int64)
_CONSTANTS = ("num_qo_heads", "num_kv_heads", "head_dim", "page_size")  # what a definition fixes


def default_sm_scale(head_dim: int) -> float:
    """The contract's default softmax scale, 1/sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)


DEFAULT_SM_SCALE = default_sm_scale(HEAD_DIM)


@dataclass(frozen=True)
class KernelShape:
    """The compile-time constants of one definition, and its name (for messages)."""

    name: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int

    @property
    def constants(self) -> tuple[int, int, int, int]:
        return self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size

    @property
    def paged(self) -> bool:
        """Pages of several tokens: the call takes ``kv_last_page_len``."""
        return self.page_size > 1

    @property
    def block_heads(self) -> int:
        """Query heads padded to tl.dot's M: the next power of two, at least MIN_BLOCK_H."""
        return max(MIN_BLOCK_H, 1 << (self.num_qo_heads - 1).bit_length())


SEED_SHAPE = KernelShape("gqa_paged_decode_h32_kv4_d128_ps1", NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE)


def _unsupported(definition) -> str | None:
    """Why the kernel cannot serve ``definition``'s constants, or None."""
    for name in _CONSTANTS:
        value = getattr(definition, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name}={value!r} must be a positive integer"
    heads, kv_heads, dim = definition.num_qo_heads, definition.num_kv_heads, definition.head_dim
    if heads % kv_heads:
        return f"num_qo_heads={heads} is not a multiple of num_kv_heads={kv_heads}"
    if heads > MAX_BLOCK_H:
        return f"num_qo_heads={heads} is more than the {MAX_BLOCK_H} query heads one program holds"
    if dim & (dim - 1) or not MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM:
        return f"head_dim={dim} is not a power of two in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    return None


def kernel_shape(definition) -> KernelShape:
    """The ``KernelShape`` of a definition (anything with ``name``, ``num_qo_heads``, ``num_kv_heads``,
    ``head_dim`` and ``page_size``); ValueError naming the definition when the kernel cannot compile it."""
    name = getattr(definition, "name", repr(definition))
    missing = [a for a in _CONSTANTS if not hasattr(definition, a)]
    if missing:
        raise TypeError(f"definition {name!r} has no {', '.join(missing)}: not a GQA paged-decode definition")
    reason = _unsupported(definition)
    if reason:
        raise ValueError(f"definition {name!r} is not supported by this kernel: {reason}")
    return KernelShape(name, *(getattr(definition, a) for a in _CONSTANTS))


def _require_tensor(name: str, value, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        wanted = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype {wanted}, got {value.dtype}")


def _require_shape(name: str, value: torch.Tensor, expected: tuple) -> None:
    """``expected`` holds ints and None (any size)."""
    if value.dim() != len(expected) or any(e is not None and s != e for s, e in zip(value.shape, expected)):
        shown = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        raise ValueError(f"{name} must have shape {shown}, got {list(value.shape)}")


def _check_devices(tensors: dict[str, torch.Tensor]) -> torch.device:
    device = tensors["q"].device
    for name, tensor in tensors.items():
        if tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device} but q is on {device}; all inputs must share a device")
    if device.type == "cuda" or (device.type == "cpu" and interpreter_enabled()):
        return device
    raise ValueError(f"q is on {device}: the kernel needs CUDA tensors, or TRITON_INTERPRET=1 for CPU tensors")


def _last_page_facts(steps: torch.Tensor, kv_last_page_len: torch.Tensor, extreme) -> list[torch.Tensor]:
    """min and max of kv_last_page_len, and the first sequence with pages whose last page is empty (or B)."""
    batch = kv_last_page_len.shape[0]
    empty_last = (steps > 0) & (kv_last_page_len == 0)
    positions = torch.arange(batch, device=steps.device)
    first_bad = torch.where(empty_last, positions, batch)
    return [extreme(kv_last_page_len, torch.min), extreme(kv_last_page_len, torch.max), extreme(first_bad, torch.min)]


def _check_last_pages(facts: list[int], page_size: int, batch: int) -> None:
    low, high, first_bad = facts
    if batch and (low < 0 or high > page_size):
        raise ValueError(f"kv_last_page_len must lie in [0, {page_size}] (tokens in each sequence's last page), "
                         f"got values in [{low}, {high}]")
    if batch and first_bad < batch:
        raise ValueError(f"kv_last_page_len[{first_bad}]=0 but sequence {first_bad} has pages: its last page "
                         f"must hold 1..{page_size} tokens")


def _reduced(values: torch.Tensor, reduce, zero: torch.Tensor) -> torch.Tensor:
    """``reduce(values)`` as int64, or ``zero`` for an empty tensor."""
    return reduce(values).to(torch.int64) if values.numel() else zero


def _indptr_facts(indptr: torch.Tensor, zero: torch.Tensor) -> list[torch.Tensor]:
    """indptr[0], indptr[-1] and its smallest step, on the device (the caller reads them back)."""
    steps = indptr[1:] - indptr[:-1]
    return [indptr[0].to(torch.int64), indptr[-1].to(torch.int64), _reduced(steps, torch.min, zero)]


def _check_indptr(name: str, facts: list[int], length: int, length_name: str) -> None:
    """``_indptr_facts`` read back: starts at 0, never decreases, ends at ``length`` (``length_name``'s)."""
    first, last, min_step = facts
    if first != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0]={first}")
    if min_step < 0:
        raise ValueError(f"{name} must be non-decreasing")
    if last != length:
        raise ValueError(f"{name}[-1]={last} must equal {length_name} ({length})")


def _page_facts(kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                kv_last_page_len: torch.Tensor | None) -> list[torch.Tensor]:
    """What ``_check_page_facts`` checks, on the device: kv_indptr's facts, the page ids' range, the last pages'."""
    zero = torch.zeros((), dtype=torch.int64, device=kv_indptr.device)

    def extreme(values: torch.Tensor, reduce) -> torch.Tensor:
        return _reduced(values, reduce, zero)

    facts = [*_indptr_facts(kv_indptr, zero), extreme(kv_indices, torch.min), extreme(kv_indices, torch.max)]
    if kv_last_page_len is not None:
        facts += _last_page_facts(kv_indptr[1:] - kv_indptr[:-1], kv_last_page_len, extreme)
    return facts


def _check_page_facts(facts: list[int], kv_indices: torch.Tensor, num_pages: int,
                      kv_last_page_len: torch.Tensor | None, page_size: int) -> None:
    """``_page_facts`` read back; ValueError naming the argument that breaks an invariant."""
    _check_indptr("kv_indptr", facts[:3], kv_indices.shape[0], "the length of kv_indices")
    min_page, max_page = facts[3:5]
    if kv_indices.numel() and (min_page < 0 or max_page >= num_pages):
        raise ValueError(
            f"kv_indices must lie in [0, {num_pages}) (the page pool), got values in [{min_page}, {max_page}]"
        )
    if kv_last_page_len is not None:
        _check_last_pages(facts[5:], page_size, kv_last_page_len.shape[0])


def _check_indices(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, num_pages: int,
                   kv_last_page_len: torch.Tensor | None = None, page_size: int = 1) -> None:
    """Index invariants, read back with one device sync."""
    facts = torch.stack(_page_facts(kv_indptr, kv_indices, kv_last_page_len)).tolist()
    _check_page_facts(facts, kv_indices, num_pages, kv_last_page_len, page_size)


def _check_scale(sm_scale, default: float) -> float:
    if sm_scale is None:
        return default
    if isinstance(sm_scale, torch.Tensor) and sm_scale.numel() == 1:
        sm_scale = sm_scale.item()
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"sm_scale must be a real number or None, got {type(sm_scale).__name__}")
    if not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale}")
    # The kernel takes it as float32: a larger finite double would arrive as inf.
    if not math.isfinite(float(torch.tensor(float(sm_scale), dtype=torch.float32))):
        raise ValueError(f"sm_scale={sm_scale} is outside the float32 range the kernel computes in")
    return float(sm_scale)


def _check_tensors(shape: KernelShape, tensors: dict[str, torch.Tensor]) -> torch.device:
    """Types, dtypes, shapes and devices of the tensor arguments; returns their device."""
    heads, kv_heads, dim, page = shape.constants
    for name in ("q", "k_cache", "v_cache"):
        _require_tensor(name, tensors[name], (torch.bfloat16,))
    for name in ("kv_indptr", "kv_indices", "kv_last_page_len"):
        if name in tensors:
            _require_tensor(name, tensors[name], _INDEX_DTYPES)
    q, k_cache = tensors["q"], tensors["k_cache"]
    _require_shape("q", q, (None, heads, dim))
    batch = q.shape[0]
    _require_shape("k_cache", k_cache, (None, page, kv_heads, dim))
    _require_shape("v_cache", tensors["v_cache"], (k_cache.shape[0], page, kv_heads, dim))
    _require_shape("kv_indptr", tensors["kv_indptr"], (batch + 1,))
    _require_shape("kv_indices", tensors["kv_indices"], (None,))
    if "kv_last_page_len" in tensors:
        _require_shape("kv_last_page_len", tensors["kv_last_page_len"], (batch,))
    return _check_devices(tensors)


def _validated(shape: KernelShape, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor | None, sm_scale):
    """One call of ``shape``'s contract checked: its device, scale and contiguous index tensors."""
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "kv_indptr": kv_indptr, "kv_indices": kv_indices}
    if shape.paged:
        tensors["kv_last_page_len"] = kv_last_page_len
    device = _check_tensors(shape, tensors)
    scale = _check_scale(sm_scale, default_sm_scale(shape.head_dim))
    kv_indptr, kv_indices = kv_indptr.contiguous(), kv_indices.contiguous()
    if shape.paged:
        kv_last_page_len = kv_last_page_len.contiguous()
    _check_indices(kv_indptr, kv_indices, k_cache.shape[0], kv_last_page_len, shape.page_size)
    return device, scale, kv_indptr, kv_indices, kv_last_page_len


def validate(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_indptr: torch.Tensor,
             kv_indices: torch.Tensor, sm_scale: float | None = None) -> None:
    """Check a call of ``run`` as ``run`` does, launching nothing: raises its TypeError or ValueError naming the
    argument. For implementations that want the seed kernel's input contract without its kernel."""
    _validated(SEED_SHAPE, q, k_cache, v_cache, kv_indptr, kv_indices, None, sm_scale)


def _decode(shape: KernelShape, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor | None,
            sm_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate one call of ``shape``'s contract (``kv_last_page_len`` None exactly when not paged), then launch."""
    device, scale, kv_indptr, kv_indices, kv_last_page_len = _validated(
        shape, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale)
    batch = q.shape[0]
    output = torch.empty((batch, shape.num_qo_heads, shape.head_dim), dtype=torch.bfloat16, device=device)
    lse = torch.empty((batch, shape.num_qo_heads), dtype=torch.float32, device=device)
    if batch == 0:
        return output, lse
    on_gpu = device.type == "cuda"
    with torch.cuda.device(device) if on_gpu else contextlib.nullcontext():
        gqa_paged_decode_kernel[(batch,)](
            q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, scale, output, lse,
            q.stride(0), q.stride(1), q.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
            output.stride(0), output.stride(1), output.stride(2),
            lse.stride(0), lse.stride(1),
            NUM_QO_HEADS=shape.num_qo_heads, NUM_KV_HEADS=shape.num_kv_heads, HEAD_DIM=shape.head_dim,
            PAGE_SIZE=shape.page_size, BLOCK_H=shape.block_heads, BLOCK_N=BLOCK_N,
            num_warps=4, num_stages=2,
        )
    return output, lse


def run(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched GQA decode over a paged KV cache (32 query heads, 4 KV heads, dim 128, page size 1).

    The seed definition's kernel; ``run.for_definition(definition)`` gives the kernel of any other
    definition of the family.

    Args:
        q: [B, 32, 128] bfloat16, one query token per sequence; any strides.
        k_cache: [P, 1, 4, 128] bfloat16 key pages; any strides.
        v_cache: [P, 1, 4, 128] bfloat16 value pages; any strides.
        kv_indptr: [B + 1] int32 (int64 accepted); sequence b owns
            ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``.
        kv_indices: [kv_indptr[-1]] int32 (int64 accepted) page ids, in token order.
        sm_scale: softmax scale, applied in float32; default 1/sqrt(128).

    Returns:
        ``(output, lse)``: output [B, 32, 128] bfloat16, and lse [B, 32] float32, the
        base-2 log-sum-exp of the scaled logits. An empty sequence gives output 0 and
        lse -inf.

    Raises:
        TypeError: an argument of the wrong type or dtype (the message names it).
        ValueError: a wrong shape or device, or inconsistent indices (the message names them).
    """
    return _decode(SEED_SHAPE, q, k_cache, v_cache, kv_indptr, kv_indices, None, sm_scale)


_DOC = """Batched GQA decode over a paged KV cache for {name}: {heads} query heads over {kv_heads} KV heads,
head dim {dim}, page size {page}; query head h reads KV head h // {group}.

Arguments, returns and errors as ``kernel.run``'s, with these shapes: q [B, {heads}, {dim}];
k_cache and v_cache [P, {page}, {kv_heads}, {dim}]; output [B, {heads}, {dim}] and lse [B, {heads}].{paged}
"""
_PAGED_DOC = """
kv_indptr counts pages; kv_last_page_len [B] int32 (int64 accepted) holds the tokens in each
sequence's last page, 1..{page} for a sequence with pages (a sequence without pages is empty
whatever it holds, 0..{page}); sequence b has (pages - 1) * {page} + kv_last_page_len[b] tokens."""


def _described(function: Callable, shape: KernelShape) -> Callable:
    heads, kv_heads, dim, page = shape.constants
    function.__doc__ = _DOC.format(name=shape.name, heads=heads, kv_heads=kv_heads, dim=dim, page=page,
                                   group=heads // kv_heads, paged=_PAGED_DOC.format(page=page) if shape.paged else "")
    function.__qualname__ = f"run[{shape.name}]"
    function.shape = shape
    return function


def _unpaged_run(shape: KernelShape) -> Callable:
    def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
        return _decode(shape, q, k_cache, v_cache, kv_indptr, kv_indices, None, sm_scale)

    return _described(run, shape)


def _paged_run(shape: KernelShape) -> Callable:
    def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None):
        return _decode(shape, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale)

    return _described(run, shape)


_served: dict[tuple[int, int, int, int], Callable] = {SEED_SHAPE.constants: run}


def for_decode_definition(definition) -> Callable:
    """The validated decode kernel of ``definition`` (read for ``name``, ``num_qo_heads``, ``num_kv_heads``,
    ``head_dim`` and ``page_size``), one function per set of constants, cached: ``run`` itself for the seed's.

    Page size 1: ``run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None)``; larger pages:
    ``run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None)``.
    Raises ValueError naming the definition when the kernel cannot compile its shape.
    """
    shape = kernel_shape(definition)
    served = _served.get(shape.constants)
    if served is None:
        served = _served.setdefault(shape.constants, (_paged_run if shape.paged else _unpaged_run)(shape))
    return served
