"""``for_prefill()`` and ``for_prefill_definition()``: validate a causal prefill call, then launch its kernel.

One validation and one launch serve every prefill definition, paged (any page size; ``kv_last_page_len``
with pages of several tokens) and ragged: the constants come from a ``PrefillShape``. The checks are the
decode launcher's (its helpers, its messages), plus ``qo_indptr``'s, read back in the same one sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._launch import (
    _INDEX_DTYPES,
    MAX_HEAD_DIM,
    MIN_HEAD_DIM,
    _check_devices,
    _check_indptr,
    _check_page_facts,
    _check_scale,
    _indptr_facts,
    _page_facts,
    _reduced,
    _require_shape,
    _require_tensor,
    default_sm_scale,
)
from ._prefill_kernel import gqa_causal_prefill_kernel

BLOCK_M = 64  # query rows ((token, head) pairs of one KV head's group) per program
# Key tokens per block: 64, 32 at head dim 256 (K and V tiles of 32 KiB each). Both are at least the bound's 16.
BLOCK_N = {256: 32}
DEFAULT_BLOCK_N = 64
MAX_GRID_TILES = 65535  # CUDA's limit on the grid's second dimension

# Op types. FlashInfer-Bench's definition files say "gqa_paged" for paged decode and paged prefill alike (their
# names tell them apart: gqa_paged_decode_..., gqa_paged_prefill_causal_...) and "gqa_ragged" for ragged prefill.
SHARED_PAGED_OP_TYPE = "gqa_paged"
# the benchmark's op_type fields, and the contract's own op types (reference.definitions.OP_TYPES)
DECODE_OP_TYPES = ("gqa_paged_decode", "decode")
PAGED_OP_TYPES = ("gqa_paged_prefill", "paged_prefill")
RAGGED_OP_TYPES = ("gqa_ragged", "gqa_ragged_prefill", "ragged_prefill")
PAGED_PREFILL_PREFIX, RAGGED_PREFILL_PREFIX = "gqa_paged_prefill", "gqa_ragged_prefill"
_INDEX_ARGUMENTS = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")  # read contiguous


@dataclass(frozen=True)
class PrefillShape:
    """The compile-time constants of one prefill definition, and its name (for messages)."""

    name: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int  # 1 for ragged K and V
    ragged: bool

    @property
    def group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def paged(self) -> bool:
        """Pages of several tokens: the call takes ``kv_last_page_len``."""
        return not self.ragged and self.page_size > 1

    @property
    def block_n(self) -> int:
        return BLOCK_N.get(self.head_dim, DEFAULT_BLOCK_N)


def prefill_kind(definition) -> str | None:
    """'paged' or 'ragged' for a causal prefill definition, None for a decode one: read for ``op_type``, and for
    the name where the op type does not tell (none given, or FlashInfer-Bench's "gqa_paged" for both).

    ValueError naming the definition for any other op type.
    """
    name = str(getattr(definition, "name", ""))
    op_type = getattr(definition, "op_type", None)
    if op_type in RAGGED_OP_TYPES or (op_type is None and name.startswith(RAGGED_PREFILL_PREFIX)):
        return "ragged"
    if op_type in PAGED_OP_TYPES or (op_type in (None, SHARED_PAGED_OP_TYPE) and name.startswith(PAGED_PREFILL_PREFIX)):
        return "paged"
    if op_type in (None, SHARED_PAGED_OP_TYPE, *DECODE_OP_TYPES):
        return None
    served = ", ".join((SHARED_PAGED_OP_TYPE, *DECODE_OP_TYPES, *PAGED_OP_TYPES, *RAGGED_OP_TYPES))
    raise ValueError(f"definition {name!r} has op_type {op_type!r}: this kernel serves GQA paged decode and causal "
                     f"prefill ({served})")


def _unsupported(heads, kv_heads, dim, page_size, ragged) -> str | None:
    """Why the kernel cannot serve these constants, or None."""
    values = {"num_qo_heads": heads, "num_kv_heads": kv_heads, "head_dim": dim}
    if not ragged:
        values["page_size"] = page_size
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name}={value!r} must be a positive integer"
    if ragged and page_size not in (None, 1):
        return f"page_size={page_size!r}: ragged K and V have no pages (give None)"
    if heads % kv_heads:
        return f"num_qo_heads={heads} is not a multiple of num_kv_heads={kv_heads}"
    if dim & (dim - 1) or not MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM:
        return f"head_dim={dim} is not a power of two in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    return None


def prefill_shape(name: str, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int | None,
                  ragged: bool) -> PrefillShape:
    """The ``PrefillShape`` of these constants; ValueError naming ``name`` when the kernel cannot compile them."""
    reason = _unsupported(num_qo_heads, num_kv_heads, head_dim, page_size, ragged)
    if reason:
        raise ValueError(f"definition {name!r} is not supported by this kernel: {reason}")
    return PrefillShape(name, num_qo_heads, num_kv_heads, head_dim, 1 if ragged else page_size, ragged)


def _check_tensors(shape: PrefillShape, tensors: dict[str, torch.Tensor]) -> torch.device:
    """Types, dtypes, shapes and devices of the tensor arguments; returns their device."""
    heads, kv_heads, dim = shape.num_qo_heads, shape.num_kv_heads, shape.head_dim
    keys, values = ("k", "v") if shape.ragged else ("k_cache", "v_cache")
    for name in ("q", keys, values):
        _require_tensor(name, tensors[name], (torch.bfloat16,))
    for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"):
        if name in tensors:
            _require_tensor(name, tensors[name], _INDEX_DTYPES)
    _require_shape("q", tensors["q"], (None, heads, dim))
    _require_shape("qo_indptr", tensors["qo_indptr"], (None,))
    if not tensors["qo_indptr"].shape[0]:
        raise ValueError("qo_indptr must have shape [B + 1] (at least one entry), got [0]")
    batch = tensors["qo_indptr"].shape[0] - 1
    rows = (None, kv_heads, dim) if shape.ragged else (None, shape.page_size, kv_heads, dim)
    _require_shape(keys, tensors[keys], rows)
    _require_shape(values, tensors[values], (tensors[keys].shape[0], *rows[1:]))
    _require_shape("kv_indptr", tensors["kv_indptr"], (batch + 1,))
    if "kv_indices" in tensors:
        _require_shape("kv_indices", tensors["kv_indices"], (None,))
    if "kv_last_page_len" in tensors:
        _require_shape("kv_last_page_len", tensors["kv_last_page_len"], (batch,))
    return _check_devices(tensors)


def _check_indices(shape: PrefillShape, tensors: dict[str, torch.Tensor]) -> int:
    """Index invariants of qo_indptr, kv_indptr and the pages, read back with one device sync; returns the longest
    sequence's query count."""
    qo_indptr, kv_indptr = tensors["qo_indptr"], tensors["kv_indptr"]
    zero = torch.zeros((), dtype=torch.int64, device=qo_indptr.device)
    facts = [*_indptr_facts(qo_indptr, zero), _reduced(qo_indptr[1:] - qo_indptr[:-1], torch.max, zero)]
    if shape.ragged:
        facts += _indptr_facts(kv_indptr, zero)
    else:
        facts += _page_facts(kv_indptr, tensors["kv_indices"], tensors.get("kv_last_page_len"))
    facts = torch.stack(facts).tolist()
    _check_indptr("qo_indptr", facts[:3], tensors["q"].shape[0], "the length of q")
    if shape.ragged:
        _check_indptr("kv_indptr", facts[4:7], tensors["k"].shape[0], "the length of k")
    else:
        _check_page_facts(facts[4:], tensors["kv_indices"], tensors["k_cache"].shape[0],
                          tensors.get("kv_last_page_len"), shape.page_size)
    return facts[3]


def _launch(shape: PrefillShape, tensors: dict[str, torch.Tensor], sm_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate one call of ``shape``'s contract (``tensors`` by argument name), then launch."""
    device = _check_tensors(shape, tensors)
    scale = _check_scale(sm_scale, default_sm_scale(shape.head_dim))
    tensors = {name: t.contiguous() if name in _INDEX_ARGUMENTS else t for name, t in tensors.items()}
    longest = _check_indices(shape, tensors)
    q = tensors["q"]
    k, v = (tensors["k"], tensors["v"]) if shape.ragged else (tensors["k_cache"], tensors["v_cache"])
    tiles = -(-longest * shape.group // BLOCK_M)
    if tiles > MAX_GRID_TILES:
        most = MAX_GRID_TILES * BLOCK_M // shape.group
        raise ValueError(f"qo_indptr gives a sequence of {longest} queries: one launch covers at most {most} "
                         f"with {shape.num_qo_heads} query heads over {shape.num_kv_heads}")
    output = torch.empty((q.shape[0], shape.num_qo_heads, shape.head_dim), dtype=torch.bfloat16, device=device)
    lse = torch.empty((q.shape[0], shape.num_qo_heads), dtype=torch.float32, device=device)
    batch = tensors["qo_indptr"].shape[0] - 1
    if not tiles or not batch:
        return output, lse
    # Ragged K and V are pages of one token: the page stride is the token stride, the slot stride unused.
    k_strides = (k.stride(0), 0, k.stride(1), k.stride(2)) if shape.ragged else k.stride()
    v_strides = (v.stride(0), 0, v.stride(1), v.stride(2)) if shape.ragged else v.stride()
    kv_indices = tensors.get("kv_indices", tensors["kv_indptr"])  # never read when ragged
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        gqa_causal_prefill_kernel[(batch, tiles, shape.num_kv_heads)](
            q, k, v, tensors["qo_indptr"], tensors["kv_indptr"], kv_indices, tensors.get("kv_last_page_len"),
            scale, output, lse,
            *q.stride(), *k_strides, *v_strides, *output.stride(), *lse.stride(),
            GROUP=shape.group, HEAD_DIM=shape.head_dim, PAGE_SIZE=shape.page_size, RAGGED=shape.ragged,
            BLOCK_M=BLOCK_M, BLOCK_N=shape.block_n,
            num_warps=8 if shape.head_dim > 128 else 4, num_stages=2,
        )
    return output, lse


_DOC = """Causal GQA prefill for {name}: {heads} query heads over {kv_heads} KV heads, head dim {dim}, {layout};
query head h reads KV head h // {group}.

Args: {args}. q [total_q, {heads}, {dim}] bfloat16, any strides; qo_indptr [B + 1] int32 (int64
accepted), sequence b's queries are q[qo_indptr[b]:qo_indptr[b + 1]]; {kv}; sm_scale a real number
applied in float32, default 1/sqrt({dim}).

Bottom-right aligned: query i of a sequence of q_len queries over kv_len keys sees keys
j <= i + kv_len - q_len. Returns ``(output, lse)``: output [total_q, {heads}, {dim}] bfloat16 and
lse [total_q, {heads}] float32, the base-2 log-sum-exp of the scaled logits a row sees; a row
that sees no key gives output 0 and lse -inf.

Raises TypeError (wrong type or dtype) or ValueError (shape, device, inconsistent indices),
naming the argument.
"""
_RAGGED_KV = ("k and v [total_kv, {kv_heads}, {dim}] bfloat16, any strides; kv_indptr [B + 1], sequence b's "
              "keys are k[kv_indptr[b]:kv_indptr[b + 1]]")
_PAGED_KV = ("k_cache and v_cache [P, {page}, {kv_heads}, {dim}] bfloat16, any strides; kv_indptr [B + 1] counts "
             "pages and kv_indices [kv_indptr[-1]] holds page ids in token order{last}")
_LAST = ("; kv_last_page_len [B] the tokens in each sequence's last page, 1..{page} for a sequence with pages: "
         "sequence b has (pages - 1) * {page} + kv_last_page_len[b] keys")


def _described(function: Callable, shape: PrefillShape, arguments: str) -> Callable:
    constants = dict(heads=shape.num_qo_heads, kv_heads=shape.num_kv_heads, dim=shape.head_dim,
                     page=shape.page_size)
    if shape.ragged:
        layout, kv = "ragged K and V", _RAGGED_KV.format(**constants)
    else:
        layout = f"page size {shape.page_size}"
        kv = _PAGED_KV.format(**constants, last=_LAST.format(**constants) if shape.paged else "")
    function.__doc__ = _DOC.format(name=shape.name, layout=layout, group=shape.group, args=arguments, kv=kv,
                                   **constants)
    function.__qualname__ = f"run[{shape.name}]"
    function.shape = shape
    return function


def _ragged_run(shape: PrefillShape) -> Callable:
    def run(q, k, v, qo_indptr, kv_indptr, sm_scale=None):
        return _launch(shape, {"q": q, "k": k, "v": v, "qo_indptr": qo_indptr, "kv_indptr": kv_indptr}, sm_scale)

    return _described(run, shape, "q, k, v, qo_indptr, kv_indptr, sm_scale=None")


def _one_token_pages_run(shape: PrefillShape) -> Callable:
    def run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale=None):
        tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "qo_indptr": qo_indptr, "kv_indptr": kv_indptr,
                   "kv_indices": kv_indices}
        return _launch(shape, tensors, sm_scale)

    return _described(run, shape, "q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale=None")


def _paged_run(shape: PrefillShape) -> Callable:
    def run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None):
        tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "qo_indptr": qo_indptr, "kv_indptr": kv_indptr,
                   "kv_indices": kv_indices, "kv_last_page_len": kv_last_page_len}
        return _launch(shape, tensors, sm_scale)

    return _described(run, shape,
                      "q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None")


