"""Case files: each failing example saved with what it takes to replay it anywhere.

While a test runs, the plugin records the last ``DecodeCase`` it built and the
implementation calls made since (Hypothesis re-runs the shrunk example last, so
what is recorded when a test fails is the shrunk example). On failure the plugin
writes one file under ``failures/``: the call's tensors (with their strides and
any padding between elements), the case descriptor, the ``--impl`` target, the
error, and the versions and device of the run. ``python -m properties.repro FILE``
replays it on CPU or GPU.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = "gqa-decode-case/1"
INDEX_NAME = "index.jsonl"
_MAX_CALLS = 4  # calls kept per example: a metamorphic property calls the kernel a few times

__all__ = [
    "FORMAT", "CaseFileError", "Recorder", "load_case", "recorder", "replay_command", "restore_call",
    "runs_index", "save_case", "versions",
]


class CaseFileError(ValueError):
    """A file that is not a case file this version can read; the message says why."""


@dataclass
class Recorder:
    """What the running test last built and called (one test at a time per process)."""

    nodeid: str | None = None
    case: Any = None
    calls: list[tuple[tuple, dict]] = field(default_factory=list)

    def begin(self, nodeid: str) -> None:
        self.nodeid, self.case, self.calls = nodeid, None, []

    def note_build(self, case: Any, inputs: Any = None) -> None:
        self.case, self.calls = case, []

    def note_call(self, args: tuple, kwargs: dict) -> None:
        self.calls = [*self.calls[-(_MAX_CALLS - 1):], (args, kwargs)]

    @property
    def used(self) -> bool:
        return self.case is not None or bool(self.calls)


recorder = Recorder()


# ---- portable tensors -----------------------------------------------------------------------


def _portable(value: Any) -> Any:
    """A CPU copy keeping sizes, strides and storage offset (and whatever lies in the gaps)."""
    if not isinstance(value, torch.Tensor):
        return value
    span = value.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride()) if n > 0)
    span = span if value.numel() else value.storage_offset()
    flat = value.as_strided((span,), (1,), 0).detach().cpu().clone()
    return {"tensor": flat, "size": list(value.shape), "stride": list(value.stride()),
            "offset": value.storage_offset()}


def _restored(value: Any, device: torch.device) -> Any:
    if isinstance(value, dict) and "tensor" in value:
        return value["tensor"].to(device).as_strided(value["size"], value["stride"], value["offset"])
    return value


def restore_call(call: dict, device: torch.device | str) -> tuple[tuple, dict]:
    """A recorded call's arguments on ``device``, with their original strides."""
    device = torch.device(device)
    args = tuple(_restored(value, device) for value in call["args"])
    kwargs = {name: _restored(value, device) for name, value in call["kwargs"].items()}
    return args, kwargs


# ---- writing and reading --------------------------------------------------------------------


def versions() -> dict[str, str]:
    """Versions that decide whether a replay can differ: Python, torch, Triton, Hypothesis."""
    import hypothesis

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return {"python": platform.python_version(), "torch": str(torch.__version__), "triton": str(triton_version),
            "hypothesis": str(hypothesis.__version__)}


def device_name(device: torch.device) -> str:
    """'cpu (Triton interpreter)' or the GPU's name; never raises (the CUDA context may be lost)."""
    if device.type != "cuda":
        return f"{device.type} (Triton interpreter)"
    try:
        return torch.cuda.get_device_name(device)
    except Exception:  # noqa: BLE001 - a poisoned context must not stop the case file
        return "cuda (name unavailable)"


def _case_fields(case: Any) -> dict | None:
    return dataclasses.asdict(case) if dataclasses.is_dataclass(case) else None


def _rebuilt_calls(case: Any) -> list[dict]:
    """The case's inputs built on the CPU (for noise-filled pools, the junk differs from the device's)."""
    from .cases import build

    inputs = build(case, "cpu", observe=False)  # not recorded: this is no test's build
    return [{"args": [_portable(value) for value in inputs], "kwargs": {}}]


def _recorded_calls(record: Recorder, device_readable: bool) -> tuple[list[dict], str]:
    if device_readable and record.calls:
        try:
            calls = [{"args": [_portable(a) for a in args], "kwargs": {k: _portable(v) for k, v in kwargs.items()}}
                     for args, kwargs in record.calls]
            return calls, "the implementation's recorded calls"
        except RuntimeError:  # device memory unreadable (a sticky CUDA error)
            pass
    if record.case is not None:
        return _rebuilt_calls(record.case), (
            "rebuilt on cpu from the case (device memory was unreadable): same layout, values drawn on cpu"
        )
    return [], "none recorded"


def _file_name(nodeid: str) -> str:
    test = re.sub(r"[^A-Za-z0-9_.-]+", "-", nodeid.rpartition("::")[2]).strip("-")[:80] or "test"
    stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    return f"{test}-{stamp}-{os.getpid()}.pt"


def save_case(
    directory: Path, *, error: str, impl_spec: str, device: torch.device, profile: str, run_id: str,
    hypothesis_output: str = "", device_readable: bool = True, source: Recorder | None = None,
) -> Path:
    """Write the example ``source`` (default: the running test's recorder) recorded as a case file.

    ``device_readable=False`` after a sticky CUDA error: the inputs are then rebuilt on the CPU.
    """
    record = source or recorder
    directory.mkdir(parents=True, exist_ok=True)
    nodeid = record.nodeid or "unknown"
    calls, source_text = _recorded_calls(record, device_readable)
    payload = {
        "format": FORMAT,
        "nodeid": nodeid,
        "error": error[:20000],
        "hypothesis_output": hypothesis_output[:20000],
        "impl": impl_spec,
        "device": str(device),
        "device_name": device_name(device),
        "versions": versions(),
        "profile": profile,
        "run_id": run_id,
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "case_repr": repr(record.case) if record.case is not None else None,
        "case_fields": _case_fields(record.case),
        "calls": calls,
        "calls_source": source_text,
    }
    path = directory / _file_name(nodeid)
    torch.save(payload, path)
    line = json.dumps({"run_id": run_id, "nodeid": nodeid, "path": str(path), "error": error.splitlines()[0][:200]
                       if error else ""})
    with open(directory / INDEX_NAME, "a", encoding="utf-8") as index:  # one short line: an atomic append
        index.write(line + "\n")
    return path


def load_case(path: Path | str) -> dict:
    """Read a case file (tensors and plain data only: no code is unpickled)."""
    path = Path(path)
    if not path.is_file():
        raise CaseFileError(f"FILE={str(path)!r}: no such file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise CaseFileError(f"FILE={str(path)!r}: not a case file ({error})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CaseFileError(f"FILE={str(path)!r}: not a case file of format {FORMAT!r}")
    return payload


def runs_index(directory: Path, run_id: str) -> list[dict]:
    """Index entries (nodeid, path, error) of the case files one run wrote."""
    index = directory / INDEX_NAME
    if not index.is_file():
        return []
    entries = []
    for line in index.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("run_id") == run_id:
            entries.append(entry)
    return entries


def replay_command(path: Path | str) -> str:
    """The one command that replays a case file (path relative to the working directory when inside it)."""
    path = Path(path)
    try:
        shown = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        shown = path
    return f"python -m properties.repro {shown}"
