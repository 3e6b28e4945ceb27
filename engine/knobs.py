"""Kernel knobs: keyword arguments an implementation declares (``run.knobs``), drawn per example.

A split count or block size changes how a kernel computes, so it belongs in the search
space: each Hypothesis example draws one value of every knob (shrinking toward the
first, the declared default) and every call in that example uses the same values, so
bitwise claims about repeated calls stay fair. Outside a Hypothesis example (a plain
parametrized test) the defaults are used. The values travel in the recorded calls'
keyword arguments, so case files replay them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from . import examples

__all__ = ["KnobDraws", "defaults"]


def defaults(declared: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    """Each declared knob at its default, its first value."""
    return {name: values[0] for name, values in declared.items()}


class KnobDraws:
    """Draws the declared knobs once per example."""

    def __init__(self, knobs: dict[str, tuple[Any, ...]]) -> None:
        self.knobs = knobs
        self._example: object = None
        self._values: dict[str, Any] = {}

    def current(self) -> dict[str, Any]:
        """The knob values of the running example (drawn at its first call), or the defaults."""
        if not self.knobs:
            return {}
        example = examples.running_example()
        if example is None:
            return defaults(self.knobs)
        if example is not self._example:
            strategy = st.fixed_dictionaries({name: st.sampled_from(values) for name, values in self.knobs.items()})
            self._example, self._values = example, examples.draw_in(example, strategy, label="knobs")
        return self._values

    def applied_to(self, function: Callable) -> Callable:
        """``function`` called with the example's knob values (explicit keyword arguments win)."""
        if not self.knobs:
            return function

        @functools.wraps(function)
        def with_knobs(*args, **kwargs):
            return function(*args, **{**self.current(), **kwargs})

        return with_knobs
