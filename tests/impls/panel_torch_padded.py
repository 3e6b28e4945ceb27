"""Panel implementation: plain torch, float32 throughout, the whole batch at once.

Traits, each deliberately unlike the project's kernel:
- no Triton: runs on CPU tensors (with or without the interpreter) as well as CUDA;
- the batch is gathered into one padded [B, Lmax] token matrix and reduced with torch's own
  (order-unspecified) einsum / amax / sum; no online softmax, no blocks;
- natural-log LSE converted to base 2 at the end; P stays float32 (never rounded to bf16);
- its own validation: one exception type, ``CallRefused``, with messages in its own words.

It serves every definition of the family (``run.for_definition``): head counts, head dim and
page size come from the definition; with pages of several tokens the call takes
``kv_last_page_len`` and token t of a sequence is slot t % page_size of its page t // page_size.

Independent of kernel/, reference/ and properties/: only torch.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

LN2 = math.log(2.0)
DEVICE_KINDS = ("cpu", "cuda")
INDEX_DTYPES = (torch.int32, torch.int64)


class CallRefused(Exception):
    """Raised for any call this implementation will not compute."""


class Layout(NamedTuple):
    """The constants one definition fixes."""

    qo_heads: int
    kv_heads: int
    dim: int
    page_size: int

    @property
    def group(self) -> int:
        return self.qo_heads // self.kv_heads


def _insist(condition: bool, complaint: str) -> None:
    if not condition:
        raise CallRefused(complaint)


def _check_scale(sm_scale, dim: int) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(dim)
    if isinstance(sm_scale, torch.Tensor) and sm_scale.numel() == 1:
        sm_scale = sm_scale.item()
    _insist(isinstance(sm_scale, numbers.Real) and not isinstance(sm_scale, bool), "scale is not a number")
    scale = float(sm_scale)
    _insist(math.isfinite(scale) and abs(scale) <= torch.finfo(torch.float32).max, "scale is not usable")
    return scale


def _check(shape: Layout, q, k_cache, v_cache, kv_indptr, kv_indices, last, sm_scale) -> tuple[float, list[int]]:
    """The scale to use and the tokens of each sequence; ``CallRefused`` for anything else."""
    tensors = (q, k_cache, v_cache, kv_indptr, kv_indices) + ((last,) if shape.page_size > 1 else ())
    _insist(all(isinstance(t, torch.Tensor) for t in tensors), "every array argument has to be a torch tensor")
    _insist(all(t.dtype == torch.bfloat16 for t in tensors[:3]), "queries, keys and values have to be bf16")
    _insist(all(t.dtype in INDEX_DTYPES for t in tensors[3:5]), "page tables have to be int32/int64")
    want_q = (shape.qo_heads, shape.dim)
    _insist(q.dim() == 3 and tuple(q.shape[1:]) == want_q,
            f"queries: want [*, {want_q[0]}, {want_q[1]}], have {q.shape}")
    pool = k_cache.shape[0] if k_cache.dim() == 4 else -1
    want_cache = (pool, shape.page_size, shape.kv_heads, shape.dim)
    for t in (k_cache, v_cache):
        _insist(tuple(t.shape) == want_cache, f"cache: want {list(want_cache)}, have {t.shape}")
    batch = q.shape[0]
    _insist(kv_indptr.dim() == 1 and kv_indptr.shape[0] == batch + 1, "row pointer length is not batch + 1")
    _insist(kv_indices.dim() == 1, "page list has to be one-dimensional")
    if shape.page_size > 1:
        _insist(last.dtype in INDEX_DTYPES, "last-page fill (kv_last_page_len) has to be int32/int64")
        _insist(tuple(last.shape) == (batch,), f"last-page fill (kv_last_page_len): want [{batch}], have {last.shape}")
    place = q.device
    _insist(all(t.device == place for t in tensors), "arguments live on different devices")
    _insist(place.type in DEVICE_KINDS, f"cannot compute on {place.type}")
    scale = _check_scale(sm_scale, shape.dim)

    ptr = kv_indptr.to("cpu", torch.int64)
    _insist(int(ptr[0]) == 0, "row pointer does not begin at zero")
    _insist(bool((ptr[1:] >= ptr[:-1]).all()), "row pointer goes backwards")
    _insist(int(ptr[-1]) == kv_indices.shape[0], "row pointer end disagrees with the page list")
    if kv_indices.numel():
        lo, hi = int(kv_indices.min()), int(kv_indices.max())
        _insist(0 <= lo and hi < pool, f"page list leaves the pool of {pool} pages ({lo}..{hi})")
    pages = (ptr[1:] - ptr[:-1]).tolist()
    if shape.page_size == 1:
        return scale, pages
    fills = last.to("cpu", torch.int64).tolist()
    for count, fill in zip(pages, fills):
        low = 1 if count else 0  # a page holds at least one token; an empty sequence's entry is not read
        _insist(low <= fill <= shape.page_size,
                f"last-page fill (kv_last_page_len) {fill} outside {low}..{shape.page_size} for {count} pages")
    return scale, [(count - 1) * shape.page_size + fill if count else 0 for count, fill in zip(pages, fills)]


def _decode(shape: Layout, q, k_cache, v_cache, kv_indptr, kv_indices, last, sm_scale):
    scale, lengths = _check(shape, q, k_cache, v_cache, kv_indptr, kv_indices, last, sm_scale)
    place = q.device
    batch = q.shape[0]
    output = torch.zeros(batch, shape.qo_heads, shape.dim, dtype=torch.bfloat16, device=place)
    lse = torch.full((batch, shape.qo_heads), -math.inf, dtype=torch.float32, device=place)
    longest = max(lengths, default=0)
    if longest == 0:
        return output, lse

    starts = kv_indptr[:-1].to(place, torch.int64)
    counts = torch.tensor(lengths, dtype=torch.int64, device=place)
    token = torch.arange(longest, device=place)
    live = token[None, :] < counts[:, None]  # [B, Lmax]
    where = torch.where(live, starts[:, None] + token[None, :] // shape.page_size, 0)
    pages = torch.where(live, kv_indices.to(torch.int64)[where], 0)  # masked slots read page 0, then discarded
    slots = torch.where(live, token[None, :] % shape.page_size, 0)

    keys = k_cache[pages, slots].float()  # [B, Lmax, KV heads, dim]
    vals = v_cache[pages, slots].float()
    vals = torch.where(live[:, :, None, None], vals, 0.0)  # a masked slot's page may hold NaN
    queries = q.float().reshape(batch, shape.kv_heads, shape.group, shape.dim)

    logits = torch.einsum("bgjd,blgd->bgjl", queries, keys) * torch.tensor(scale, dtype=torch.float32, device=place)
    logits = torch.where(live[:, None, None, :], logits, -math.inf)
    peak = logits.amax(dim=-1, keepdim=True)
    nonempty = (counts > 0)[:, None, None, None]
    peak = torch.where(nonempty, peak, 0.0)
    weights = torch.exp(logits - peak)  # exactly 0 on masked slots
    total = weights.sum(dim=-1, keepdim=True)
    mixed = torch.einsum("bgjl,blgd->bgjd", weights, vals) / torch.where(nonempty, total, 1.0)
    mixed = torch.where(nonempty, mixed, 0.0)
    natural = torch.where(nonempty, peak + torch.log(total), -math.inf)

    output = mixed.reshape(batch, shape.qo_heads, shape.dim).to(torch.bfloat16)
    lse = (natural / LN2).reshape(batch, shape.qo_heads).to(torch.float32)
    return output, lse


def serving(shape: Layout):
    """The entry point for one definition's constants, taking its arguments in its order."""
    _insist(min(shape) >= 1 and shape.qo_heads % shape.kv_heads == 0, f"cannot serve {shape}")
    if shape.page_size == 1:
        def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
            return _decode(shape, q, k_cache, v_cache, kv_indptr, kv_indices, None, sm_scale)
        return run

    def run_paged(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None):
        return _decode(shape, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale)
    return run_paged


def for_definition(definition):
    """The entry point for ``definition`` (anything with num_qo_heads, num_kv_heads, head_dim, page_size)."""
    try:
        return serving(Layout(definition.num_qo_heads, definition.num_kv_heads, definition.head_dim,
                              definition.page_size))
    except CallRefused as refusal:
        raise ValueError(str(refusal)) from None


run = serving(Layout(qo_heads=32, kv_heads=4, dim=128, page_size=1))  # the seed's definition
run.for_definition = for_definition
