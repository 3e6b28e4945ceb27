"""Panel implementation: plain torch, float32 throughout, the whole batch at once.

Traits, each deliberately unlike the project's kernel:
- no Triton: runs on CPU tensors (with or without the interpreter) as well as CUDA;
- the batch is gathered into one padded [B, Lmax] token matrix and reduced with torch's own
  (order-unspecified) einsum / amax / sum; no online softmax, no blocks;
- natural-log LSE converted to base 2 at the end; P stays float32 (never rounded to bf16);
- its own validation: one exception type, ``CallRefused``, with messages in its own words.

Independent of kernel/, reference/ and properties/: only torch.
"""

from __future__ import annotations

import math
import numbers

import torch

QO_HEADS = 32
KV_HEADS = 4
DIM = 128
GROUP = QO_HEADS // KV_HEADS
LN2 = math.log(2.0)
FALLBACK_SCALE = 1.0 / math.sqrt(DIM)
DEVICE_KINDS = ("cpu", "cuda")


class CallRefused(Exception):
    """Raised for any call this implementation will not compute."""


def _insist(condition: bool, complaint: str) -> None:
    if not condition:
        raise CallRefused(complaint)


def _check(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale) -> float:
    tensors = (q, k_cache, v_cache, kv_indptr, kv_indices)
    _insist(all(isinstance(t, torch.Tensor) for t in tensors), "every array argument has to be a torch tensor")
    _insist(all(t.dtype == torch.bfloat16 for t in tensors[:3]), "queries, keys and values have to be bf16")
    _insist(all(t.dtype in (torch.int32, torch.int64) for t in tensors[3:]), "page tables have to be int32/int64")
    _insist(q.dim() == 3 and tuple(q.shape[1:]) == (QO_HEADS, DIM), f"queries: want [*, 32, 128], have {q.shape}")
    pool = k_cache.shape[0] if k_cache.dim() == 4 else -1
    for t in (k_cache, v_cache):
        _insist(tuple(t.shape) == (pool, 1, KV_HEADS, DIM), f"cache: want [{pool}, 1, 4, 128], have {t.shape}")
    _insist(kv_indptr.dim() == 1 and kv_indptr.shape[0] == q.shape[0] + 1, "row pointer length is not batch + 1")
    _insist(kv_indices.dim() == 1, "page list has to be one-dimensional")
    place = q.device
    _insist(all(t.device == place for t in tensors), "arguments live on different devices")
    _insist(place.type in DEVICE_KINDS, f"cannot compute on {place.type}")

    if sm_scale is None:
        scale = FALLBACK_SCALE
    else:
        if isinstance(sm_scale, torch.Tensor) and sm_scale.numel() == 1:
            sm_scale = sm_scale.item()
        _insist(isinstance(sm_scale, numbers.Real) and not isinstance(sm_scale, bool), "scale is not a number")
        scale = float(sm_scale)
        _insist(math.isfinite(scale) and abs(scale) <= torch.finfo(torch.float32).max, "scale is not usable")

    ptr = kv_indptr.to("cpu", torch.int64)
    _insist(int(ptr[0]) == 0, "row pointer does not begin at zero")
    _insist(bool((ptr[1:] >= ptr[:-1]).all()), "row pointer goes backwards")
    _insist(int(ptr[-1]) == kv_indices.shape[0], "row pointer end disagrees with the page list")
    if kv_indices.numel():
        lo, hi = int(kv_indices.min()), int(kv_indices.max())
        _insist(0 <= lo and hi < pool, f"page list leaves the pool of {pool} pages ({lo}..{hi})")
    return scale


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    scale = torch.tensor(_check(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale), dtype=torch.float32)
    place = q.device
    batch = q.shape[0]
    starts = kv_indptr[:-1].to(place, torch.int64)
    counts = kv_indptr[1:].to(place, torch.int64) - starts
    longest = int(counts.max()) if batch else 0
    output = torch.zeros(batch, QO_HEADS, DIM, dtype=torch.bfloat16, device=place)
    lse = torch.full((batch, QO_HEADS), -math.inf, dtype=torch.float32, device=place)
    if longest == 0:
        return output, lse

    slot = torch.arange(longest, device=place)
    live = slot[None, :] < counts[:, None]  # [B, Lmax]
    where = torch.where(live, starts[:, None] + slot[None, :], 0)
    pages = torch.where(live, kv_indices.to(torch.int64)[where], 0)  # masked slots read page 0, then discarded

    keys = k_cache[pages, 0].float()  # [B, Lmax, 4, 128]
    vals = v_cache[pages, 0].float()
    vals = torch.where(live[:, :, None, None], vals, 0.0)  # a masked slot's page may hold NaN
    queries = q.float().reshape(batch, KV_HEADS, GROUP, DIM)

    logits = torch.einsum("bgjd,blgd->bgjl", queries, keys) * scale.to(place)
    logits = torch.where(live[:, None, None, :], logits, -math.inf)
    peak = logits.amax(dim=-1, keepdim=True)
    nonempty = (counts > 0)[:, None, None, None]
    peak = torch.where(nonempty, peak, 0.0)
    weights = torch.exp(logits - peak)  # exactly 0 on masked slots
    total = weights.sum(dim=-1, keepdim=True)
    mixed = torch.einsum("bgjl,blgd->bgjd", weights, vals) / torch.where(nonempty, total, 1.0)
    mixed = torch.where(nonempty, mixed, 0.0)
    natural = torch.where(nonempty, peak + torch.log(total), -math.inf)

    output = mixed.reshape(batch, QO_HEADS, DIM).to(torch.bfloat16)
    lse = (natural / LN2).reshape(batch, QO_HEADS).to(torch.float32)
    return output, lse
