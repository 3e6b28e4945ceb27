"""Crash containment: one faulting kernel call gives one failing test, never a poisoned run.

A sticky CUDA error (an illegal address, say) poisons the CUDA context of the
process: every later launch in it fails, and Hypothesis would go on "shrinking"
towards examples that never faulted. So the implementation under test runs
behind a guard that synchronises after each call, recognises a sticky error
by its message, saves the example that faulted as a case file (rebuilt on the
CPU from its descriptor: device memory is unreadable by then) and stops:

- in an xdist worker it exits the process at once; xdist reports that one test
  as crashed and starts a fresh worker (with a fresh CUDA context) for the rest;
- without xdist it raises ``CudaContextLost``, which Hypothesis does not catch
  (it derives from BaseException), and the plugin stops the session after it.

The same path runs on CPU for an implementation that raises CUDA's message, so
it is tested without a GPU (tests/test_crash_containment.py).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable

import torch

from . import failures

CRASH_EXIT_CODE = 86

# Sticky errors: after one of these the context is unusable (CUDA runtime API documentation).
_STICKY = re.compile(
    r"illegal memory access|illegal address|misaligned address|unspecified launch failure|"
    r"device-side assert|illegal instruction|uncorrectable ECC error|hardware stack error|"
    r"CUDA error: (an )?invalid program counter",
    re.IGNORECASE,
)

__all__ = ["CRASH_EXIT_CODE", "CudaContextLost", "guarded", "is_sticky_cuda_error"]


class CudaContextLost(BaseException):  # noqa: N818 - reads as what happened
    """A sticky CUDA error: the process must stop running tests. BaseException so Hypothesis will not shrink."""


def is_sticky_cuda_error(error: BaseException) -> bool:
    """Whether ``error`` is a CUDA error that leaves the process's context unusable."""
    return isinstance(error, (RuntimeError, CudaContextLost)) and bool(_STICKY.search(str(error)))


def contain(error: BaseException, *, save: Callable[[str], object], in_worker: bool) -> None:
    """Save the faulting example, then exit the worker or raise ``CudaContextLost``."""
    message = f"{type(error).__name__}: {error}"
    try:
        path = save(message)
        note = f"case file {path}\nreplay: {failures.replay_command(path)}"
    except Exception as save_error:  # noqa: BLE001 - the exit must happen even if saving fails
        note = f"could not save a case file: {save_error!r}"
    text = f"\ngqa-decode: sticky CUDA error in {failures.recorder.nodeid}: {message}\n{note}\n"
    if in_worker:
        sys.stderr.write(text + "stopping this xdist worker; a fresh one takes over\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
    raise CudaContextLost(f"{message}\n{note}") from error


def guarded(impl: Callable, *, device: torch.device, save: Callable[[str], object], in_worker: bool) -> Callable:
    """``impl`` that records its calls for case files and contains sticky CUDA errors."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    @functools.wraps(impl)
    def guarded_impl(*args, **kwargs):
        failures.recorder.note_call(args, kwargs)
        try:
            result = impl(*args, **kwargs)
            synchronize()  # a fault surfaces here, charged to this call, not to the oracle
        except RuntimeError as error:
            if is_sticky_cuda_error(error):
                contain(error, save=save, in_worker=in_worker)
            raise
        return result

    return guarded_impl


def check_context(device: torch.device, *, save: Callable[[str], object], in_worker: bool) -> None:
    """After a test: a sticky error still pending on the device is charged to that test."""
    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize()
    except RuntimeError as error:
        if is_sticky_cuda_error(error):
            contain(error, save=save, in_worker=in_worker)
        raise
