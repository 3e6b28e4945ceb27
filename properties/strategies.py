"""Hypothesis strategies for decode cases.

Nasty regimes are reached through drawn branches (``one_of``, ``sampled_from``
with the ordinary choice first), so failures shrink toward a short batch of
ordinary values, not away from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from .cases import PAGE_LAYOUTS, POOL_FILLS, VALUE_REGIMES, DecodeCase

# Block sizes that Triton decode kernels use; each length at a boundary and one either side.
_BLOCK_EDGES = sorted({n + d for n in (16, 32, 64, 128, 256) for d in (-1, 0, 1)})


@dataclass(frozen=True)
class SizeLimits:
    """How large drawn cases get; set per profile (CPU interpreter runs stay small)."""

    max_batch: int = 4
    max_len: int = 300
    max_spare_pages: int = 512


def sequence_lengths(*, max_len: int) -> st.SearchStrategy[int]:
    """Tokens in one sequence: weighted to 0, 1, block edges, short runs, and a long tail."""
    if max_len < 1:
        raise InvalidArgument(f"max_len={max_len} must be at least 1")
    edges = [n for n in _BLOCK_EDGES if n <= max_len]
    return st.one_of(
        st.integers(0, min(40, max_len)),
        st.sampled_from([0, 1, *edges]),
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


@st.composite
def decode_cases(
    draw,
    *,
    limits: SizeLimits = SizeLimits(),
    min_batch: int = 1,
    min_empty: int = 0,
    layouts: tuple[str, ...] = PAGE_LAYOUTS,
    values: tuple[str, ...] = tuple(VALUE_REGIMES),
) -> DecodeCase:
    """A ``DecodeCase`` within ``limits``, with at least ``min_empty`` empty sequences."""
    if not 0 <= min_batch <= limits.max_batch or not 0 <= min_empty <= limits.max_batch:
        raise InvalidArgument(f"min_batch={min_batch} and min_empty={min_empty} must lie in [0, {limits.max_batch}]")
    lengths = draw(
        st.lists(sequence_lengths(max_len=limits.max_len), min_size=max(min_batch, min_empty),
                 max_size=limits.max_batch),
    )
    if min_empty:
        empty = draw(st.sets(st.integers(0, len(lengths) - 1), min_size=min_empty, max_size=min_empty))
        lengths = [0 if i in empty else n for i, n in enumerate(lengths)]
    return DecodeCase(
        lengths=tuple(lengths),
        layout=draw(st.sampled_from(layouts)),
        spare_pages=draw(st.integers(0, limits.max_spare_pages)),
        pool_fill=draw(st.sampled_from(POOL_FILLS)),
        scale=draw(scales()),
        values=draw(st.sampled_from(values)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )
