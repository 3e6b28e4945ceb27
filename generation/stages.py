"""Where an example's time goes: the stages the run report and ``benchmarks/throughput.py`` break it into.

The builder, the ``impl`` fixture, the oracle and the comparison each run inside
``stage(name)``. Nothing is timed unless a ``StageClock`` is installed (the plugin
installs one per process). A GPU runs asynchronously, so a clock synchronises the device
at the edges of each stage, but only in the examples it samples (one in ``every``, at random), so
that timing costs the run almost nothing. Time outside the stages (Hypothesis drawing
and shrinking, the test body's own glue) is "generation", the remainder.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Callable, Iterator

STAGES = ("build", "kernel", "oracle", "checks")
SAMPLE_EVERY = 32  # a clock times one example in this many (each costs a time-sliced GPU five more turns)

__all__ = ["SAMPLE_EVERY", "STAGES", "StageClock", "install", "stage", "timed", "uninstall"]


class StageClock:
    """Seconds per stage over the sampled examples of one test item (``take`` hands them over and resets)."""

    def __init__(self, every: int = SAMPLE_EVERY, synchronize: Callable[[], None] | None = None) -> None:
        if every < 1:
            raise ValueError(f"every={every} must be at least 1")
        self.every, self.synchronize = every, synchronize or (lambda: None)
        self.examples = 0  # examples begun in this process, sampled or not
        self.sampling = False
        self.inside: str | None = None  # the open stage: a nested one counts toward it
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.sampled = 0
        self._coin = random.Random(0)  # its own stream: Hypothesis seeds the global one in each example

    def begin_example(self) -> None:
        """A new example starts: sample it with probability 1 / ``every``.

        At random, not every n-th: Hypothesis starts each test with its simplest example, which a
        fixed stride would sample in every item of ``every`` examples.
        """
        self.sampling = self.every == 1 or self._coin.random() * self.every < 1
        self.examples += 1
        self.sampled += self.sampling

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if not self.sampling or self.inside is not None:
            yield
            return
        self.synchronize()  # the work queued before this stage is not its own
        self.inside, start = name, time.perf_counter()
        try:
            yield
            self.synchronize()  # only on success: after a device fault a synchronisation raises again
        finally:
            self.inside = None
            self.seconds[name] += time.perf_counter() - start

    def take(self) -> dict:
        """{"sampled": examples timed, stage: seconds, ...} since the last take; then start afresh."""
        taken = {"sampled": self.sampled, **self.seconds}
        self.seconds, self.sampled = dict.fromkeys(STAGES, 0.0), 0
        return taken


_clock: StageClock | None = None


def install(clock: StageClock) -> None:
    """Time the stages of this process's examples with ``clock``."""
    global _clock
    _clock = clock


def uninstall() -> None:
    global _clock
    _clock = None


def stage(name: str) -> contextlib.AbstractContextManager:
    """Time the block as stage ``name`` (one of ``STAGES``) when a clock is installed and samples this example."""
    return _clock.stage(name) if _clock is not None else contextlib.nullcontext()


def timed(name: str, function: Callable) -> Callable:
    """``function``, each call timed as stage ``name``."""

    @functools.wraps(function)
    def in_stage(*args, **kwargs):
        __tracebackhide__ = True
        with stage(name):
            return function(*args, **kwargs)

    return in_stage
