"""Hypothesis strategies for decode cases.

Nasty regimes are reached through drawn branches (``one_of``, ``sampled_from``
with the ordinary choice first), so failures shrink toward a short batch of
ordinary values, not away from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from .cases import (
    DEFAULT_PAGE_LAYOUTS,
    DEFAULT_REGIMES,
    INDEX_LAYOUTS,
    KV_LAYOUTS,
    PAGE_LAYOUTS,
    POOL_FILLS,
    Q_LAYOUTS,
    VALUE_REGIMES,
    DecodeCase,
    active_definition,
)
from .sizes import SizeLimits, active_limits

_DEFAULT_LIMITS = SizeLimits()
T = TypeVar("T")

# Block sizes that Triton decode kernels use; each length at a boundary and one either side.
_BLOCK_EDGES = sorted({n + d for n in (16, 32, 64, 128, 256) for d in (-1, 0, 1)})


def sequence_lengths(*, max_len: int, page_size: int = 1) -> st.SearchStrategy[int]:
    """Tokens in one sequence: weighted to 0, 1, block edges, short runs, and a long tail.

    With pages of several tokens, also drawn as (pages, last-page length) with the edges weighted: one token
    in the last page, a full last page, one short of full, one page.
    """
    if max_len < 1:
        raise InvalidArgument(f"max_len={max_len} must be at least 1")
    edges = [n for n in _BLOCK_EDGES if n <= max_len]
    if page_size == 1:
        return st.one_of(
            st.integers(0, min(40, max_len)),
            st.sampled_from([0, 1, *edges]),
            st.integers(0, max_len),
        )
    most_pages = max(1, -(-max_len // page_size))
    last = st.one_of(st.sampled_from([1, page_size, page_size - 1, 2]), st.integers(1, page_size))
    in_pages = st.builds(lambda pages, tokens: min((pages - 1) * page_size + tokens, max_len),
                         st.integers(1, most_pages), last)
    page_edges = sorted({n for m in range(page_size, max_len + 2, page_size) for n in (m - 1, m, m + 1)
                         if 0 < n <= max_len})
    return st.one_of(
        st.integers(0, min(40, max_len)),
        st.sampled_from([0, 1, *page_edges, *edges]),
        in_pages,
        st.integers(0, max_len),
    )


def scales() -> st.SearchStrategy[float | None]:
    """sm_scale: the default (None), ordinary, 0, tiny, large, negative."""
    return st.one_of(
        st.none(),
        st.floats(0.01, 1.0),
        st.sampled_from([0.0, 1e-6, 8.0, -0.0883883476]),
        st.floats(1.0, 64.0),
    )


def hostile_scales() -> st.SearchStrategy[float]:
    """sm_scale far from 1/sqrt(128): tiny (down to float32's smallest normals), huge (to 1e4), either sign."""
    magnitude = st.one_of(st.floats(1e-38, 1e-6), st.floats(64.0, 1e4), st.sampled_from([1e-38, 1e-30, 1e4]))
    return st.builds(lambda m, negative: -m if negative else m, magnitude, st.booleans())


def block_edge_lengths(*, max_len: int, blocks: tuple[int, ...] = (16, 32, 64, 128, 256)) -> st.SearchStrategy[int]:
    """Lengths at every multiple of each block size up to ``max_len``, and one either side (0 and 1 too)."""
    if max_len < 1:
        raise InvalidArgument(f"max_len={max_len} must be at least 1")
    edges = {0, 1} | {m + d for b in blocks for m in range(b, max_len + 2, b) for d in (-1, 0, 1)}
    return st.sampled_from(sorted(n for n in edges if 0 <= n <= max_len))


def run_sized(build: Callable[[SizeLimits], st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """``build(limits)`` for the run's case-size limits (``sizes.active_limits``), built when it first draws: a
    property file reads no run state when it is imported. Drawing through it draws exactly what ``build``'s
    strategy draws (Hypothesis draws a deferred strategy as the one it wraps); the limits are the run's, fixed
    for its whole length, so the strategy is built once.

    Example: ``run_sized(lambda limits: decode_cases(limits=shorter(limits), min_batch=2))``.
    """
    return st.deferred(lambda: build(active_limits()))


def _check_choices(name: str, chosen: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    if not chosen or any(c not in allowed for c in chosen):
        raise InvalidArgument(f"{name}={chosen!r} must be a non-empty tuple drawn from {allowed}")


def decode_cases(
    *,
    limits: SizeLimits = _DEFAULT_LIMITS,
    min_batch: int = 1,
    min_empty: int = 0,
    page_layouts: tuple[str, ...] = DEFAULT_PAGE_LAYOUTS,
    values: tuple[str, ...] = DEFAULT_REGIMES,
    q_layouts: tuple[str, ...] = Q_LAYOUTS[:1],
    kv_layouts: tuple[str, ...] = KV_LAYOUTS[:1],
    index_layouts: tuple[str, ...] = INDEX_LAYOUTS[:1],
    pool_fills: tuple[str, ...] = POOL_FILLS,
    lengths: st.SearchStrategy[int] | None = None,
    sm_scales: st.SearchStrategy[float | None] | None = None,
    min_spare_pages: int = 0,
) -> st.SearchStrategy[DecodeCase]:
    """A ``DecodeCase`` within ``limits``, with at least ``min_empty`` empty sequences, for the definition active
    when it is drawn (``cases.active_definition``: the plugin sets it per test item).

    The tuples name the choices drawn for each descriptor field (the first is where
    failures shrink to); ``lengths`` and ``sm_scales`` replace the default strategies
    for one sequence's length and for sm_scale; ``min_spare_pages`` forces a large
    pool (the maximum is ``limits.max_spare_pages``).
    """
    if not 0 <= min_batch <= limits.max_batch or not 0 <= min_empty <= limits.max_batch:
        raise InvalidArgument(f"min_batch={min_batch} and min_empty={min_empty} must lie in [0, {limits.max_batch}]")
    if not 0 <= min_spare_pages <= limits.max_spare_pages:
        raise InvalidArgument(f"min_spare_pages={min_spare_pages} must lie in [0, {limits.max_spare_pages}]")
    for name, chosen, allowed in (
        ("page_layouts", page_layouts, PAGE_LAYOUTS), ("values", values, tuple(VALUE_REGIMES)),
        ("q_layouts", q_layouts, Q_LAYOUTS), ("kv_layouts", kv_layouts, KV_LAYOUTS),
        ("index_layouts", index_layouts, INDEX_LAYOUTS), ("pool_fills", pool_fills, POOL_FILLS),
    ):
        _check_choices(name, chosen, allowed)
    size = dict(min_size=max(min_batch, min_empty), max_size=limits.max_batch)

    @cache
    def lengths_for(page_size: int) -> st.SearchStrategy[list[int]]:
        one_length = sequence_lengths(max_len=limits.max_len, page_size=page_size) if lengths is None else lengths
        return st.lists(one_length, **size)

    # Every part is built once, here (the lengths once per page size): a strategy built inside the draw is
    # validated anew for every example, which cost more than all the drawing (docs/gpu.md section 14).
    fields = _CaseFields(
        lengths=lengths_for,
        min_empty=min_empty,
        shared=SharedFields.of(page_layouts, pool_fills, values, sm_scales, min_spare_pages, limits.max_spare_pages),
        q_layout=Choice.of(q_layouts),
        kv_layout=Choice.of(kv_layouts),
        index_layout=Choice.of(index_layouts),
    )
    return _draw_case(fields)


@dataclass(frozen=True)
class Choice:
    """One descriptor field's allowed values, drawn only where there are several: a lone value costs no draw (a
    draw that makes no choice still costs Hypothesis its bookkeeping, and most properties allow one layout)."""

    options: tuple[str, ...]
    strategy: st.SearchStrategy[str]

    @classmethod
    def of(cls, options: tuple[str, ...]) -> Choice:
        return cls(tuple(options), st.sampled_from(options))

    def drawn(self, draw: Callable) -> str:
        """The value, drawn (inside an ``st.composite``'s ``draw``) unless there is only one."""
        return self.options[0] if len(self.options) == 1 else draw(self.strategy)


@dataclass(frozen=True)
class SharedFields:
    """One strategy per descriptor field that decode and prefill cases share, drawn in this order (``draw_shared``)."""

    page_layout: Choice
    spare_pages: st.SearchStrategy[int]
    pool_fill: Choice
    scale: st.SearchStrategy[float | None]
    values: Choice
    seed: st.SearchStrategy[int]

    @classmethod
    def of(cls, page_layouts: tuple[str, ...], pool_fills: tuple[str, ...], values: tuple[str, ...],
           sm_scales: st.SearchStrategy[float | None] | None, min_spare_pages: int, max_spare_pages: int,
           ) -> SharedFields:
        """The strategies for the given choices (``sm_scales`` None: ``scales()``)."""
        return cls(page_layout=Choice.of(page_layouts), spare_pages=st.integers(min_spare_pages, max_spare_pages),
                   pool_fill=Choice.of(pool_fills), scale=scales() if sm_scales is None else sm_scales,
                   values=Choice.of(values), seed=st.integers(0, 2**32 - 1))


def draw_shared(draw: Callable, fields: SharedFields) -> dict[str, object]:
    """The shared descriptor fields of one case, drawn (inside an ``st.composite``'s ``draw``) in their order."""
    return {"page_layout": fields.page_layout.drawn(draw), "spare_pages": draw(fields.spare_pages),
            "pool_fill": fields.pool_fill.drawn(draw), "scale": draw(fields.scale), "values": fields.values.drawn(draw),
            "seed": draw(fields.seed)}


@dataclass(frozen=True)
class _CaseFields:
    """One strategy per descriptor field (``min_empty``: how many sequences are forced empty)."""

    lengths: Callable[[int], st.SearchStrategy[list[int]]]  # by page size
    min_empty: int
    shared: SharedFields
    q_layout: Choice
    kv_layout: Choice
    index_layout: Choice


@st.composite
def _draw_case(draw, fields: _CaseFields) -> DecodeCase:
    definition = active_definition()
    lengths = draw(fields.lengths(definition.page_size))
    if fields.min_empty:
        empty = draw(st.sets(st.integers(0, len(lengths) - 1), min_size=fields.min_empty, max_size=fields.min_empty))
        lengths = [0 if i in empty else n for i, n in enumerate(lengths)]
    return DecodeCase(
        lengths=tuple(lengths),
        **draw_shared(draw, fields.shared),
        q_layout=fields.q_layout.drawn(draw),
        kv_layout=fields.kv_layout.drawn(draw),
        index_layout=fields.index_layout.drawn(draw),
        definition=definition.name,
    )
