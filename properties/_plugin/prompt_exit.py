"""An xdist worker ends its process as soon as its pytest session is over, instead of idling until the controller
tells it to and then tearing its interpreter down.

The xdist controller, at its session's end, waits for every worker process to exit. An ordinary worker exit only
starts once the controller has heard the last worker finish and sent its ``GATEWAY_TERMINATE``, and then, with
torch and Triton loaded, spends about 0.6 s (an idle CPU) finalising modules and objects after its last exit handler.
On a 2-core CPU host (``benchmarks/throughput.py startup``, medians of 5) xdist waited 1.07 s for its two workers'
processes after the last of them finished, 0.28 s with this; the last test to pytest's exit went from 2.06 to 1.23 s
(3.60 to 2.94 s for the whole suite with its run report, which then takes most of what is left).

Once a worker's ``pytest_cmdline_main`` has returned, its session has ended (its ``workerfinished`` message, with
everything xdist reports, has been written to the controller), its plugins are unconfigured and pytest's clean-ups
have run: nothing of the run is left to do.

So, in that state, the worker does what the interpreter's own exit would still do that matters, and ends there:
it runs the exit handlers (``atexit``: ``logging.shutdown``, ``weakref.finalize(..., atexit=True)`` such as
``tempfile.TemporaryDirectory``, coverage's save), flushes Python's and C's standard streams, and calls
``os._exit(0)``. What it skips: the finalisation of objects still alive (``__del__`` methods; a file a plugin left
open and unflushed would lose its buffer) and native libraries' exit code (C ``atexit``, C++ static destructors: a
profiler that writes a worker's trace from there may need ``GQA_DECODE_PROMPT_EXIT=0``).

It does not: outside an xdist worker (the controller, a run without xdist, a pytest started inside a test); in a
worker whose session did not finish (no ``workerfinished`` sent) or whose ``pytest_cmdline_main`` raised; while a
thread that is not a daemon still runs (the interpreter would wait for it); or with ``GQA_DECODE_PROMPT_EXIT=0``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

import pytest

PROMPT_EXIT_ENV = "GQA_DECODE_PROMPT_EXIT"  # "0": workers exit the ordinary way


def ready_to_exit(config: pytest.Config) -> bool:
    """Whether this process is an xdist worker whose session is over and reported, with nothing left running."""
    if os.environ.get(PROMPT_EXIT_ENV, "1") == "0":
        return False
    if not hasattr(config, "workerinput"):  # only xdist's remote.py sets it, on its worker's own config
        return False
    if "exitstatus" not in getattr(config, "workeroutput", {}):  # set as it sends workerfinished
        return False
    main = threading.main_thread()
    return not any(thread.is_alive() and not thread.daemon and thread is not main
                   for thread in threading.enumerate())


def exit_now() -> None:
    """Run the exit handlers, flush the standard streams and end the process (status 0, as a worker's own)."""
    atexit._run_exitfuncs()  # prints a handler's exception and goes on, as the interpreter's exit does
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):  # C's stdio buffers (a native library's printf): os._exit skips them
        import ctypes

        ctypes.CDLL(None).fflush(None)
    os._exit(0)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_cmdline_main(config: pytest.Config):
    """Outermost around the worker's whole session: once it returns, the worker may end (``ready_to_exit``)."""
    status = yield
    if ready_to_exit(config):
        exit_now()
    return status
