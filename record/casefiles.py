"""Case files: each failing example saved, small, with what it takes to replay it anywhere.

While a test runs, the plugin's ``Recorder`` keeps the last ``DecodeCase`` the test
built (with the tensors built from it) and the implementation calls made since
(Hypothesis re-runs the shrunk example last, so what is recorded when a test fails is
the shrunk example). On failure one file is written under ``failures/``: the case
descriptor, each call's arguments, the ``--impl`` target, the error, and the versions
and device of the run.

A case file never holds a page pool. The builder makes bit-identical tensors from a
descriptor on any device, so an argument that *is* a built tensor is saved as a
reference to it (``{"built": "k_cache"}``) and rebuilt on replay, also after a CUDA
fault has made device memory unreadable. Any other tensor (a slice, a transformed
copy) is saved whole, with its strides and the junk between its elements, while the
file stays under ``MAX_CASE_FILE_BYTES``; beyond that it is described, not saved.
``python -m gqa_decode_fuzz.record.repro FILE`` replays the file on CPU or GPU.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import itertools
import json
import os
import platform
import re
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gqa_decode_fuzz.generation.cases import DecodeCase, active_definition, build
from gqa_decode_fuzz.generation.prefill_cases import PrefillCase, build_prefill
from gqa_decode_fuzz.reference import definitions

if TYPE_CHECKING:
    from gqa_decode_fuzz.generation.case_types import Case

REPLAY_MODULE = "gqa_decode_fuzz.record.repro"
FORMAT = "gqa-decode-case/2"
INDEX_NAME = "index.jsonl"
MAX_CASE_FILE_BYTES = 4 * 2**20
_MAX_CALLS = 4  # calls kept per example: a metamorphic property calls the kernel a few times
_TEXT_LIMIT = 20000

__all__ = [
    "FORMAT", "MAX_CASE_FILE_BYTES", "ArtifactBudget", "CaseFileError", "Recorder", "load_case", "replay_command",
    "claim_from_fields", "restore_call", "runs_index", "save_case", "versions",
]


class CaseFileError(ValueError):
    """A file that is not a case file this version can read; the message says why."""


EAGER_COPY_BYTES = 2**20  # a smaller tensor that is not a built input is copied when called (readable after a fault)
_PLAIN = (type(None), bool, int, float, str)


class _Weak:
    """A weak reference to a large tensor argument: recording never keeps a page pool alive (when a test
    fails, its traceback does, until the case file is written)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.ref = weakref.ref(tensor)


def _span(value: torch.Tensor) -> int:
    """Elements of storage from its start to the view's last element (the gaps included)."""
    if not value.numel():
        return value.storage_offset()
    return value.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride()) if n > 0)


def _geometry(value: torch.Tensor) -> dict:
    return {"size": list(value.shape), "stride": list(value.stride()), "offset": value.storage_offset(),
            "dtype": str(value.dtype).removeprefix("torch.")}


def _copied(value: torch.Tensor) -> dict:
    """The tensor's storage span on the CPU, with what it takes to view it again."""
    flat = value.detach().as_strided((_span(value),), (1,), 0).to("cpu", copy=True)  # one copy, from any device
    return {"tensor": flat, **_geometry(value)}


def _nbytes(value: torch.Tensor) -> int:
    return _span(value) * value.element_size()