_served: dict[tuple, Callable] = {}


def _served_for(shape: PrefillShape) -> Callable:
    key = (shape.num_qo_heads, shape.num_kv_heads, shape.head_dim, shape.page_size, shape.ragged)
    if key not in _served:
        build = _ragged_run if shape.ragged else _paged_run if shape.paged else _one_token_pages_run
        _served[key] = build(shape)
    return _served[key]


def for_prefill(num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int | None,
                ragged: bool) -> Callable:
    """The validated causal prefill kernel of these constants, one function per set, cached.

    Ragged (``page_size`` None or 1): ``run(q, k, v, qo_indptr, kv_indptr, sm_scale=None)``; paged with
    one-token pages: ``run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale=None)``; larger pages
    take ``kv_last_page_len`` before ``sm_scale``. ValueError when the kernel cannot compile the shape.
    """
    layout = "ragged" if ragged else f"ps{page_size}"
    name = f"gqa_{'ragged' if ragged else 'paged'}_prefill_causal_h{num_qo_heads}_kv{num_kv_heads}_d{head_dim}"
    name += "" if ragged else f"_{layout}"
    return _served_for(prefill_shape(name, num_qo_heads, num_kv_heads, head_dim, page_size, ragged))


def for_prefill_definition(definition) -> Callable:
    """``for_prefill`` of a prefill definition (``prefill_kind`` not None), read for ``num_qo_heads``,
    ``num_kv_heads``, ``head_dim`` and, paged, ``page_size``; errors name the definition."""
    name = getattr(definition, "name", repr(definition))
    ragged = prefill_kind(definition) == "ragged"
    wanted = ("num_qo_heads", "num_kv_heads", "head_dim") + (() if ragged else ("page_size",))
    missing = [a for a in wanted if not hasattr(definition, a)]
    if missing:
        raise TypeError(f"definition {name!r} has no {', '.join(missing)}: not a GQA causal prefill definition")
    page_size = None if ragged else definition.page_size
    shape = prefill_shape(name, definition.num_qo_heads, definition.num_kv_heads, definition.head_dim, page_size,
                          ragged)
    return _served_for(shape)
