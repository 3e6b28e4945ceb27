"""Where a pytest run's fixed cost goes: timestamps of its phases, in the controller and every xdist worker.

Load it as a plugin and name a log file; each process appends JSON lines {pid, role, event, t, imported}:

    STARTUP_PROBE_LOG=/tmp/probe.jsonl STARTUP_PROBE_T0=$(date +%s.%N) \
        PYTHONPATH=. pytest -p benchmarks.startup_probe properties -n 2 --max-examples=2 -q
    python benchmarks/startup_probe.py /tmp/probe.jsonl   # the phases, in seconds from T0

``-p`` loads it before conftest.py, so "probe loaded" is when pytest itself has been imported and
"configure start" is after conftest.py and the suite's plugin have been imported. The xdist controller also
marks when it starts its workers ("spawn start", "spawn end") and when its own collection step (where the suite
loads the implementation) ends; each line lists which of torch, triton, hypothesis and numpy were imported by
then. At the end it marks each process's session end, unconfigure and ``atexit`` (registered first, so it runs
after the other exit handlers, before the interpreter tears itself down), and in the controller each worker it
hears finish ("worker down") and when xdist has waited for their processes to exit ("workers exited").
``throughput.py startup`` runs this probe and prints the phases as a table. Measures only; changes nothing in the
run.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

import pytest

_LOG = os.environ.get("STARTUP_PROBE_LOG")
_ROLE = os.environ.get("PYTEST_XDIST_WORKER", "controller")
_seen: set[str] = set()
WATCHED = ("torch", "triton", "hypothesis", "numpy")  # each line lists those imported by then


def _mark(event: str, once: bool = False) -> None:
    if not _LOG or (once and event in _seen):
        return
    _seen.add(event)
    line = {"pid": os.getpid(), "role": _ROLE, "event": event, "t": time.time(),
            "imported": [name for name in WATCHED if name in sys.modules]}
    with open(_LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")


_mark("probe loaded")
atexit.register(_mark, "exit")


@pytest.hookimpl(specname="pytest_configure", tryfirst=True)
def pytest_configure_start(config):
    _mark("configure start")


@pytest.hookimpl(specname="pytest_configure", trylast=True)
def pytest_configure_end(config):
    _mark("configure end")


@pytest.hookimpl(tryfirst=True, specname="pytest_sessionstart")
def pytest_sessionstart_first(session):
    _mark("sessionstart")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    _mark("spawn start")


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionstart(session):
    yield
    if _ROLE == "controller":
        _mark("spawn end")  # after xdist's sessionstart, which starts the workers (nothing to mark without xdist)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    yield
    _mark("collection end")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    _mark("collection finish")


def pytest_runtest_logstart(nodeid, location):
    _mark("first test start", once=True)


def pytest_runtest_logfinish(nodeid, location):
    _mark("last test end")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    _mark("sessionfinish start")
    yield
    _mark("sessionfinish end")


@pytest.hookimpl(specname="pytest_sessionfinish")
def pytest_sessionfinish_plain(session):
    """Among the plain implementations, after xdist's (registered later, so called earlier), which waits for the
    worker processes to exit; before the trylast ones (the suite's, which waits for its run report)."""
    if _ROLE == "controller":
        _mark("workers exited")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _mark("worker down")  # the controller has its workerfinished (the last one counts)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    _mark("unconfigure end")


def _summary(path: str, t0: float | None) -> None:
    lines = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    start = t0 if t0 is not None else min(line["t"] for line in lines)
    by_role: dict[str, dict[str, float]] = {}
    for line in lines:
        events = by_role.setdefault(line["role"], {})
        if line["event"] in ("last test end", "worker down") or line["event"] not in events:
            events[line["event"]] = line["t"] - start
    for role, events in sorted(by_role.items(), key=lambda kv: (kv[0] != "controller", kv[0])):
        print(role.ljust(10), "  ".join(f"{event} {t:.2f}" for event, t in sorted(events.items(), key=lambda e: e[1])))


if __name__ == "__main__":
    _summary(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else None)
