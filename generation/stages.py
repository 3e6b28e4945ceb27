"""Where an example's time goes: the stages the run report and ``benchmarks/throughput.py`` break it into.

The builder, the ``impl`` fixture, the oracle and the comparison each run inside
``stage(name)``. Nothing is timed unless a ``StageClock`` is installed (the plugin
installs one per process) and the example runs through ``StageClock.timing`` (the plugin
wraps each Hypothesis example in it, outermost). A GPU runs asynchronously, so a clock
synchronises the device at the edges of each stage, but only in the examples it samples (one
in ``every``, at random), so that timing costs the run almost nothing.

A sampled example's time is split into ``COLUMNS``, disjoint and together its whole time:
"generation" (from the end of the previous example to the start of this one: Hypothesis
drawing this example, and its engine's work on the last), the four ``STAGES``, and "other"
(the rest of the example: the test body's glue, the plugin's wrappers). The first example of
each property in each process (compilation, loading) is always timed and kept apart.

Every other example is split in two, ``SPLIT``: generation, and the example itself (its body,
unsynchronised). Generation is host work alone, so its share of a worker's time needs no
synchronisation and rests on every example, not on one in ``every``. The sums are exact; the rows
kept for medians are a uniform sample of at most ``SPLIT_KEPT`` per item (reservoir sampling), so
that a nightly run's part files stay small.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator

STAGES = ("build", "kernel", "oracle", "checks")
COLUMNS = ("generation", *STAGES, "other")  # disjoint: together one example's whole time
SAMPLE_EVERY = 32  # a clock times one example in this many (each costs a time-sliced GPU five more turns)
SPLIT = ("generation", "example")  # the two columns of every unsampled example
SPLIT_KEPT = 256  # rows of SPLIT an item keeps at most (a uniform sample: reservoir sampling)

__all__ = ["COLUMNS", "SAMPLE_EVERY", "SPLIT", "SPLIT_KEPT", "STAGES", "StageClock", "install", "quantile",
           "split_line", "stage", "summarise", "summarise_split", "timed", "uninstall"]


class StageClock:
    """Milliseconds per column (``COLUMNS``) of each sampled example of one test item (``take`` hands them over)."""

    def __init__(self, every: int = SAMPLE_EVERY, synchronize: Callable[[], None] | None = None,
                 now: Callable[[], float] = time.perf_counter) -> None:
        if every < 1:
            raise ValueError(f"every={every} must be at least 1")
        self.every, self.synchronize, self.now = every, synchronize or (lambda: None), now
        self.examples = 0  # examples begun in this process, sampled or not
        self.sampling = False
        self.inside: str | None = None  # the open stage: a nested one counts toward it
        self.samples: list[list[float]] = []  # steady examples, one row of COLUMNS each
        self.first: list[list[float]] = []  # the first example of a property in this process
        self.unsampled: list[list[float]] = []  # steady examples not sampled, one row of SPLIT each (a sample)
        self.unsampled_sums = [0, 0.0, 0.0]  # every such example: count, then ms summed per column of SPLIT
        self._keep = random.Random(1)  # the rows' reservoir, apart from the coin so that sampling is unchanged
        self._coin = random.Random(0)  # its own stream: Hypothesis seeds the global one in each example
        self._properties_seen: set[str] = set()
        self._property: str | None = None
        self._is_first = False
        self._last_end: float | None = None
        self._start = self._generation = 0.0
        self._spent = dict.fromkeys(STAGES, 0.0)

    def begin_item(self, property_name: str | None = None) -> None:
        """A test item of ``property_name`` starts: drop what an earlier, unflushed item timed; the first
        example's generation counts from now."""
        self.take()
        self._property, self._last_end = property_name, self.now()

    def begin_example(self) -> None:
        """A new example starts: sample it with probability 1 / ``every`` (always, the property's first here).

        At random, not every n-th: Hypothesis starts each test with its simplest example, which a
        fixed stride would sample in every item of ``every`` examples.
        """
        started = self.now()
        self._is_first = self._property is not None and self._property not in self._properties_seen
        if self._property is not None:
            self._properties_seen.add(self._property)
        self.sampling = self._is_first or self.every == 1 or self._coin.random() * self.every < 1
        self.examples += 1
        self._generation = started - self._last_end if self._last_end is not None else 0.0
        if self.sampling:
            self.synchronize()  # the device work of earlier, unsampled examples is not this one's
            self._spent = dict.fromkeys(STAGES, 0.0)
        self._start = self.now()

    def end_example(self) -> None:
        """The example ended (passed or not): its row is kept; the next example's generation counts from now."""
        ended = self.now()
        if self.sampling:
            spent = [self._spent[name] for name in STAGES]
            row = [self._generation, *spent, max(ended - self._start - sum(spent), 0.0)]
            (self.first if self._is_first else self.samples).append([round(1e3 * s, 4) for s in row])
        else:  # a first example is always sampled
            self._keep_unsampled([round(1e3 * self._generation, 4), round(1e3 * (ended - self._start), 4)])
        self.sampling = False
        self._last_end = ended

    def _keep_unsampled(self, row: list[float]) -> None:
        sums = self.unsampled_sums
        sums[0] += 1
        sums[1] += row[0]
        sums[2] += row[1]
        if len(self.unsampled) < SPLIT_KEPT:
            self.unsampled.append(row)
        else:  # the n-th row replaces a kept one with probability SPLIT_KEPT / n
            slot = self._keep.randrange(sums[0])
            if slot < SPLIT_KEPT:
                self.unsampled[slot] = row

    def timing(self, example: Callable) -> Callable:
        """``example`` (one Hypothesis example, see ``shards.wrapping_examples``) between ``begin_example``
        and ``end_example``: wrap it outermost, so that the plugin's other wrappers count as "other"."""

        @functools.wraps(example)
        def timed_example(*args, **kwargs):
            __tracebackhide__ = True
            self.begin_example()
            try:
                return example(*args, **kwargs)
            finally:
                self.end_example()

        return timed_example

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if not self.sampling or self.inside is not None:
            yield
            return
        if name not in self._spent:
            raise ValueError(f"stage name={name!r} is not one of {STAGES}")
        self.synchronize()  # the work queued before this stage is not its own
        self.inside, start = name, self.now()
        try:
            yield
            self.synchronize()  # only on success: after a device fault a synchronisation raises again
        finally:
            self.inside = None
            self._spent[name] += self.now() - start

    def take(self) -> dict:
        """{"columns": COLUMNS, "examples": [row ms, ...], "first": [row ms, ...], "split": SPLIT, "unsampled":
        [row ms, ...], "unsampled_sums": [count, ms, ms]} since the last take; then start afresh."""
        taken = {"columns": list(COLUMNS), "examples": self.samples, "first": self.first, "split": list(SPLIT),
                 "unsampled": self.unsampled, "unsampled_sums": [round(x, 3) for x in self.unsampled_sums]}
        self.samples, self.first, self.unsampled, self.unsampled_sums = [], [], [], [0, 0.0, 0.0]
        return taken


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear between the nearest ranks); NaN for none."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q} must lie in [0, 1]")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(rows: list[list[float]], columns: tuple[str, ...] = COLUMNS) -> dict | None:
    """Per column of ``rows`` (milliseconds, one row of ``columns`` per example): count, median, p90, mean and
    share of the examples' summed time (the shares add to 100%), and the same for the total; None for no rows."""
    if not rows:
        return None
    totals = [sum(row) for row in rows]
    grand = sum(totals)
    summary = {}
    for index, name in enumerate(columns):
        values = [row[index] for row in rows]
        summary[name] = {"count": len(values), "median": quantile(values, 0.5), "p90": quantile(values, 0.9),
                         "mean": sum(values) / len(values), "share": sum(values) / grand if grand else 0.0}
    summary["total"] = {"count": len(totals), "median": quantile(totals, 0.5), "p90": quantile(totals, 0.9),
                        "mean": grand / len(totals), "share": 1.0 if grand else 0.0}
    return summary


def summarise_split(rows: list[list[float]], sums: list[float]) -> dict | None:
    """``summarise`` over the kept rows of ``SPLIT`` (medians and p90 of a sample), with count, mean and share
    from ``sums`` (count, then ms per column, over every unsampled example); None for none."""
    summary = summarise(rows, SPLIT)
    count, *spent = sums
    if summary is None or not count:
        return None
    grand = sum(spent)
    for name, total in zip(SPLIT, spent, strict=True):
        summary[name].update(count=count, mean=total / count, share=total / grand if grand else 0.0)
    summary["total"].update(count=count, mean=grand / count, kept=len(rows))
    return summary


def split_line(split: dict) -> str:
    """Generation's share of a worker's examples, over every example the stage clocks did not sample."""
    generation, example = split["generation"], split["example"]
    return (f"Generation over every unsampled example ({generation['count']}, no synchronisation: host time "
            f"alone): {100 * generation['share']:.1f}% of their time; mean {generation['mean']:.3f} ms against "
            f"the example's own {example['mean']:.3f} ms; medians {generation['median']:.3f} and "
            f"{example['median']:.3f} ms (over {split['total']['kept']} of them kept at random)")


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
