"""Shrinking bounded in time: a failure shrinks for at most ``--shrink-limit`` seconds, and stops once the run's
``--time-budget`` is spent.

Hypothesis shrinks a failure for up to five minutes. A kernel that fails widely spends most of a run there
(docs/performance.md, "Shrinking"), and a shrink in flight at the end of a ``--time-budget`` ran on past it, into
the time the cause probes had. Hypothesis offers no setting for it: its engine reads a module constant,
``MAX_SHRINKING_SECONDS``, when a test's shrink phase starts, and past it stops shrinking and reports the smallest
failure found so far, replayed for real. While an item runs, this wraps the engine's method that starts the
shrink phase: it sets that constant to what the shrink may take as it starts, and learns from the engine's exit
reason whether the limit stopped it. (A rejection of the examples past the limit does not work: Hypothesis
replays the failures it already has at the start of the shrink, and calls a rejection there flaky.)
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable, Iterator

import pytest
from hypothesis import note
from hypothesis.internal.conjecture import engine as hypothesis_engine

from gqa_decode_fuzz.engine import examples

from .shards import wrapping_examples

__all__ = ["SHRINK_PAST_A_TIME_BUDGET", "ShrinkLimit", "shrink_cut_notes"]

# A failure whose shrink starts just before the --time-budget ends still gets this long: the cause probes group
# failures by their shrunk cases, and the probes have 30 s past the budget (``causes.SECONDS_PAST_A_TIME_BUDGET``).
SHRINK_PAST_A_TIME_BUDGET = 10.0
_SETTING = "MAX_SHRINKING_SECONDS"  # Hypothesis's own limit, five minutes
_SHRINK_PHASES = ("shrink_interesting_test_cases", "shrink_interesting_examples")  # the name in newer, older releases


def shrink_cut_notes(error: BaseException) -> list[str]:
    """The notes on ``error`` (or on the errors of its group) that say its shrink was cut, each once."""
    errors = [error, *getattr(error, "exceptions", ())]
    notes = [said for each in errors for said in getattr(each, "__notes__", ())]
    return list(dict.fromkeys(said for said in notes if said.startswith(examples.SHRINK_CUT)))


def _shrink_phase() -> str | None:
    """The name of the engine's method that runs the shrink phase in this Hypothesis, or None."""
    runner = getattr(hypothesis_engine, "ConjectureRunner", None)
    return next((name for name in _SHRINK_PHASES if hasattr(runner, name)), None)


class ShrinkLimit:
    """How long a failure may shrink: ``limit_s`` (None: Hypothesis's own five minutes), and no longer than the
    run's ``deadline`` (``time.time()``; None: no --time-budget), though at least ``past_deadline_s``."""

    def __init__(self, limit_s: float | None, deadline: float | None,
                 past_deadline_s: float = SHRINK_PAST_A_TIME_BUDGET) -> None:
        self.limit_s = limit_s
        self.deadline = deadline
        self.past_deadline_s = past_deadline_s
        self.hypothesis_default = getattr(hypothesis_engine, _SETTING, None)
        self.phase = _shrink_phase()
        self.cut: str | None = None  # the running item's shrink was stopped here, and why
        if limit_s is not None and (self.hypothesis_default is None or self.phase is None):
            warnings.warn(f"--shrink-limit={limit_s}: this Hypothesis has no {_SETTING} or shrink phase this "
                          "suite knows, so its failures shrink as long as it lets them", stacklevel=2)

    def seconds(self, now: float) -> tuple[float, str]:
        """How long a shrink that starts at ``now`` (``time.time()``) may take, and what sets that."""
        limits = [(float(self.hypothesis_default), "Hypothesis's own limit")]
        if self.limit_s is not None:
            limits.append((float(self.limit_s), f"--shrink-limit={self.limit_s:g}"))
        if self.deadline is not None:
            limits.append((max(self.deadline - now, self.past_deadline_s), "the run's --time-budget"))
        return min(limits)

    @contextlib.contextmanager
    def applied(self, item: pytest.Item) -> Iterator[None]:
        """Run ``item`` (a Hypothesis test item) with its failures' shrink bounded, noting on the reported
        failure when the bound stopped it; Hypothesis's engine as it was afterwards."""
        if self.hypothesis_default is None or self.phase is None or (self.limit_s is None and self.deadline is None):
            yield
            return
        runner = hypothesis_engine.ConjectureRunner
        shrink_phase = getattr(runner, self.phase)
        self.cut = None
        setattr(runner, self.phase, self._bounded(shrink_phase))
        try:
            with wrapping_examples(item, self._noting):
                yield
        finally:
            setattr(runner, self.phase, shrink_phase)
            setattr(hypothesis_engine, _SETTING, self.hypothesis_default)

    def _bounded(self, shrink_phase: Callable) -> Callable:
        """The engine's shrink phase, with its limit set as it starts and its stop for that limit remembered."""

        @functools.wraps(shrink_phase)
        def bounded(engine, *args, **kwargs):
            seconds, why = self.seconds(time.time())
            setattr(hypothesis_engine, _SETTING, seconds)
            try:
                return shrink_phase(engine, *args, **kwargs)
            finally:
                if getattr(engine, "exit_reason", None) is hypothesis_engine.ExitReason.very_slow_shrinking:
                    self.cut = f"{why} ({seconds:.1f} s)"

        return bounded

    def _noting(self, example: Callable) -> Callable:
        """``example`` that, as Hypothesis's reported failure after a cut shrink, notes the cut."""

        @functools.wraps(example)
        def noted(*args, **kwargs):
            if self.cut is not None and examples.final_example():
                note(f"{examples.SHRINK_CUT} {self.cut}: this is the smallest failing example found by then, "
                     "which a longer shrink may make smaller (Hypothesis's warning of five minutes, which asks for a "
                     "report, means this stop)")
            return example(*args, **kwargs)

        return noted
