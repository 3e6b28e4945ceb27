"""How large drawn cases get: a module of its own, importing neither torch nor Hypothesis, so that the plugin can
name the case sizes (``--case-sizes``) in a process that never builds a case (the xdist controller)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["SizeLimits", "active_limits", "using_limits"]


@dataclass(frozen=True)
class SizeLimits:
    """How large drawn cases get; set per profile (CPU interpreter runs stay small)."""

    max_batch: int = 4
    max_len: int = 300
    max_spare_pages: int = 512


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
