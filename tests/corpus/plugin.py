"""pytest plugin for runs of the property suite against a corpus mutant (``-p tests.corpus.plugin``).

Three options, all off by default:

``--corpus-record=FILE``
    Count, per Hypothesis test, the valid examples it ran up to its first failing
    one (explicit ``@example``s first, then generated ones) and write them to FILE
    as JSON at session end, with the session's CPU time (steadier than wall time
    on a shared machine): ``{"cpu_seconds": s, "tests": {nodeid: {"examples": n,
    "first_failure": k or null, "seconds_to_first_failure": s or null}}, "first_example_to_failure": s or null,
    "example_ms": [[test, ms, gap], ...]}`` (seconds from the session's first example to its first failing one,
    and each example's milliseconds up to that one in the order they ran, with the milliseconds since the one
    before ended: where first calls compile, and what drawing costs; the first ``EXAMPLE_MS_KEPT`` only, so a
    kernel that never fails leaves a record of bounded size). It wraps each test's
    ``.hypothesis.inner_test``, the hook Hypothesis provides for wrapping. Invalid
    draws (``assume``, overruns) are not counted; shrinking and the final replay
    come after the first failure and do not change the count.
``--corpus-first=FILE``
    Run the items of this test file before the rest (repeatable). Only the order
    changes: every property still runs until the first failure.
``--corpus-no-shrink``
    Use the selected Hypothesis profile without its shrink phase (and so without
    explain): a kill is found as fast as with it, but not minimised.
``--corpus-no-explicit``
    Use the selected profile without its explicit phase: the ``@example``s pinned
    in the suite are skipped, so a kill shows what generated examples find alone.
"""

from __future__ import annotations

import functools
import json
import time

import pytest
from hypothesis import Phase, settings
from hypothesis.errors import HypothesisException, StopTest

DERIVED_PROFILE = "corpus-derived"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gqa-corpus", "mutant corpus runs")
    group.addoption("--corpus-record", metavar="FILE", help="write examples-to-first-failure per test to FILE")
    group.addoption("--corpus-first", metavar="FILE", action="append", default=[],
                    help="run this test file's items first (repeatable)")
    group.addoption("--corpus-no-shrink", action="store_true", help="skip Hypothesis's shrink phase")
    group.addoption("--corpus-no-explicit", action="store_true", help="skip the explicit @example phase")


EXAMPLE_MS_KEPT = 2000  # examples timed in the record: a first failure comes far sooner, or not at all


@pytest.hookimpl(trylast=True)  # after the hypothesis plugin has loaded --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    config.corpus_records = {}
    # perf_counter() of the first example and the first failure, session-wide; each example's ms until then
    config.corpus_clock = {"first_example": None, "first_failure": None, "example_ms": []}
    dropped = set()
    if config.option.corpus_no_shrink:
        dropped |= {Phase.shrink, Phase.explain}
    if config.option.corpus_no_explicit:
        dropped.add(Phase.explicit)
    if dropped:
        phases = tuple(p for p in settings.default.phases if p not in dropped)
        settings.register_profile(DERIVED_PROFILE, parent=settings.default, phases=phases)
        settings.load_profile(DERIVED_PROFILE)


@pytest.hookimpl(trylast=True)  # after the suite's own order (its plain properties first): --corpus-first wins
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = [path.rstrip("/") for path in config.option.corpus_first]
    if first:
        items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in first)  # stable: keeps order within


def _counting(inner, record: dict, clock: dict, test: str):
    started = time.perf_counter()

    def timed(begun: float) -> None:
        if clock["first_failure"] is None:
            ended, before = time.perf_counter(), clock.get("last_end", begun)
            if len(clock["example_ms"]) < EXAMPLE_MS_KEPT:
                clock["example_ms"].append([test, round(1000 * (ended - begun), 1),
                                            round(1000 * (begun - before), 1)])
            clock["last_end"] = ended

    @functools.wraps(inner)
    def counted(*args, **kwargs):
        begun = time.perf_counter()
        if clock["first_example"] is None:
            clock["first_example"] = begun
        try:
            result = inner(*args, **kwargs)
        except (HypothesisException, StopTest):
            raise  # an invalid example (assume, overrun, health check): not counted
        except BaseException:  # pytest.fail raises a BaseException too
            timed(begun)
            if record["first_failure"] is None:
                record["examples"] += 1
                record["first_failure"] = record["examples"]
                record["seconds_to_first_failure"] = round(time.perf_counter() - started, 2)
            if clock["first_failure"] is None:
                clock["first_failure"] = time.perf_counter()
            raise
        timed(begun)
        if record["first_failure"] is None:
            record["examples"] += 1
        return result

    return counted


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    handle = getattr(getattr(item, "obj", None), "hypothesis", None)
    if handle is None or not item.config.option.corpus_record:
        yield
        return
    record = item.config.corpus_records.setdefault(
        item.nodeid, {"examples": 0, "first_failure": None, "seconds_to_first_failure": None}
    )
    inner = handle.inner_test
    handle.inner_test = _counting(inner, record, item.config.corpus_clock, item.name)
    try:
        yield
    finally:
        handle.inner_test = inner


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.option.corpus_record
    if path:
        with open(path, "w") as stream:
            clock = session.config.corpus_clock
            after = (None if clock["first_failure"] is None
                     else round(clock["first_failure"] - clock["first_example"], 2))
            json.dump({"cpu_seconds": round(time.process_time(), 1), "tests": session.config.corpus_records,
                       "first_example_to_failure": after, "example_ms": clock["example_ms"]}, stream, indent=1)
