"""How large drawn cases get: a module of its own, importing neither torch nor Hypothesis, so that the plugin can
name the case sizes (``--case-sizes``) in a process that never builds a case (the xdist controller)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["SizeLimits", "active_limits", "using_limits"]


@dataclass(frozen=True)
class SizeLimits:
    """How large drawn cases get; set per profile (CPU interpreter runs stay small). ``max_len`` bounds a decode
    sequence; causal prefill draws at most ``max_q_len`` queries and ``max_kv_len`` keys per sequence, and at most
    ``max_prefill_batch`` sequences (its work grows as queries times keys)."""

    max_batch: int = 4
    max_len: int = 300
    max_spare_pages: int = 512
    max_q_len: int = 34
    max_kv_len: int = 136
    max_prefill_batch: int = 3


_active: list[SizeLimits] = []  # using_limits blocks open, innermost last


def active_limits() -> SizeLimits:
    """The case-size limits of the run drawing now (``using_limits``); fails clearly outside one."""
    if not _active:
        raise RuntimeError("the run's case sizes are set by the suite's pytest plugin around each test "
                           "(sizes.using_limits); draw these cases inside a test of the run")
    return _active[-1]


@contextlib.contextmanager
def using_limits(limits: SizeLimits) -> Iterator[SizeLimits]:
    """Cases sized by the run (``strategies.run_sized``) are drawn within ``limits`` inside the block (the plugin
    wraps each test item in one)."""
    _active.append(limits)
    try:
        yield limits
    finally:
        _active.pop()
