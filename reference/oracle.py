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

from .bound import SoftmaxTerms, error_bounds

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


def _gather(cache: torch.Tensor, pages: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Rows of ``cache`` at ``pages`` as float64, zero where not ``valid`` (junk pages never leak)."""
    if cache.shape[0] == 0:  # an empty pool: nothing is valid
        return torch.zeros((*pages.shape, NUM_KV_HEADS, HEAD_DIM), dtype=torch.float64, device=cache.device)
    return torch.where(valid[:, :, None, None], cache[pages, 0].double(), 0.0)


def _attend_chunk(q, k_cache, v_cache, starts, lengths, kv_indices, scale, longest) -> Reference:
    """Oracle for one run of sequences; ``starts``/``lengths`` are int64 on q's device, ``longest`` their maximum."""
    count = lengths.shape[0]
    longest = max(longest, 1)  # one masked column keeps reductions non-empty (known on the host: no sync)
    token = torch.arange(longest, device=q.device)
    valid = token[None, :] < lengths[:, None]  # [b, L]
    position = torch.where(valid, starts[:, None] + token[None, :], 0)
    pages = kv_indices[position.clamp(max=max(kv_indices.shape[0] - 1, 0))] if kv_indices.numel() else position
    pages = pages.long()
    keys = _gather(k_cache, pages, valid)  # [b, L, 4, 128]
    values = _gather(v_cache, pages, valid)
    queries = q.double().view(count, NUM_KV_HEADS, GROUP, HEAD_DIM)

    mask = valid[:, None, None, :]  # [b, 1, 1, L]
    keys_by_group = keys.permute(0, 2, 3, 1)  # [b, g, d, L]: one batched matmul per product below
    logits = torch.where(mask, scale * torch.matmul(queries, keys_by_group), -math.inf)
    lse_natural = torch.logsumexp(logits, dim=-1)  # -inf for empty sequences
    empty = (lengths == 0)[:, None, None]
    weights = torch.where(mask & ~empty[..., None], torch.exp(logits - lse_natural[..., None]), 0.0)
    output = torch.matmul(weights, values.permute(0, 2, 1, 3))  # [b, g, j, L] @ [b, g, L, d]

    logit_magnitude = torch.where(mask, abs(scale) * torch.matmul(queries.abs(), keys_by_group.abs()), 0.0)
    terms = SoftmaxTerms(
        logits=logits, weights=weights, values=values, output=output,
        logit_magnitude=logit_magnitude, lse_natural=lse_natural, lengths=lengths,
    )
    output_bound, lse_bound = error_bounds(terms)
    return Reference(
        output=output.reshape(count, NUM_QO_HEADS, HEAD_DIM),
        lse=(lse_natural / math.log(2.0)).reshape(count, NUM_QO_HEADS),
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
) -> Reference:
    """The float64 result of the kernel's contract, with the error bound it allows.

    Takes the same arguments as ``kernel.run`` and assumes they are valid (the
    property suite only feeds it valid cases). Runs on the inputs' device.
    """
    scale = float32_scale(sm_scale)
    indptr = kv_indptr.long()
    lengths_all = indptr[1:] - indptr[:-1]
    parts = [  # the one host sync: the lengths, for chunking and padding
        _attend_chunk(q[a:b], k_cache, v_cache, indptr[a:b], lengths_all[a:b], kv_indices, scale, longest)
        for a, b, longest in _chunks(lengths_all.tolist())
    ]
    if len(parts) == 1:
        return parts[0]
    return Reference(*(torch.cat(field) for field in zip(*parts)))
