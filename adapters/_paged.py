"""What several adapters share: reading the contract's arguments for any definition of the family, and gathering
each sequence's tokens out of the paged pool for libraries that take dense or ragged K/V.

Argument order (reference/definitions.py, ``Definition.arguments``): page size 1 is
``(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)``; larger pages put ``kv_last_page_len``
before ``sm_scale``. An adapter's entry takes both, told apart by arity and by what the sixth
argument is (a 1-D tensor is ``kv_last_page_len``; ``sm_scale`` is a number, a 0-d tensor or None).

The gather is this adapter layer's, not the library's: ``index_select`` on the pool (64-bit
offsets) and a mask for the unused slots of each last page. It checks nothing the contract
asks a kernel to refuse (a page id outside the pool reads out of bounds on a GPU): adapters
that use it waive ``input_validation``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import NamedTuple

import torch

__all__ = ["Call", "PrefillCall", "Tokens", "empty_result", "example_call", "example_prefill_call", "gather_tokens",
           "last_page_lengths", "read_call", "read_prefill_call", "reference_of", "unit_last_stride"]


class Call(NamedTuple):
    """The contract's arguments with ``kv_last_page_len`` (None for page size 1) and the scale resolved."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor | None
    sm_scale: float

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]


def _is_page_lengths(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 1


def read_call(q, k_cache, v_cache, kv_indptr, kv_indices, *rest) -> Call:
    """The contract's call for either argument order; ``rest`` is ``(sm_scale?)`` or ``(kv_last_page_len, sm_scale?)``.

    A pool of pages larger than one token without ``kv_last_page_len`` is refused (ValueError naming it):
    without it the last page's length is unknown.
    """
    if len(rest) > 2:
        raise TypeError(f"expected at most 7 arguments (q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, "
                        f"sm_scale), got {5 + len(rest)}")
    last, scale = (rest if len(rest) == 2 else
                   (rest[0], None) if rest and _is_page_lengths(rest[0]) else (None, rest[0] if rest else None))
    if last is None and k_cache.dim() >= 2 and k_cache.shape[1] != 1:
        raise ValueError(f"k_cache has pages of {k_cache.shape[1]} tokens but no kv_last_page_len was given "
                         "(page size 1 takes none; larger pages need it before sm_scale)")
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return Call(q, k_cache, v_cache, kv_indptr, kv_indices, last, sm_scale)


def unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dimension is contiguous (what kernels index with unit stride), else a copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


class Tokens(NamedTuple):
    """Every sequence's keys and values, sequence after sequence in token order, and where each starts."""

    keys: torch.Tensor  # [total tokens, num_kv_heads, head_dim]
    values: torch.Tensor
    lengths: list[int]  # tokens per sequence
    cu_seqlens: torch.Tensor  # [B + 1] int32 on the pool's device: sequence b is tokens cu[b]:cu[b+1]


def _token_counts(call: Call, bounds: list[int]) -> list[int]:
    pages = [bounds[b + 1] - bounds[b] for b in range(len(bounds) - 1)]
    if call.kv_last_page_len is None:
        return pages
    last = call.kv_last_page_len.tolist()
    return [(n - 1) * call.page_size + last[b] if n > 0 else 0 for b, n in enumerate(pages)]


def _page_keep_mask(call: Call, bounds: list[int], referenced: int) -> torch.Tensor:
    """[referenced pages * page_size] bool: slot j of a page holds a token (j < tokens in that page)."""
    device = call.k_cache.device
    per_page = torch.full((referenced,), call.page_size, dtype=torch.int64, device=device)
    with_pages = [b for b in range(len(bounds) - 1) if bounds[b + 1] > bounds[b]]
    if with_pages:
        last_pages = torch.tensor([bounds[b + 1] - 1 - bounds[0] for b in with_pages], device=device)
        per_page[last_pages] = call.kv_last_page_len.to(device=device, dtype=torch.int64)[with_pages]
    slots = torch.arange(call.page_size, device=device)
    return (slots[None, :] < per_page[:, None]).reshape(-1)


def gather_tokens(call: Call) -> Tokens:
    """Each sequence's K/V tokens copied out of the pool (only the pages the batch references)."""
    bounds = call.kv_indptr.tolist()
    lengths = _token_counts(call, bounds)
    pages = call.kv_indices[bounds[0]:bounds[-1]].to(torch.int64) if bounds else call.kv_indices[:0].long()
    heads, dim = call.k_cache.shape[-2:]
    keys = call.k_cache.index_select(0, pages).reshape(-1, heads, dim)
    values = call.v_cache.index_select(0, pages).reshape(-1, heads, dim)
    if call.kv_last_page_len is not None and call.page_size > 1:
        keep = _page_keep_mask(call, bounds, pages.numel())
        keys, values = keys[keep], values[keep]
    cu = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)
    return Tokens(keys, values, lengths, cu.to(call.k_cache.device))


def last_page_lengths(call: Call) -> torch.Tensor:
    """[B] int32: tokens in each sequence's last page. Page size 1 has no ``kv_last_page_len`` in the contract: 1 for a
    sequence with pages, 0 for an empty one, as an engine fills it for libraries that take it."""
    if call.kv_last_page_len is not None:
        return call.kv_last_page_len.to(torch.int32).contiguous()
    pages = call.kv_indptr[1:] - call.kv_indptr[:-1]
    return (pages > 0).to(torch.int32)


# ---- causal prefill ------------------------------------------------------------------------


