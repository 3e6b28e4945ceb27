"""Ending a process at once, without the interpreter's teardown: what an xdist worker whose session is over
(``runner/prompt_exit.py``) and an isolated child told to stop (``isolation_child``) both do, because the
teardown of a process with torch and Triton loaded takes a noticeable part of a second that nothing needs.

What it keeps of an ordinary exit: the wait for the process's GPU work, the exit handlers (``atexit``) and the
flush of Python's and C's standard streams. What it skips: finalising objects still alive and native libraries'
exit code (C ``atexit``, C++ static destructors, the CUDA context's destruction, which the driver does with the
process)."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

__all__ = ["end_process"]


def end_process(status: int = 0) -> None:
    """Wait for the GPU, run the exit handlers, flush the standard streams and end the process with ``status``."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        # NVIDIA's MPS guide: a client that ends without synchronising with all its outstanding GPU work can
        # leave the server and its other clients in an undefined state. Its context is not destroyed either
        # way here (the driver reclaims it with the process), as when a process is killed.
        with contextlib.suppress(Exception):  # a lost context: nothing left to wait for
            torch.cuda.synchronize()
    atexit._run_exitfuncs()  # prints a handler's exception and goes on, as the interpreter's exit does
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):  # C's stdio buffers (a native library's printf): os._exit skips them
        import ctypes

        ctypes.CDLL(None).fflush(None)
    os._exit(status)
