"""The implementation under test runs in a child process: it cannot touch the checker, and its faults are failures.

An implementation imported into the process that checks it can rewrite the oracle, the bound, the comparison,
Hypothesis or torch. So, for every ``--impl`` but this project's own kernel (``--isolation``), the checking
process never imports it: ``isolated_impl.IsolatedImpl`` is the callable the properties call, and each call
goes over one pipe to a child process (``isolation_child``; torch.multiprocessing's spawn start, one child per
pytest process, started once and replaced when it dies) that imports the target, calls it, waits for the device and
answers. The parent trusts nothing from it:

- what it unpickles is restricted to torch's tensor-sharing reductions and plain data (``_Unpickler``): a
  pickle can run any code, an exception object would import the implementation's module;
- every result tensor is copied on receipt into memory the parent owns, and the child's own copy is compared
  with it at the next call and at the example's end, so a write after the answer (a thread or side stream
  left running) fails the example (``ResultChangedAfterReturn``) instead of reaching the check unseen;
- CPU inputs go to the child as copies in shared memory, with the child's writes copied back once it has
  answered (the properties' own snapshots then see what the call did, and nothing it does later); CUDA inputs
  are shared without copies (CUDA IPC), the device synchronised before the answer; the child lets go of them
  before it answers, and for a child that died holding them the parent releases them itself (torch would keep
  them allocated for good: ``isolated_impl._release_shares``);
- an exception the implementation raised comes back as text and is raised again as its nearest built-in class
  (``ValueError``, ``TypeError``...) with the original class named in the message.

A child that dies (segfault, ``os._exit``, a sticky CUDA error, which leaves its context unusable) fails the
call with ``ImplementationCrashed``; one that does not answer within the call's deadline (``call_deadline``)
is killed and fails it with ``ImplementationHung``. Both are ordinary exceptions: Hypothesis shrinks them like
a wrong answer and the case file records them; the next call starts a fresh child. Under the run's MPS server a
CUDA child starts outside it where the GPU allows (``isolated_impl._outside_mps``): inside, its fault would reach
its parent and every other worker on the GPU.

``--sanitize=TOOL`` runs a share of the examples (``SanitizerShare``) in a second child started under NVIDIA's
``compute-sanitizer --tool TOOL`` with torch's caching allocator off (inside a cached segment a read past a
tensor is invisible to it) and ``--destroy-on-device-error kernel`` (a precise error ends the faulting kernel,
not the CUDA context); any error it logs during a call fails that call with ``SanitizerError`` and the report. A
child that still answered lives on, so a shrink does not pay a sanitized start-up per failing example.
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