class PrefillCall(NamedTuple):
    """A causal prefill call: the queries (sequence b's are ``q[qo_indptr[b]:qo_indptr[b + 1]]``) and the keys,
    either a paged pool (``pages``, the decode call of the same cache) or ragged K/V (``ragged``, already in
    sequence order)."""

    q: torch.Tensor  # [total_q, H, D]
    qo_indptr: torch.Tensor
    sm_scale: float
    pages: Call | None
    ragged: Tokens | None

    @property
    def query_bounds(self) -> list[int]:
        return self.qo_indptr.tolist()

    def tokens(self) -> Tokens:
        """Each sequence's keys and values in token order (gathered out of the pool where paged)."""
        return self.ragged if self.pages is None else gather_tokens(self.pages)


def read_prefill_call(q, k, v, qo_indptr, kv_indptr, *rest) -> PrefillCall:
    """A causal prefill call in its definition's order: ragged ``(q, k, v, qo_indptr, kv_indptr, sm_scale?)`` where
    K is 3-D ``[total_kv, H_kv, D]``; paged ``(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale?)``,
    with ``kv_last_page_len`` before ``sm_scale`` for pages of several tokens (``read_call`` reads the rest)."""
    if not isinstance(k, torch.Tensor) or k.dim() not in (3, 4):
        raise ValueError(f"k must be ragged keys [total_kv, H_kv, D] or a page pool [P, page size, H_kv, D], got "
                         f"{getattr(k, 'shape', type(k).__name__)}")
    if k.dim() == 4:
        if not rest:
            raise TypeError("a paged prefill call needs kv_indices after kv_indptr")
        pages = read_call(q, k, v, kv_indptr, *rest)
        return PrefillCall(q, qo_indptr, pages.sm_scale, pages, None)
    if len(rest) > 1:
        raise TypeError(f"a ragged prefill call takes (q, k, v, qo_indptr, kv_indptr, sm_scale), got {5 + len(rest)} "
                        "arguments")
    scale = rest[0] if rest else None
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    bounds = kv_indptr.tolist()
    lengths = [end - start for start, end in zip(bounds, bounds[1:])]
    return PrefillCall(q, qo_indptr, sm_scale, None, Tokens(k, v, lengths, kv_indptr.to(torch.int32)))


# ---- small calls for smoke tests -----------------------------------------------------------

_JUNK = float("nan")  # where no token is: must never reach a result


def example_call(definition, lengths: list[int], seed: int, sm_scale: float = 0.07) -> tuple:
    """A valid call for ``definition`` (a reference.definitions.Definition), in its argument order: one sequence per
    entry of ``lengths``, shuffled page ids in a pool with spare pages, NaN in every slot no token uses."""
    gen = torch.Generator().manual_seed(seed)
    size = definition.page_size
    pages = [-(-n // size) for n in lengths]
    pool = sum(pages) + 3
    ids = torch.randperm(pool, generator=gen)[:sum(pages)].to(torch.int32)
    shape = (pool, size, definition.num_kv_heads, definition.head_dim)
    k_cache, v_cache = (torch.full(shape, _JUNK, dtype=torch.bfloat16) for _ in range(2))
    offset = 0
    for n, count in zip(lengths, pages):
        for i in range(n):  # token i of this sequence: page ids[offset + i // size], slot i % size
            page, slot = int(ids[offset + i // size]), i % size
            k_cache[page, slot] = torch.randn(shape[2:], generator=gen).to(torch.bfloat16)
            v_cache[page, slot] = torch.randn(shape[2:], generator=gen).to(torch.bfloat16)
        offset += count
    q = torch.randn((len(lengths), definition.num_qo_heads, definition.head_dim), generator=gen).to(torch.bfloat16)
    indptr = torch.tensor([0, *torch.tensor(pages, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    last = [n - (count - 1) * size if count else 0 for n, count in zip(lengths, pages)]
    paged = (torch.tensor(last, dtype=torch.int32),) if definition.paged else ()
    return (q, k_cache, v_cache, indptr, ids, *paged, sm_scale)


def example_prefill_call(definition, q_lens: list[int], kv_lens: list[int], seed: int,
                         sm_scale: float = 0.07) -> tuple:
    """A valid causal prefill call for ``definition`` in its argument order: the keys laid out as ``example_call``
    lays out sequences of ``kv_lens`` (ragged: gathered in sequence order), ``q_lens[b]`` query rows for sequence b."""
    size = max(definition.page_size, 1)
    keys = SimpleNamespace(page_size=size, num_kv_heads=definition.num_kv_heads, head_dim=definition.head_dim,
                           num_qo_heads=definition.num_qo_heads, paged=size > 1)
    _, k_cache, v_cache, kv_indptr, kv_indices, *last, _ = example_call(keys, kv_lens, seed, sm_scale)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn((sum(q_lens), definition.num_qo_heads, definition.head_dim), generator=gen).to(torch.bfloat16)
    qo_indptr = torch.tensor(list(itertools.accumulate(q_lens, initial=0)), dtype=torch.int32)
    if definition.page_size:
        return (q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, *last, sm_scale)
    tokens = gather_tokens(read_call(q, k_cache, v_cache, kv_indptr, kv_indices, *last))
    return (q, tokens.keys, tokens.values, qo_indptr, tokens.cu_seqlens, sm_scale)


def reference_of(definition) -> Callable:
    """The definition file's own float32 ``run`` (its ``reference`` source, from this repository's built-in files)."""
    namespace: dict = {}
    exec(compile(definition.reference, f"<{definition.name} reference>", "exec"), namespace)  # noqa: S102
    return namespace["run"]


def empty_result(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, lse) of a batch of no sequences: no engine launches attention for it, so no library is asked."""
    q = call.q
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(q.shape[:2], device=q.device)
