"""The float64 oracle for GQA decode over a paged KV cache.

Conventions (the contract of ``kernel.run``): q [B, 32, 128], k_cache and v_cache
[P, 1, 4, 128], kv_indptr [B + 1], kv_indices [kv_indptr[-1]]; query head h reads
KV head h // 8; the scale is rounded to float32 first, as the contract passes it;
LSE is base 2; an empty sequence gives output 0 and LSE -inf exactly.

Computed on the inputs' device, vectorized over sequences and heads: sequences are
padded to the longest one in a chunk, and chunks are cut so that the padded key
block stays under a memory budget. Only the referenced pages are gathered, so a
pool of millions of pages costs nothing extra.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import torch

from .bound import SoftmaxTerms, error_bounds, sequence_factors
from .transfer import to_device

NUM_QO_HEADS = 32
NUM_KV_HEADS = 4
GROUP = NUM_QO_HEADS // NUM_KV_HEADS
HEAD_DIM = 128
DEFAULT_SM_SCALE = 1.0 / math.sqrt(HEAD_DIM)

# Padded float64 K (or V) elements per chunk: 2**25 * 8 bytes = 256 MiB.
_CHUNK_ELEMENTS = 1 << 25

__all__ = ["Reference", "attend", "float32_scale"]


class Reference(NamedTuple):
    """The exact result and the error an implementation may make, all float64."""

    output: torch.Tensor  # [B, 32, 128]
    lse: torch.Tensor  # [B, 32], base 2
    output_bound: torch.Tensor  # [B, 32, 128], allowed |output - reference|
    lse_bound: torch.Tensor  # [B, 32], allowed |lse - reference|


def float32_scale(sm_scale: float | None) -> float:
    """The softmax scale as the contract passes it: float32, default 1/sqrt(128)."""
    scale = DEFAULT_SM_SCALE if sm_scale is None else float(sm_scale)
    try:
        return struct.unpack("f", struct.pack("f", scale))[0]  # nearest even, on the host: no tensor, no sync
    except OverflowError:  # beyond float32's range: infinite, as a float32 tensor rounds it
        return math.copysign(math.inf, scale)


def _chunks(lengths: list[int]) -> list[tuple[int, int, int]]:
    """Split sequences into [start, end) runs whose padded K block fits the budget, with each run's longest length."""
    per_token = NUM_KV_HEADS * HEAD_DIM
    runs, start, longest = [], 0, 0
    for end, length in enumerate(lengths):
        longest_with = max(longest, length)
        if end > start and (end + 1 - start) * longest_with * per_token > _CHUNK_ELEMENTS:
            runs.append((start, end, longest))
            start, longest_with = end, length
        longest = longest_with
    runs.append((start, len(lengths), longest))
    return runs