@dataclass
class Recorder:
    """What the running test last built and called (one test at a time per process).

    A call's argument is recorded as a reference when it is a tensor the builder made (rebuilt on
    replay), as a CPU copy when it is a small other tensor (taken at the call, so a fault cannot make it
    unreadable), and weakly when it is a large other tensor.
    """

    nodeid: str | None = None
    case: Case | None = None
    built: dict[int, tuple[str, weakref.ref]] = field(default_factory=dict)  # id -> (name, the tensor, weakly)
    built_args: list[Any] = field(default_factory=list)  # the built call's arguments, as recorded
    calls: list[tuple[tuple, dict]] = field(default_factory=list)
    claim: tuple[Any, dict] | None = None  # the case and draws of the claim the example started (``claims``)
    property_claim: str | None = None  # the test's claim, as a reference (``module:name``)

    def begin(self, nodeid: str, claim: str | None = None) -> None:
        """Start recording test item ``nodeid``, whose declared claim is ``claim`` (a reference; None: not declared,
        and then the claim its examples call)."""
        self.nodeid, self.case, self.built, self.built_args, self.calls = nodeid, None, {}, [], []
        self.claim, self.property_claim = None, claim

    def note_claim(self, case: Case, draws: dict, claim: str) -> None:
        self.claim = (case, dict(draws))
        self.property_claim = self.property_claim or claim

    def note_build(self, case: Case, inputs: Any = None) -> None:
        self.case, self.calls = case, []
        fields = inputs._asdict().items() if inputs is not None else ()
        self.built = {id(v): (name, weakref.ref(v)) for name, v in fields if isinstance(v, torch.Tensor)}
        self.built_args = [self._recorded(v) for _, v in fields]

    def note_call(self, args: tuple, kwargs: dict) -> None:
        call = (tuple(self._recorded(a) for a in args), {k: self._recorded(v) for k, v in kwargs.items()})
        self.calls = [*self.calls[-(_MAX_CALLS - 1):], call]

    def _recorded(self, value: Any) -> Any:
        if isinstance(value, _PLAIN):
            return value
        if not isinstance(value, torch.Tensor):
            return {"omitted": f"a {type(value).__name__}, not a tensor"}
        name, ref = self.built.get(id(value), (None, None))
        if ref is not None and ref() is value:
            return {"built": name}
        if value.device.type == "meta":
            return {"omitted": "a tensor on the meta device holds no data", **_geometry(value)}
        if _nbytes(value) <= EAGER_COPY_BYTES:
            try:
                return _copied(value)
            except Exception as error:  # noqa: BLE001 - recording must never break the call it records
                return {"omitted": f"could not be copied: {error}", **_geometry(value)}
        return _Weak(value)

    @property
    def used(self) -> bool:
        return self.case is not None or bool(self.calls)


# ---- portable arguments ---------------------------------------------------------------------


class _Packer:
    """Turns recorded arguments into what the file holds, within a byte allowance."""

    def __init__(self, allowance: int, device_readable: bool) -> None:
        self.allowance = allowance
        self.device_readable = device_readable

    def pack(self, value: Any) -> Any:
        if isinstance(value, _Weak):
            return self._pack_large(value.ref())
        if isinstance(value, dict) and "tensor" in value:
            nbytes = value["tensor"].numel() * value["tensor"].element_size()
            if nbytes > self.allowance:
                return {"omitted": f"over the case file's {MAX_CASE_FILE_BYTES} byte limit",
                        **{k: v for k, v in value.items() if k != "tensor"}}
            self.allowance -= nbytes
        return value

    def _pack_large(self, value: torch.Tensor | None) -> dict:
        if value is None:
            return {"omitted": "the tensor was released before the failure was saved"}
        if not self.device_readable or value.device.type == "meta":
            return {"omitted": "device memory was unreadable after a CUDA fault", **_geometry(value)}
        return self.pack(_copied(value)) if _nbytes(value) <= self.allowance else {
            "omitted": f"{_nbytes(value)} bytes, over the case file's {MAX_CASE_FILE_BYTES} byte limit",
            **_geometry(value)}


def _packed_calls(record: Recorder, device_readable: bool) -> list[dict]:
    packer = _Packer(MAX_CASE_FILE_BYTES, device_readable)
    calls = [{"args": [packer.pack(a) for a in args], "kwargs": {k: packer.pack(v) for k, v in kwargs.items()}}
             for args, kwargs in record.calls]
    if not calls and record.built_args:  # faulted before any call was recorded: replay the built call
        calls = [{"args": [packer.pack(a) for a in record.built_args], "kwargs": {}}]
    return calls


