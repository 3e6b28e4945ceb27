"""Crash containment: one faulting kernel call gives one failing test, never a poisoned run.

A sticky CUDA error (an illegal address, say) poisons the CUDA context of the
process: every later launch in it fails, and Hypothesis would go on "shrinking"
towards examples that never faulted. So the implementation under test runs
behind a guard that synchronises before an example that called it ends (once
per example, not per call: where processes share a GPU each wait is a turn on
it, and the example's own read-back has usually waited already), recognises a sticky error
by its message, saves the example that faulted as a case file (rebuilt on the
CPU from its descriptor: device memory is unreadable by then) and stops:

- in an xdist worker it exits the process at once; xdist reports that one test
  as crashed and starts a fresh worker (with a fresh CUDA context) for the rest;
- without xdist it raises ``CudaContextLost``, which Hypothesis does not catch
  (it derives from BaseException), and the plugin stops the session after it.

The same path runs on CPU for an implementation that raises CUDA's message, so
it is tested without a GPU (tests/test_crash_containment.py).

Under MPS one process's fault reaches every process on its GPU with the same message, so
a contained crash there may be a neighbour's: ``mps`` replays each one alone after the run.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch

CRASH_EXIT_CODE = 86

# Sticky errors: after one of these the context is unusable (CUDA runtime API documentation).
_STICKY = re.compile(
    r"illegal memory access|illegal address|misaligned address|unspecified launch failure|"
    r"device-side assert|illegal instruction|uncorrectable ECC error|hardware stack error|"
    r"CUDA error: (an )?invalid program counter",
    re.IGNORECASE,
)

__all__ = ["CRASH_EXIT_CODE", "CudaContextLost", "Guard", "is_sticky_cuda_error"]


class CudaContextLost(BaseException):  # noqa: N818 - reads as what happened
    """A sticky CUDA error: the process must stop running tests. BaseException so Hypothesis will not shrink."""


def is_sticky_cuda_error(error: BaseException) -> bool:
    """Whether ``error`` is a CUDA error that leaves the process's context unusable."""
    return isinstance(error, (RuntimeError, CudaContextLost)) and bool(_STICKY.search(str(error)))


class Guard:
    """Contains sticky CUDA errors: ``save(message)`` writes the case file and returns its path, then the
    worker exits (``in_worker``) or ``CudaContextLost`` is raised. One straight line, no callbacks up."""

    def __init__(self, device: torch.device, *, save: Callable[[str], Path | None], nodeid: Callable[[], str | None],
                 in_worker: bool, replay: Callable[[Path], str]) -> None:
        self.device, self.save, self.nodeid, self.in_worker, self.replay = device, save, nodeid, in_worker, replay
        self.lost: str | None = None  # set once the context is lost: whatever a test raises after that is this
        self.pending = False  # the running example called the implementation and has not waited for it since

    def contain(self, error: BaseException) -> None:
        """Save the faulting example, then exit the worker or raise ``CudaContextLost``."""
        if self.lost is not None:  # saved already: later errors are echoes of the same fault
            raise CudaContextLost(self.lost) from error
        message = f"{type(error).__name__}: {error}"
        try:
            path = self.save(message)
            note = (f"case file {path}\nreplay: {self.replay(path)}" if path is not None
                    else "no case file: a sibling shard faulted first and reports this property")
        except Exception as save_error:  # noqa: BLE001 - the exit must happen even if saving fails
            note = f"could not save a case file: {save_error!r}"
        text = f"\ngqa-decode: sticky CUDA error in {self.nodeid()}: {message}\n{note}\n"
        if self.in_worker:
            sys.stderr.write(text + "stopping this xdist worker; a fresh one takes over\n")
            sys.stderr.flush()
            os._exit(CRASH_EXIT_CODE)
        self.lost = f"{message}\n{note}"
        raise CudaContextLost(f"{message}\n{note}") from error

    def wrap(self, impl: Callable, on_call: Callable[[tuple, dict], None], *, settles: bool = True) -> Callable:
        """``impl`` that reports each call to ``on_call`` and contains sticky CUDA errors it raises; with
        ``settles=False`` (an implementation in a child process, which synchronises before it answers) the example
        does not wait for the device at its end on the call's account."""

        @functools.wraps(impl)
        def guarded_impl(*args, **kwargs):
            on_call(args, kwargs)
            self.pending = self.pending or settles  # the device may still run it: the example settles before it ends
            try:
                return impl(*args, **kwargs)
            except RuntimeError as error:
                if is_sticky_cuda_error(error):
                    self.contain(error)
                raise

        return guarded_impl

    def _settle(self) -> None:
        """Wait for the work of the example's calls, so that a fault in it is charged to this example."""
        if self.pending and self.device.type == "cuda":
            torch.cuda.synchronize()
        self.pending = False

    def shielding(self, example: Callable) -> Callable:
        """``example`` (one Hypothesis example of a test) that, once the context is lost, raises only
        ``CudaContextLost``: before running (no example runs in a dead context) and instead of whatever
        ordinary exception a cleanup raised after the fault (which Hypothesis would shrink). Before it ends,
        passing or not, the device finishes the work of its calls to the implementation. A sticky error
        that surfaces anywhere in the example (the implementation's call, the oracle, the comparison's
        read-back, that last wait) is contained here; under MPS another process's fault shows wherever
        this one next touches the GPU."""

        @functools.wraps(example)
        def shielded(*args, **kwargs):
            if self.lost is not None:
                raise CudaContextLost(self.lost)
            self.pending = False
            try:
                result = example(*args, **kwargs)
                self._settle()
                return result
            except Exception as error:
                if self.lost is not None:
                    raise CudaContextLost(self.lost) from error
                if is_sticky_cuda_error(error):
                    self.contain(error)
                self._settle_after(error)
                raise

        return shielded

    def _settle_after(self, error: Exception) -> None:
        """``_settle`` for an example that raised ``error``: a fault still pending outranks it."""
        try:
            self._settle()
        except RuntimeError as fault:
            if is_sticky_cuda_error(fault):
                self.contain(fault)
            raise fault from error

    def check_context(self) -> None:
        """After a test: a sticky error still pending on the device is charged to that test (once: a context
        already lost and reported is not reported again as a teardown error)."""
        if self.device.type != "cuda" or self.lost is not None:
            return
        try:
            torch.cuda.synchronize()
        except RuntimeError as error:
            if is_sticky_cuda_error(error):
                self.contain(error)
            raise
