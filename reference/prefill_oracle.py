"""The float64 oracle for causal GQA prefill, over a paged KV cache or ragged K/V, with its error bound.

The mask is bottom-right aligned: in a sequence of q_len queries and kv_len keys the queries are the last q_len
positions, so query i (from 0) sees keys j <= i + kv_len - q_len, that is the first
n_i = max(0, i + kv_len - q_len + 1) keys (never more than kv_len). Each query row is therefore one decode over
its sequence's first n_i keys, and the oracle is the decode oracle over one row per query
(``oracle.attend_rows``): the same float64 computation and the same error bound (``bound.error_bounds``,
docs/tolerance.md), per row over the keys that row sees. A row that sees no key (q_len > kv_len, or no keys at
all) is an empty decode: output 0, LSE -inf (base 2), bound 0.

One oracle for both layouts. Ragged K/V [total_kv, H_kv, D] is read as a pool of one-token pages in order (a view,
no copy) whose page ids are the token positions, kv_indptr counting tokens; a paged cache is read where it lies,
each row gathering the first n_i tokens of its sequence's pages (``kv_last_page_len`` where pages hold several).
Vectorised as the decode oracle is: rows are padded to the longest in a chunk, chunks cut to a memory budget.
Work and memory per case grow as (query rows) x (keys seen) x H x D, as a decode batch's do with sequences.
"""

from __future__ import annotations

import torch

from .oracle import Reference, attend_rows, float32_scale, token_lengths

__all__ = ["attend_paged_prefill", "attend_ragged_prefill", "visible_keys"]


def visible_keys(q_lens: torch.Tensor, kv_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For every query row, all sequences' rows in order (int64, host): its sequence, and how many of that
    sequence's keys it sees under the bottom-right causal mask (0 for a row that sees none)."""
    sequence = torch.repeat_interleave(torch.arange(q_lens.numel()), q_lens)
    first_row = torch.cumsum(q_lens, 0) - q_lens
    within = torch.arange(sequence.numel()) - first_row[sequence]  # i, the row's place in its sequence
    return sequence, (within + (kv_lens - q_lens)[sequence] + 1).clamp_(min=0)


def _causal(q, pool_k, pool_v, kv_indices, q_bounds: list[int], kv_starts: list[int], kv_lens: list[int],
            sm_scale: float | None) -> Reference:
    """Rows of every sequence: row r of sequence s is a decode over the first n_r tokens of the pages
    ``kv_indices[kv_starts[s]:]``."""
    q_lens = torch.tensor(q_bounds, dtype=torch.int64).diff()
    sequence, seen = visible_keys(q_lens, torch.tensor(kv_lens, dtype=torch.int64))
    starts = torch.tensor(kv_starts, dtype=torch.int64)[sequence]
    scale = float32_scale(sm_scale, q.shape[2])
    return attend_rows(q[q_bounds[0]:q_bounds[-1]], pool_k, pool_v, kv_indices, starts.tolist(), seen.tolist(),
                       scale)


@torch.no_grad()
def attend_paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float | None = None,
    kv_last_page_len: torch.Tensor | None = None,
    *,
    qo_indptr_on_host: list[int] | None = None,
    kv_indptr_on_host: list[int] | None = None,
    last_page_len_on_host: list[int] | None = None,
) -> Reference:
    """The float64 result of causal prefill over a paged KV cache, with the error bound it allows.

    q [total_q, H, D]; k_cache, v_cache [P, page size, H_kv, D]; qo_indptr [B + 1] (queries); kv_indptr [B + 1]
    (pages); kv_indices; with pages of several tokens kv_last_page_len [B] (last: None where pages hold one token).
    Assumes a valid call. The ``*_on_host`` lists, the values the caller put in those tensors, are used instead of
    them (no read-back from the device), as ``oracle.attend`` does.
    """
    q_bounds = qo_indptr.tolist() if qo_indptr_on_host is None else list(qo_indptr_on_host)
    kv_bounds = kv_indptr.tolist() if kv_indptr_on_host is None else list(kv_indptr_on_host)
    lasts = last_page_len_on_host
    if lasts is None and kv_last_page_len is not None:
        lasts = kv_last_page_len.tolist()
    kv_lens = token_lengths(kv_bounds, lasts, k_cache.shape[1])
    return _causal(q, k_cache, v_cache, kv_indices, q_bounds, kv_bounds[:-1], kv_lens, sm_scale)


@torch.no_grad()
def attend_ragged_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    sm_scale: float | None = None,
    *,
    qo_indptr_on_host: list[int] | None = None,
    kv_indptr_on_host: list[int] | None = None,
) -> Reference:
    """The float64 result of causal prefill over ragged K/V, with the error bound it allows.

    q [total_q, H, D]; k, v [total_kv, H_kv, D]; qo_indptr and kv_indptr [B + 1] (queries, tokens). Assumes a
    valid call; the ``*_on_host`` lists are used instead of the tensors, as in ``attend_paged_prefill``.
    """
    q_bounds = qo_indptr.tolist() if qo_indptr_on_host is None else list(qo_indptr_on_host)
    kv_bounds = kv_indptr.tolist() if kv_indptr_on_host is None else list(kv_indptr_on_host)
    tokens = torch.arange(k.shape[0], device=k.device)  # one-token pages, in order: page id = token position
    kv_lens = [end - start for start, end in zip(kv_bounds, kv_bounds[1:])]
    return _causal(q, k.unsqueeze(1), v.unsqueeze(1), tokens, q_bounds, kv_bounds[:-1], kv_lens, sm_scale)
