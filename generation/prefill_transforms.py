"""Transformations of built causal prefill calls, for the prefill properties: calls over parts of a call's
sequences (chunked prefill), keys changed where some rows cannot see them, the same cache as a decode call.

Each returns new arguments and leaves the ones it was given untouched; index values are read from the case
(``PrefillCase``) and the call's own index tensors, on the host.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from .cases import DecodeInputs, page_counts, remember_on_host
from .prefill_cases import PrefillCase, PrefillInputs

__all__ = ["Piece", "as_decode", "perturb_keys", "sub_call", "token_slots", "unaffected_rows"]


class Piece(NamedTuple):
    """Queries ``[q_start, q_end)`` of sequence ``seq`` over its first ``kv_count`` keys."""

    seq: int
    q_start: int
    q_end: int
    kv_count: int


def _index(values: list[int], like: torch.Tensor) -> torch.Tensor:
    tensor = torch.tensor(values, dtype=torch.int32, device=like.device)
    remember_on_host(tensor, values)
    return tensor


def _sequence_pages(inputs: PrefillInputs) -> list[list[int]]:
    bounds, pages = inputs.kv_indptr.tolist(), inputs.kv_indices.tolist()
    return [pages[a:b] for a, b in zip(bounds, bounds[1:])]


def sub_call(inputs: PrefillInputs, case: PrefillCase, pieces: list[Piece]) -> tuple[PrefillInputs, torch.Tensor]:
    """One call of ``pieces``, each a sequence of its own over the same cache (ragged: K and V gathered), and the
    rows of the original call its query rows are (int64, host)."""
    q_bounds = [0, *itertools.accumulate(case.q_lens)]
    rows = torch.cat([torch.arange(q_bounds[p.seq] + p.q_start, q_bounds[p.seq] + p.q_end) for p in pieces]
                     or [torch.zeros(0, dtype=torch.int64)])
    qo_indptr = _index([0, *itertools.accumulate(p.q_end - p.q_start for p in pieces)], inputs.qo_indptr)
    q = inputs.q[rows.to(inputs.q.device)]
    if inputs.ragged:
        starts = inputs.kv_indptr.tolist()
        keep = torch.cat([torch.arange(starts[p.seq], starts[p.seq] + p.kv_count) for p in pieces]
                         or [torch.zeros(0, dtype=torch.int64)]).to(inputs.k_cache.device)
        kv_indptr = _index([0, *itertools.accumulate(p.kv_count for p in pieces)], inputs.kv_indptr)
        return inputs._replace(q=q, k_cache=inputs.k_cache[keep], v_cache=inputs.v_cache[keep],
                               qo_indptr=qo_indptr, kv_indptr=kv_indptr), rows
    page_size = inputs.k_cache.shape[1]
    pages = _sequence_pages(inputs)
    counts = page_counts(tuple(p.kv_count for p in pieces), page_size)
    kv_indices = _index([i for p, n in zip(pieces, counts) for i in pages[p.seq][:n]], inputs.kv_indices)
    kv_indptr = _index([0, *itertools.accumulate(counts)], inputs.kv_indptr)
    last = None
    if inputs.kv_last_page_len is not None:
        last = _index([p.kv_count - (n - 1) * page_size if n else 0 for p, n in zip(pieces, counts)],
                      inputs.kv_last_page_len)
    return inputs._replace(q=q, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                           kv_last_page_len=last), rows


def token_slots(inputs: PrefillInputs, case: PrefillCase) -> list[list[int]]:
    """Per sequence, each key's slot in token order: ``page * page_size + slot`` (ragged: its row of K)."""
    if inputs.ragged:
        starts = inputs.kv_indptr.tolist()
        return [list(range(s, s + n)) for s, n in zip(starts, case.kv_lens)]
    page_size = inputs.k_cache.shape[1]
    return [[pages[j // page_size] * page_size + j % page_size for j in range(n)]
            for pages, n in zip(_sequence_pages(inputs), case.kv_lens)]


def perturb_keys(inputs: PrefillInputs, slots: list[int]) -> PrefillInputs:
    """The call with the keys and values at ``slots`` (``token_slots``' numbering) replaced by other finite values
    of a much larger magnitude: K negated and scaled by 64, V scaled by 64 and shifted by 1000."""
    k, v = inputs.k_cache.clone(), inputs.v_cache.clone()
    flat_k, flat_v = (t.view(-1, *t.shape[-2:]) for t in (k, v))  # one row per slot
    where = torch.tensor(slots, dtype=torch.int64, device=k.device)
    flat_k[where] = (flat_k[where].float() * -64.0).to(k.dtype)
    flat_v[where] = (flat_v[where].float() * 64.0 + 1000.0).to(v.dtype)
    return inputs._replace(k_cache=k, v_cache=v)


def unaffected_rows(case: PrefillCase, slots: list[list[int]], changed: set[int]) -> list[int]:
    """The rows of the call (in order) whose visible keys hold none of the ``changed`` slots."""
    rows, row = [], 0
    for seen, seq_slots in zip(case.visible(), slots):
        first_changed = next((j for j, slot in enumerate(seq_slots) if slot in changed), len(seq_slots))
        rows += [row + i for i, n in enumerate(seen) if n <= first_changed]
        row += len(seen)
    return rows


def as_decode(inputs: PrefillInputs) -> DecodeInputs:
    """A call of one query per sequence as the decode call over the same cache (ragged K and V as a pool of
    one-token pages, page id = row)."""
    if inputs.ragged:
        tokens = torch.arange(inputs.k_cache.shape[0], dtype=torch.int32, device=inputs.k_cache.device)
        return DecodeInputs(q=inputs.q, k_cache=inputs.k_cache.unsqueeze(1), v_cache=inputs.v_cache.unsqueeze(1),
                            kv_indptr=inputs.kv_indptr, kv_indices=tokens, sm_scale=inputs.sm_scale)
    return DecodeInputs(q=inputs.q, k_cache=inputs.k_cache, v_cache=inputs.v_cache, kv_indptr=inputs.kv_indptr,
                        kv_indices=inputs.kv_indices, sm_scale=inputs.sm_scale,
                        kv_last_page_len=inputs.kv_last_page_len)
