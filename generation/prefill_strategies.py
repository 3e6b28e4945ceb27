"""Hypothesis strategies for causal prefill cases.

Each sequence's query and key counts are drawn together, as one of the shapes prefill kernels meet (and break
on): one query, a fresh prefill (as many queries as keys), a short chunk after a long cached prefix, more queries
than keys (the first rows see no key), no queries, no keys, and lengths at the block edges of both axes. The key
layout, junk, value regime and scale come from decode's strategies (``strategies``). The ordinary branch comes
first, so failures shrink toward short sequences of ordinary values.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from .cases import DEFAULT_PAGE_LAYOUTS, DEFAULT_REGIMES, PAGE_LAYOUTS, POOL_FILLS, VALUE_REGIMES, active_definition
from .prefill_cases import PrefillCase
from .sizes import SizeLimits
from .strategies import SharedFields, _check_choices, draw_shared, sequence_lengths

__all__ = ["LENGTH_SHAPES", "prefill_cases", "query_and_key_lengths", "query_block_edges"]

_DEFAULT_LIMITS = SizeLimits()
# Query rows per tile of a Triton prefill kernel ((token, head) pairs of one KV head's group): 16 .. 128.
_ROW_BLOCKS = (16, 32, 64, 128)
# The shapes of one sequence's (q_len, kv_len), in the order the strategy offers them (the first: where it shrinks).
LENGTH_SHAPES = ("any", "one_query", "fresh", "chunk", "overhang", "no_queries", "no_keys")


def query_block_edges(*, max_q_len: int, group: int = 1) -> list[int]:
    """Query counts at a tile edge, and one either side: tiles of ``_ROW_BLOCKS`` rows hold ``rows / group``
    query tokens of one KV head's group (and plain token blocks of those sizes too)."""
    blocks = {b for b in _ROW_BLOCKS} | {max(1, b // group) for b in _ROW_BLOCKS}
    edges = {m + d for b in blocks for m in range(b, max_q_len + 2, b) for d in (-1, 0, 1)}
    return sorted(n for n in edges if 1 <= n <= max_q_len)


def query_and_key_lengths(*, max_q_len: int, max_kv_len: int, page_size: int = 1, group: int = 1
                          ) -> st.SearchStrategy[tuple[int, int]]:
    """One sequence's (q_len, kv_len), weighted to the edges of ``LENGTH_SHAPES``: key counts as decode draws a
    sequence's (0, 1, block and page edges, a long tail; ``strategies.sequence_lengths``), query counts at tile
    edges (``query_block_edges``)."""
    if max_q_len < 1 or max_kv_len < 1:
        raise InvalidArgument(f"max_q_len={max_q_len} and max_kv_len={max_kv_len} must be at least 1")
    keys = sequence_lengths(max_len=max_kv_len, page_size=max(page_size, 1))
    edges = query_block_edges(max_q_len=max_q_len, group=group)
    queries = st.one_of(st.integers(0, min(16, max_q_len)), st.sampled_from([0, 1, *edges]),
                        st.integers(0, max_q_len))
    some_queries = queries.map(lambda n: max(n, 1))
    short = st.integers(1, min(8, max_q_len))
    both = min(max_q_len, max_kv_len)
    return st.one_of(
        st.tuples(queries, keys),  # any
        st.tuples(st.just(1), keys),  # one query: a decode
        st.sampled_from([0, 1, *edges]).map(lambda n: min(n, both)).map(lambda n: (n, n)),  # fresh prefill
        st.builds(lambda q, prefix: (min(q, prefix + q, max_kv_len), min(prefix + q, max_kv_len)),
                  short, keys),  # a short chunk after a cached prefix
        st.builds(lambda kv, extra: (min(kv + extra, max_q_len), kv),
                  st.integers(0, min(8, max_kv_len, max_q_len - 1)), st.integers(1, max_q_len)),  # q_len > kv_len
        st.tuples(st.just(0), keys),  # no queries
        st.tuples(some_queries, st.just(0)),  # no keys: every row masked
    )


def length_shape(q_len: int, kv_len: int) -> str:
    """The most specific of ``LENGTH_SHAPES`` a sequence's lengths show (for labels and coverage)."""
    if not q_len:
        return "no_queries"
    if not kv_len:
        return "no_keys"
    if q_len > kv_len:
        return "overhang"
    if q_len == 1:
        return "one_query"
    if q_len == kv_len:
        return "fresh"
    return "chunk"


def prefill_cases(
    *,
    limits: SizeLimits = _DEFAULT_LIMITS,
    min_batch: int = 1,
    page_layouts: tuple[str, ...] = DEFAULT_PAGE_LAYOUTS,
    values: tuple[str, ...] = DEFAULT_REGIMES,
    pool_fills: tuple[str, ...] = POOL_FILLS,
    lengths: st.SearchStrategy[tuple[int, int]] | None = None,
    sm_scales: st.SearchStrategy[float | None] | None = None,
) -> st.SearchStrategy[PrefillCase]:
    """A ``PrefillCase`` within ``limits`` (``max_prefill_batch`` sequences of at most ``max_q_len`` queries and
    ``max_kv_len`` keys, ``max_spare_pages``) for the prefill definition active when it is drawn.

    The tuples name the choices drawn for each descriptor field (the first is where failures shrink to);
    ``lengths`` replaces the strategy for one sequence's (q_len, kv_len) (``query_and_key_lengths``) and
    ``sm_scales`` decode's strategy for sm_scale.
    """
    if not 1 <= min_batch <= limits.max_prefill_batch:
        raise InvalidArgument(f"min_batch={min_batch} must lie in [1, {limits.max_prefill_batch}]")
    for name, chosen, allowed in (("page_layouts", page_layouts, PAGE_LAYOUTS),
                                  ("values", values, tuple(VALUE_REGIMES)), ("pool_fills", pool_fills, POOL_FILLS)):
        _check_choices(name, chosen, allowed)

    @cache
    def pairs_for(page_size: int, group: int) -> st.SearchStrategy[list[tuple[int, int]]]:
        if lengths is not None:
            return st.lists(lengths, min_size=min_batch, max_size=limits.max_prefill_batch)
        one = query_and_key_lengths(max_q_len=limits.max_q_len, max_kv_len=limits.max_kv_len, page_size=page_size,
                                    group=group)
        return st.lists(one, min_size=min_batch, max_size=limits.max_prefill_batch)

    shared = SharedFields.of(page_layouts, pool_fills, values, sm_scales, 0, limits.max_spare_pages)
    return _draw_case(_PrefillFields(pairs=pairs_for, shared=shared))


@dataclass(frozen=True)
class _PrefillFields:
    """One strategy per descriptor field, built once (``pairs`` by page size and group)."""

    pairs: object  # (page_size, group) -> strategy of [(q_len, kv_len)]
    shared: SharedFields


@st.composite
def _draw_case(draw, fields: _PrefillFields) -> PrefillCase:
    definition = active_definition()
    if not definition.prefill:
        raise InvalidArgument(f"prefill_cases() drawn under {definition.name}, a {definition.op_type} definition")
    pairs = draw(fields.pairs(max(definition.page_size, 1), definition.group))
    return PrefillCase(
        q_lens=tuple(q for q, _ in pairs),
        kv_lens=tuple(kv for _, kv in pairs),
        **draw_shared(draw, fields.shared),
        definition=definition.name,
    )