def _restored(value: Any, device: torch.device, built: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "built" in value:
        return getattr(built, value["built"])
    if "tensor" in value:
        return value["tensor"].to(device).as_strided(value["size"], value["stride"], value["offset"])
    if "omitted" in value:
        raise CaseFileError(f"an argument of shape {value.get('size', '?')} was not saved: {value['omitted']}")
    return value


def restore_call(call: dict, device: torch.device | str, case: Case | None = None) -> tuple[tuple, dict]:
    """A recorded call's arguments on ``device``, with their original strides; built arguments are rebuilt
    from ``case`` (a ``DecodeCase`` or ``PrefillCase``)."""
    device = torch.device(device)
    needs_build = any(isinstance(v, dict) and "built" in v for v in [*call["args"], *call["kwargs"].values()])
    if needs_build and case is None:
        raise CaseFileError("the call refers to built inputs but the case file holds no case descriptor")
    built = build_case(case, device) if needs_build else None
    args = tuple(_restored(value, device, built) for value in call["args"])
    kwargs = {name: _restored(value, device, built) for name, value in call["kwargs"].items()}
    return args, kwargs


def _claim_fields(claim: tuple[Any, dict] | None) -> dict | None:
    """The claim's case and draws in plain data (a drawn ``DecodeCase`` as ``{"DecodeCase": fields}``)."""
    if claim is None or not dataclasses.is_dataclass(claim[0]):
        return None
    case, draws = claim

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {"DecodeCase": dataclasses.asdict(value)}
        return value if isinstance(value, _PLAIN) else repr(value)

    return {"case_fields": dataclasses.asdict(case), "draws": {name: plain(v) for name, v in draws.items()}}


def claim_from_fields(fields: dict | None) -> tuple[Any, dict] | None:
    """The case and draws of the claim a case file names (``_claim_fields``), or None."""
    if not fields:
        return None
    draws = {name: case_from_fields(value["DecodeCase"]) if isinstance(value, dict) and "DecodeCase" in value
             else value for name, value in fields.get("draws", {}).items()}
    return case_from_fields(fields["case_fields"]), draws


def case_from_fields(fields: dict | None) -> Any:
    """The ``DecodeCase`` or ``PrefillCase`` (its fields name ``q_lens``) a case file describes (None when the
    example was built otherwise)."""
    if not fields:
        return None
    kind = PrefillCase if "q_lens" in fields else DecodeCase
    return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def build_case(case: Case, device: torch.device | str) -> Any:
    """The inputs of a recorded case, through its op type's builder (unobserved: a replay is not an example)."""
    return (build_prefill if isinstance(case, PrefillCase) else build)(case, device, observe=False)


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


_files_written = itertools.count()


def _file_name(nodeid: str) -> str:
    """A name no other case file of the run has: the test's name cut short, a digest of the whole node id (two
    items whose names differ only past the cut, ``...[shard1of8-mixed]`` and ``...[shard1of8-combined]``, once
    wrote one file in the same second), the time, the process and its count of files."""
    test = re.sub(r"[^A-Za-z0-9_.-]+", "-", nodeid.rpartition("::")[2]).strip("-")[:80] or "test"
    digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    return f"{test}-{digest}-{stamp}-{os.getpid()}-{next(_files_written)}.pt"


@dataclass(frozen=True)
class ArtifactBudget:
    """How many bytes of case files one run may write into the failures directory."""

    max_bytes: int

    def allows(self, directory: Path, run_id: str) -> bool:
        """Whether the run's case files so far leave room for one more (of at most ``MAX_CASE_FILE_BYTES``)."""
        used = sum(Path(entry["path"]).stat().st_size for entry in runs_index(directory, run_id)
                   if Path(entry["path"]).is_file())
        return used + MAX_CASE_FILE_BYTES <= self.max_bytes


def save_case(
    directory: Path, record: Recorder, *, error: str, impl_spec: str, device: torch.device, profile: str,
    run_id: str, hypothesis_output: str = "", device_readable: bool = True, solution: dict | None = None,
) -> Path:
    """Write the example ``record`` holds as a case file; return its path.

    ``device_readable=False`` after a sticky CUDA error: only built arguments are kept then. ``solution``: the
    Solution file under test (``path``, ``sha256``, ``name``), which replay rebuilds the implementation from.
    """
    directory.mkdir(parents=True, exist_ok=True)
    nodeid = record.nodeid or "unknown"
    payload = {
        "format": FORMAT,
        "nodeid": nodeid,
        "error": error[:_TEXT_LIMIT],
        "hypothesis_output": hypothesis_output[:_TEXT_LIMIT],
        "impl": impl_spec,
        "solution": solution,
        "device": str(device),
        "device_name": device_name(device),
        "versions": versions(),
        "profile": profile,
        "run_id": run_id,
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "definition": _definition_of(record.case).to_json(),
        "case_repr": repr(record.case) if record.case is not None else None,
        "case_fields": dataclasses.asdict(record.case) if dataclasses.is_dataclass(record.case) else None,
        "claim": _claim_fields(record.claim),
        "property_claim": record.property_claim,  # its reference: what the root causes import to probe it
        "calls": _packed_calls(record, device_readable),
    }
    path = directory / _file_name(nodeid)
    torch.save(payload, path)
    line = json.dumps({"run_id": run_id, "nodeid": nodeid, "path": str(path),
                       "error": error.splitlines()[0][:200] if error else ""})
    with open(directory / INDEX_NAME, "a", encoding="utf-8") as index:  # one short line: an atomic append
        index.write(line + "\n")
    return path


def _definition_of(case: Case):
    """The definition a recorded example ran under: its case's, else the active one."""
    return case.shape if hasattr(case, "shape") else active_definition()


def definition_of(payload: dict):
    """The definition a case file was found under (registered in this process, so its case rebuilds); files from
    before definitions were recorded ran under the seed's."""
    data = payload.get("definition")
    if data is None:
        return definitions.SEED
    return definitions.register(definitions.from_json(data, origin=f"case file ({data.get('name')})"))


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
    return f"python -m {REPLAY_MODULE} {shown}"
