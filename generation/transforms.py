"""Transformations of built kernel arguments, for the metamorphic and hostile-value properties.

Each returns new arguments and leaves the ones it was given untouched.
"""

from __future__ import annotations

import math

import torch

from gqa_decode_fuzz.reference import Reference

from .cases import DecodeInputs


def sequence_bounds(inputs: DecodeInputs) -> list[tuple[int, int]]:
    """[start, end) of each sequence's pages in kv_indices."""
    indptr = inputs.kv_indptr.tolist()
    return list(zip(indptr[:-1], indptr[1:]))


def single_sequence(inputs: DecodeInputs, seq: int) -> DecodeInputs:
    """The call for sequence ``seq`` alone: batch 1, same pool, same page ids (and last-page length)."""
    start, end = sequence_bounds(inputs)[seq]
    indptr, last = inputs.kv_indptr, inputs.kv_last_page_len
    return inputs._replace(
        q=inputs.q[seq:seq + 1],
        kv_indptr=torch.tensor([0, end - start], dtype=indptr.dtype, device=indptr.device),
        kv_indices=inputs.kv_indices[start:end],
        kv_last_page_len=None if last is None else last[seq:seq + 1],
    )


def result_rows(output: torch.Tensor, lse: torch.Tensor | None, rows: slice) -> tuple:
    """The result for a run of sequences (lse stays None for an implementation that returns none)."""
    return output[rows], None if lse is None else lse[rows]


def reference_rows(reference: Reference, rows: slice) -> Reference:
    """The oracle's answer for a run of sequences (the oracle treats each sequence on its own)."""
    return Reference(*(field[rows] for field in reference))


def relabel_pages(inputs: DecodeInputs, extra_pages: int, gen: torch.Generator) -> DecodeInputs:
    """Move every pool page to a random slot of a pool ``extra_pages`` larger, and rewrite kv_indices to match.

    The new pool is contiguous and its new slots hold NaN, so any read of a page no
    sequence references shows up.
    """
    pages = inputs.k_cache.shape[0]
    device = inputs.k_cache.device
    new_slot = torch.randperm(pages + extra_pages, generator=gen)[:pages].to(device)

    def moved(cache: torch.Tensor) -> torch.Tensor:
        pool = torch.full((pages + extra_pages, *cache.shape[1:]), math.nan, dtype=cache.dtype, device=device)
        pool[new_slot] = cache
        return pool

    indices = new_slot[inputs.kv_indices.long()].to(inputs.kv_indices.dtype) if pages else inputs.kv_indices
    return inputs._replace(k_cache=moved(inputs.k_cache), v_cache=moved(inputs.v_cache), kv_indices=indices)


def copy_queries_within_groups(q: torch.Tensor, kv_heads: int,
                               gen: torch.Generator) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """q with some heads' rows copied from another head reading the same of ``kv_heads`` KV heads.

    Returns the new q and the (copy, source) head pairs, at least one per KV head (none where a KV head serves
    one query head).
    """
    q = q.clone()
    pairs = []
    group = q.shape[1] // kv_heads
    if group < 2:
        return q, pairs
    for kv_head in range(kv_heads):
        heads = (kv_head * group + torch.randperm(group, generator=gen)).tolist()
        copies = int(torch.randint(1, group, (1,), generator=gen))
        source = heads[0]
        for head in heads[1:1 + copies]:
            q[:, head] = q[:, source]
            pairs.append((head, source))
    return q, pairs


def poison_page(inputs: DecodeInputs, page: int, tensor: str, value: float) -> DecodeInputs:
    """A copy of the call whose ``tensor`` ('k_cache' or 'v_cache') holds ``value`` throughout pool page ``page``."""
    cache = getattr(inputs, tensor).clone()
    cache[page] = value
    return inputs._replace(**{tensor: cache})


def sequences_reading(inputs: DecodeInputs, page: int) -> set[int]:
    """The sequences whose kv_indices contain ``page``."""
    indices = inputs.kv_indices.tolist()
    return {seq for seq, (start, end) in enumerate(sequence_bounds(inputs)) if page in indices[start:end]}
