"""Shrinking bounded in time: a failure shrinks for at most ``--shrink-limit`` seconds, and stops once the run's
``--time-budget`` is spent.

Hypothesis shrinks a failure for up to five minutes. A kernel that fails widely spends most of a run there
(docs/performance.md, "Shrinking"), and a shrink in flight at the end of a ``--time-budget`` ran on past it, into
the time the cause probes had. Hypothesis offers
no setting for it, only its engine's module constant ``MAX_SHRINKING_SECONDS``, read when a test's shrink phase
starts; past it the engine stops shrinking and reports the smallest failure found so far, replayed for real.
Before each example this sets that constant to what the item may still spend, and restores it after the item.
(A rejection of the examples past the limit does not work: Hypothesis replays the failures it already has at
the start of the shrink, and calls a rejection there flaky.)
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable, Iterator

from hypothesis import note
from hypothesis.internal.conjecture import engine as hypothesis_engine

from gqa_decode_fuzz.engine import examples

from .shards import wrapping_examples

__all__ = ["SHRINK_PAST_A_TIME_BUDGET", "ShrinkLimit", "shrink_cut_notes"]

# A failure found just before the --time-budget ends still gets this long to shrink: the cause probes group
# failures by their shrunk cases, and the probes have 30 s past the budget (``causes.SECONDS_PAST_A_TIME_BUDGET``).
SHRINK_PAST_A_TIME_BUDGET = 10.0
_SETTING = "MAX_SHRINKING_SECONDS"  # Hypothesis's own limit, five minutes
_CUT = "gqa-decode: shrinking stopped at"  # how the note on a cut failure starts


def shrink_cut_notes(error: BaseException) -> list[str]:
    """The notes on ``error`` (or on the errors of its group) that say its shrink was cut."""
    errors = [error, *getattr(error, "exceptions", ())]
    return [note for each in errors for note in getattr(each, "__notes__", ()) if note.startswith(_CUT)]


class ShrinkLimit:
    """How long a failure may shrink: ``limit_s`` (None: Hypothesis's own five minutes), and no longer than the
    run's ``deadline`` (``time.time()``; None: no --time-budget), though at least ``past_deadline_s``."""

    def __init__(self, limit_s: float | None, deadline: float | None, first_failure: Callable[[], float | None],
                 past_deadline_s: float = SHRINK_PAST_A_TIME_BUDGET) -> None:
        self.limit_s = limit_s
        self.deadline = deadline
        self.first_failure = first_failure  # when (``time.time()``) the running item first failed, or None
        self.past_deadline_s = past_deadline_s
        self.hypothesis_default = getattr(hypothesis_engine, _SETTING, None)  # None: this Hypothesis has none
        if self.hypothesis_default is None and limit_s is not None:
            warnings.warn(f"--shrink-limit={limit_s}: this Hypothesis has no {_SETTING} to set, so its failures "
                          "shrink as long as it lets them", stacklevel=2)

    def seconds(self, now: float) -> tuple[float, str]:
        """How long a shrink that starts at ``now`` (``time.time()``) may take, and what sets that."""
        limits = [(float(self.hypothesis_default or 300), "Hypothesis's own limit")]
        if self.limit_s is not None:
            limits.append((float(self.limit_s), f"--shrink-limit={self.limit_s:g}"))
        if self.deadline is not None:
            limits.append((max(self.deadline - now, self.past_deadline_s), "the run's --time-budget"))
        return min(limits)

    @contextlib.contextmanager
    def applied(self, item) -> Iterator[None]:
        """Run ``item`` (a Hypothesis test item) with its failures' shrink bounded, noting on the reported
        failure when the bound stopped it."""
        if self.hypothesis_default is None or (self.limit_s is None and self.deadline is None):
            yield
            return
        try:
            with wrapping_examples(item, self._bounding):
                yield
        finally:
            setattr(hypothesis_engine, _SETTING, self.hypothesis_default)

    def _bounding(self, example: Callable) -> Callable:
        @functools.wraps(example)
        def bounded(*args, **kwargs):
            now = time.time()
            if not examples.final_example():
                setattr(hypothesis_engine, _SETTING, self.seconds(now)[0])
            elif examples.running_example() is not None and (first := self.first_failure()) is not None \
                    and now - first >= (allowed := self.seconds(first))[0]:  # a shrunk failure, not an @example
                # The shrink starts a little after the first failure (Hypothesis may look for other bugs first)
                # and its explain phase follows it, so a shrink that ended on its own just short of its limit is
                # noted too: a rare overstatement.
                note(f"{_CUT} {allowed[1]} ({allowed[0]:.1f} s): this is the smallest failing example found by "
                     "then, which a longer shrink may make smaller (Hypothesis's warning of five minutes means this "
                     "stop)")
            return example(*args, **kwargs)

        return bounded
