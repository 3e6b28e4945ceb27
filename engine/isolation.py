"""The implementation under test runs in a child process: it cannot touch the checker, and its faults are failures.

For every ``--impl`` but this project's own kernel (``--isolation``) the checking process never imports the
implementation, which could otherwise rewrite the oracle, the comparison, Hypothesis or torch: each call goes over
one pipe to a child process (``isolation_child``), and the parent (``isolated_impl``) trusts nothing it sends back.
A child's death, hang, late write
or sanitizer report raises one of this module's errors, ordinary exceptions that Hypothesis shrinks like a wrong
answer. Here: the modes, those errors, the call deadline, and the header's and report's line (docs/targets.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MODES = ("auto", "on", "off")
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
CALL_TIMEOUT_ENV = "GQA_DECODE_CALL_TIMEOUT"
SANITIZER_ENV = "GQA_DECODE_SANITIZER"  # the compute-sanitizer executable (default: the one on PATH)
BASE_TIMEOUT_S = 30.0  # a call of any size: a cold Triton compile, a busy host
PER_TOKEN_S = 2e-3  # per KV token of the call: the CPU interpreter at its slowest, generously
SANITIZE_EVERY = 8  # one example in this many runs in the sanitized child (``isolated_impl.SanitizerShare``)

__all__ = ["CALL_TIMEOUT_ENV", "MODES", "SANITIZER_TOOLS", "ImplementationCrashed", "ImplementationFailed",
           "ImplementationHung", "ResultChangedAfterReturn", "SanitizerError", "call_deadline", "isolated", "load",
           "mode_line", "save"]


class ImplementationFailed(Exception):  # noqa: N818 - each subclass reads as what happened
    """The isolated implementation failed a call in a way no return value or exception of its own tells. An
    ordinary ``Exception`` (not ``RuntimeError``, which the in-process containment inspects): Hypothesis shrinks it."""


class ImplementationCrashed(ImplementationFailed):
    """The child died during the call (a signal, ``os._exit``, a sticky CUDA error); the message has its exit
    status and the last lines it wrote."""


class ImplementationHung(ImplementationFailed):
    """The child did not answer within the call's deadline and was killed."""


class SanitizerError(ImplementationFailed):
    """compute-sanitizer reported an error during the call; the message is its report."""


class ResultChangedAfterReturn(ImplementationFailed):
    """The implementation wrote into a tensor it had returned after it answered."""


def isolated(mode: str, spec: str, own_kernel: str) -> bool:
    """Whether ``--isolation=mode`` runs ``--impl=spec`` in a child: ``auto`` isolates all but ``own_kernel``."""
    if mode not in MODES:
        raise ValueError(f"--isolation={mode!r}: expected one of {', '.join(MODES)}")
    return mode == "on" or (mode == "auto" and spec != own_kernel)


def mode_line(isolation: bool, mode: str, sanitize: str | None = None) -> str:
    """The header's and run report's words for how the implementation ran."""
    if isolation:
        extra = f"; a share of examples under compute-sanitizer --tool {sanitize}" if sanitize else ""
        return f"isolation on: the implementation runs in a child process of each pytest process{extra}"
    if mode == "off":
        return ("isolation off (WARNING: the implementation runs inside the checking process and can rewrite the "
                "oracle, the bound or the comparison; trust it only if you wrote it)")
    return "isolation off: this project's own kernel runs in-process (--isolation=on to isolate it)"


def call_deadline(args: tuple, kwargs: dict) -> float:
    """Seconds a call may take: ``GQA_DECODE_CALL_TIMEOUT`` (default 30) plus 2 ms per KV token it reads."""
    base = float(os.environ.get(CALL_TIMEOUT_ENV) or BASE_TIMEOUT_S)
    indices = kwargs.get("kv_indices", args[4] if len(args) > 4 else None)
    cache = kwargs.get("k_cache", args[1] if len(args) > 1 else None)
    pages = indices.numel() if hasattr(indices, "numel") else 0  # a tensor (duck-typed: no torch import here)
    shape = getattr(cache, "shape", ())
    page_size = shape[1] if len(shape) >= 2 else 1
    return base + PER_TOKEN_S * pages * page_size




# ---- the run report's line ----------------------------------------------------------------------

FILE_NAME = "isolation.json"


def save(directory: Path, line: str) -> Path:
    """Write how the implementation ran (``mode_line``) into a run's report folder."""
    path = directory / FILE_NAME
    path.write_text(json.dumps({"isolation": line}), encoding="utf-8")
    return path


def load(directory: Path) -> str | None:
    """A report folder's isolation line; None for a run that wrote none."""
    path = directory / FILE_NAME
    return json.loads(path.read_text(encoding="utf-8"))["isolation"] if path.is_file() else None