def _pages(
    kv_indices: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, longest: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Page id of every token slot ([b, L], kv_indices' dtype), and [b, 1, 1, L]: True past a sequence's end.

    Slots past the end read some referenced page (page 0 without any): their rows are masked by the caller.
    """
    token = torch.arange(longest, device=starts.device)
    padding = token >= lengths.view(-1, 1, 1, 1)
    position = starts[:, None] + token
    if not kv_indices.numel():  # no pages at all: every slot is padding, at position 0
        return position, padding
    return kv_indices[position.clamp_(max=kv_indices.shape[0] - 1)], padding


def _rows(cache: torch.Tensor, pages: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """``cache[pages]`` ([b, L, 1, 4, 128]) as float64, axes permuted by ``order``, laid out contiguously.

    One copy converts and transposes into the layout the batched matmuls take.
    """
    if cache.shape[0] == 0:  # an empty pool: every slot is padding
        shape = (*pages.shape, 1, NUM_KV_HEADS, HEAD_DIM)
        return torch.zeros([shape[axis] for axis in order], dtype=torch.float64, device=cache.device)
    return cache[pages].permute(order).to(torch.float64, memory_format=torch.contiguous_format)


def _attend_chunk(q, k_cache, v_cache, starts, lengths, kv_indices, scale, longest, factors) -> Reference:
    """Oracle for one run of sequences; ``starts``/``lengths`` are int64 on q's device, ``longest`` their maximum,
    ``factors`` their ``sequence_factors``."""
    count = lengths.shape[0]
    longest = max(longest, 1)  # one masked column keeps reductions non-empty (known on the host: no sync)
    heads = count * NUM_KV_HEADS  # the batch of every matmul: one (sequence, KV head) pair each
    pages, padding = _pages(kv_indices, starts, lengths, longest)
    # K as [b * g, d, L] and V as [b, g, L, d]: the operands torch.matmul would hand bmm. K keeps the rows
    # slots past the end read (junk, even NaN, without referenced pages): they only reach masked columns.
    keys = _rows(k_cache, pages, (0, 2, 3, 4, 1)).reshape(heads, HEAD_DIM, longest)
    values = _rows(v_cache, pages, (0, 2, 3, 1, 4)).reshape(count, NUM_KV_HEADS, longest, HEAD_DIM)
    values.masked_fill_(padding.transpose(2, 3), 0.0)
    queries = q.double().reshape(heads, GROUP, HEAD_DIM)

    shape = (count, NUM_KV_HEADS, GROUP, longest)  # [b, g, j, L]
    logits = torch.bmm(queries, keys).view(shape).mul_(scale).masked_fill_(padding, -math.inf)
    lse_natural = torch.logsumexp(logits, dim=-1)  # -inf for empty sequences
    # exp(-inf - lse) is 0 past the end of a non-empty sequence; an empty one's NaN (-inf - -inf) is masked.
    weights = (logits - lse_natural[..., None]).exp_().masked_fill_(padding, 0.0)
    output = torch.bmm(weights.view(heads, GROUP, longest), values.view(heads, longest, HEAD_DIM))
    magnitude = torch.bmm(queries.abs(), keys.abs_()).view(shape).mul_(abs(scale)).masked_fill_(padding, 0.0)

    terms = SoftmaxTerms(
        logits=logits, weights=weights, values=values.permute(0, 2, 1, 3),
        output=output.view(count, NUM_KV_HEADS, GROUP, HEAD_DIM),
        logit_magnitude=magnitude, lse_natural=lse_natural, padding=padding, factors=factors,
    )
    output_bound, lse_bound = error_bounds(terms)
    return Reference(
        output=output.view(count, NUM_QO_HEADS, HEAD_DIM),
        lse=(lse_natural / math.log(2.0)).view(count, NUM_QO_HEADS),
        output_bound=output_bound.reshape(count, NUM_QO_HEADS, HEAD_DIM),
        lse_bound=lse_bound.reshape(count, NUM_QO_HEADS),
    )


@torch.no_grad()
def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float | None = None,
    *,
    indptr_on_host: list[int] | None = None,
) -> Reference:
    """The float64 result of the kernel's contract, with the error bound it allows.

    Takes the same arguments as ``kernel.run`` and assumes they are valid (the
    property suite only feeds it valid cases). Runs on the inputs' device.
    ``indptr_on_host``, the values the caller put in ``kv_indptr`` (a list), is used
    instead of that tensor: no read-back from the device, and a kernel that wrote into
    its kv_indptr is still held to the call it was given.
    """
    scale = float32_scale(sm_scale)
    if indptr_on_host is None:
        indptr = kv_indptr.long()
        bounds = indptr.tolist()  # the one host sync: the lengths, for chunking, padding and the bound's factors
    else:
        bounds = list(indptr_on_host)
        indptr = to_device(torch.tensor(bounds, dtype=torch.int64), q.device)
    starts = indptr[:-1]
    lengths = indptr[1:] - starts
    on_host = [end - start for start, end in zip(bounds, bounds[1:])]
    runs = _chunks(on_host)
    factors = sequence_factors(on_host, q.device)
    if len(runs) == 1:  # the whole batch at once: no slices
        return _attend_chunk(q, k_cache, v_cache, starts, lengths, kv_indices, scale, runs[0][2], factors)
    parts = [
        _attend_chunk(q[a:b], k_cache, v_cache, starts[a:b], lengths[a:b], kv_indices, scale, longest, factors[:, a:b])
        for a, b, longest in runs
    ]
    return Reference(*(torch.cat(field) for field in zip(*parts)))
