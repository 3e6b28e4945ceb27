"""``run()``: validates the call, then launches the kernel on CUDA or in the interpreter."""

from __future__ import annotations

import contextlib
import math
import numbers

import torch

from ._interpreter_compat import interpreter_enabled
from ._kernel import gqa_paged_decode_kernel

NUM_QO_HEADS = 32
NUM_KV_HEADS = 4
HEAD_DIM = 128
PAGE_SIZE = 1
BLOCK_N = 128
DEFAULT_SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)

_INDEX_DTYPES = (torch.int32, torch.int64)


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


def _check_indices(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, num_pages: int) -> None:
    """Index invariants, read back with one device sync."""
    zero = torch.zeros((), dtype=torch.int64, device=kv_indptr.device)

    def extreme(values: torch.Tensor, reduce) -> torch.Tensor:
        return reduce(values).to(torch.int64) if values.numel() else zero

    steps = kv_indptr[1:] - kv_indptr[:-1]
    facts = torch.stack([
        kv_indptr[0].to(torch.int64),
        kv_indptr[-1].to(torch.int64),
        extreme(steps, torch.min),
        extreme(kv_indices, torch.min),
        extreme(kv_indices, torch.max),
    ]).tolist()
    first, last, min_step, min_page, max_page = facts
    if first != 0:
        raise ValueError(f"kv_indptr must start at 0, got kv_indptr[0]={first}")
    if min_step < 0:
        raise ValueError("kv_indptr must be non-decreasing")
    if last != kv_indices.shape[0]:
        raise ValueError(f"kv_indptr[-1]={last} must equal the length of kv_indices ({kv_indices.shape[0]})")
    if kv_indices.numel() and (min_page < 0 or max_page >= num_pages):
        raise ValueError(
            f"kv_indices must lie in [0, {num_pages}) (the page pool), got values in [{min_page}, {max_page}]"
        )


def _check_scale(sm_scale) -> float:
    if sm_scale is None:
        return DEFAULT_SM_SCALE
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


def run(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched GQA decode over a paged KV cache (32 query heads, 4 KV heads, dim 128, page size 1).

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
    for name, value in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _require_tensor(name, value, (torch.bfloat16,))
    for name, value in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        _require_tensor(name, value, _INDEX_DTYPES)
    _require_shape("q", q, (None, NUM_QO_HEADS, HEAD_DIM))
    batch = q.shape[0]
    _require_shape("k_cache", k_cache, (None, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM))
    _require_shape("v_cache", v_cache, (k_cache.shape[0], PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM))
    _require_shape("kv_indptr", kv_indptr, (batch + 1,))
    _require_shape("kv_indices", kv_indices, (None,))
    device = _check_devices(
        {"q": q, "k_cache": k_cache, "v_cache": v_cache, "kv_indptr": kv_indptr, "kv_indices": kv_indices}
    )
    scale = _check_scale(sm_scale)
    kv_indptr, kv_indices = kv_indptr.contiguous(), kv_indices.contiguous()
    _check_indices(kv_indptr, kv_indices, k_cache.shape[0])

    output = torch.empty((batch, NUM_QO_HEADS, HEAD_DIM), dtype=torch.bfloat16, device=device)
    lse = torch.empty((batch, NUM_QO_HEADS), dtype=torch.float32, device=device)
    if batch == 0:
        return output, lse
    on_gpu = device.type == "cuda"
    with torch.cuda.device(device) if on_gpu else contextlib.nullcontext():
        gqa_paged_decode_kernel[(batch,)](
            q, k_cache, v_cache, kv_indptr, kv_indices, scale, output, lse,
            q.stride(0), q.stride(1), q.stride(2),
            k_cache.stride(0), k_cache.stride(2), k_cache.stride(3),
            v_cache.stride(0), v_cache.stride(2), v_cache.stride(3),
            output.stride(0), output.stride(1), output.stride(2),
            lse.stride(0), lse.stride(1),
            NUM_QO_HEADS=NUM_QO_HEADS, NUM_KV_HEADS=NUM_KV_HEADS, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
            num_warps=4, num_stages=2,
        )
    return output, lse
