"""A pytest process ends as soon as its session is over, instead of tearing its interpreter down: an xdist worker
without idling until the controller tells it to, and a process that pytest was started as (``python -m pytest``,
the ``pytest`` script: a run without xdist, such as ``check``'s, or the controller) once its plugins are
unconfigured.

The xdist controller, at its session's end, waits for every worker process to exit. An ordinary worker exit only
starts once the controller has heard the last worker finish and sent its ``GATEWAY_TERMINATE``, and then, with
torch and Triton loaded, spends a noticeable part of a second finalising modules and objects after its last exit
handler; the figures, ``benchmarks/throughput.py startup``: docs/gpu.md section 19.

Once a worker's ``pytest_cmdline_main`` has returned, its session has ended (its ``workerfinished`` message, with
everything xdist reports, has been written to the controller), its plugins are unconfigured and pytest's clean-ups
have run: nothing of the run is left to do.

So, in that state, the worker does what the interpreter's own exit would still do that matters, and ends there:
it waits for its GPU work (if it has a CUDA context), runs the exit handlers (``atexit``: ``logging.shutdown``,
``weakref.finalize(..., atexit=True)`` such as ``tempfile.TemporaryDirectory``, coverage's save), flushes Python's
and C's standard streams, and calls ``os._exit(0)`` (``engine/process_end.py``, which the isolated child's stop
shares). What it skips: the finalisation of objects still alive (``__del__`` methods; a file a plugin left open
and unflushed would lose its buffer) and native libraries' exit code (C ``atexit``, C++ static destructors, the
CUDA context's destruction: a profiler that writes a worker's trace from there may need
``GQA_DECODE_PROMPT_EXIT=0``).

A process that pytest was started as ends the same way, with pytest's exit status, after doing first what
``pytest.main`` would still do once this hook returns: its plugins' ``pytest_unconfigure`` (the isolated
children's stop, the MPS server's) and pytest's clean-ups (``Config._ensure_unconfigure``; where this private
method is gone, the process exits the ordinary way). With torch loaded its teardown took about a second on a GPU
host, which a caller that waits for the process (``gqa-decode-fuzz check``) waited out.

It does not: in a pytest that a program called (``pytest.main``: ``__main__`` is not pytest) or that a test started
inside the run (a second configuration in the process); in a worker whose session did not finish (no
``workerfinished`` sent); where ``pytest_cmdline_main`` raised; while a thread that is not a daemon still runs
(the interpreter would wait for it); or with ``GQA_DECODE_PROMPT_EXIT=0``.

Every process of the run (controller, workers, a run without xdist) also moves the objects it holds when its test
loop starts (torch, Triton, Hypothesis and the collected suite: some 200,000) into the garbage collector's permanent
generation (``gc.freeze``), unless something else froze objects first. pytest's unraisable-exception plugin runs a
full collection twice at the end of every session, and the interpreter one now and then during the tests; frozen,
they skip what was there before the first test, and still collect what the tests left (so pytest still reports an
exception raised in a ``__del__`` of theirs). Before an ordinary exit the objects are unfrozen: the interpreter's
teardown then frees them as before (frozen, Triton's bindings would report them as leaked).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from pathlib import Path

import pytest

from gqa_decode_fuzz.engine.process_end import end_process

PROMPT_EXIT_ENV = "GQA_DECODE_PROMPT_EXIT"  # "0": workers exit the ordinary way


_PROGRAM_CONFIG: list[pytest.Config] = []  # the first configuration of this process: the program's own session


def ready_to_exit(config: pytest.Config) -> bool:
    """Whether this process is an xdist worker whose session is over and reported, with nothing left running."""
    if os.environ.get(PROMPT_EXIT_ENV, "1") == "0":
        return False
    if not hasattr(config, "workerinput"):  # only xdist's remote.py sets it, on its worker's own config
        return False
    if "exitstatus" not in getattr(config, "workeroutput", {}):  # set as it sends workerfinished
        return False
    return not _threads_running()


def program_may_exit(config: pytest.Config) -> bool:
    """Whether this process is one pytest was started as, ``config`` its own session's (not a worker's: see
    ``ready_to_exit``), and it may end once its plugins are unconfigured."""
    if os.environ.get(PROMPT_EXIT_ENV, "1") == "0" or hasattr(config, "workerinput"):
        return False
    return _PROGRAM_CONFIG[:1] == [config] and started_as_pytest()


def started_as_pytest() -> bool:
    """Whether pytest is this process's program (``python -m pytest``, the ``pytest`` script), not a library that a
    program called."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name in ("pytest", "pytest.__main__"):
        return True
    return bool(sys.argv) and Path(sys.argv[0]).name in ("pytest", "py.test") \
        and getattr(main, "__file__", None) == sys.argv[0]


def _threads_running() -> bool:
    main = threading.main_thread()
    return any(thread.is_alive() and not thread.daemon and thread is not main for thread in threading.enumerate())


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _PROGRAM_CONFIG:
        _PROGRAM_CONFIG.append(config)


FROZE = pytest.StashKey[bool]()  # this session moved the process's objects to the permanent generation


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """The test loop starts: freeze what the process holds (see the module's docstring), unless already frozen."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        session.config.stash[FROZE] = True


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_cmdline_main(config: pytest.Config):
    """Outermost around the whole session: once it returns, an xdist worker may end (``ready_to_exit``), and so may
    the process pytest was started as, once unconfigured (``program_may_exit``); any other process gets back the
    objects this session froze."""
    try:
        status = yield
    except BaseException:
        _unfreeze(config)
        raise
    if ready_to_exit(config):
        end_process()
    if program_may_exit(config) and callable(getattr(config, "_ensure_unconfigure", None)):
        config._ensure_unconfigure()  # what pytest.main does after this hook; a second call does nothing
        if not _threads_running():
            end_process(int(status))
    _unfreeze(config)
    return status


def _unfreeze(config: pytest.Config) -> None:
    if config.stash.get(FROZE, False):
        gc.unfreeze()
        config.stash[FROZE] = False
