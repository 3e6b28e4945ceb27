"""FlashInfer-Bench workloads (the ``flashinfer-trace`` JSONL format) as cases of the suite.

One line of a workload file is a trace object: ``{"definition": NAME, "workload": {"uuid", "axes", "inputs"},
"solution": null, "evaluation": null}``. ``axes`` gives the variable axes (``batch_size``, ``len_indptr``,
``num_kv_indices``, ``num_pages``); ``inputs`` says how each input is made: ``{"type": "random"}`` (drawn),
``{"type": "scalar", "value": x}``, or ``{"type": "safetensors", "path": P, "tensor_key": K}`` (a blob; ``P`` is
relative to the trace set's root, the folder that holds ``workloads/`` and ``blob/``: it is looked for beside the
workload file and in each folder above it).

``workload_case`` maps one workload to a ``DecodeCase``: the lengths from its ``kv_indptr`` (and, where pages
hold several tokens, ``kv_last_page_len``), its page ids as
given (``page_layout="given"``), a pool of its ``num_pages`` (at least the largest page id + 1), its
``sm_scale``; q, K and V are the builder's (the benchmark draws them at random too; the builder's unreferenced
pages hold NaN, which a correct kernel never reads). What the suite cannot build is refused, naming the input:
q, K or V from a blob, an index tensor drawn at random (not a valid call), an input type other than these three.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .cases import DecodeCase

if TYPE_CHECKING:
    from gqa_decode_fuzz.reference.definitions import Definition

__all__ = ["Workload", "WorkloadError", "read_safetensors", "read_workloads", "workload_case", "workload_tensors",
           "write_safetensors", "write_workload"]

_DRAWN = ("q", "k_cache", "v_cache")  # the builder's own
_INDICES = ("kv_indptr", "kv_indices", "kv_last_page_len")
_SAFETENSORS_DTYPES = {"I32": torch.int32, "I64": torch.int64, "BF16": torch.bfloat16, "F32": torch.float32}
_DEFINITION_DTYPES = {"int32": torch.int32, "int64": torch.int64, "bfloat16": torch.bfloat16, "float32": torch.float32}


class WorkloadError(ValueError):
    """A workload file or line the suite cannot turn into a case; the message names the line and the input."""


@dataclass(frozen=True)
class Workload:
    """One workload line: its definition's name, uuid, axes and input descriptions, and where it was read."""

    definition: str
    uuid: str
    axes: dict[str, int]
    inputs: dict[str, dict[str, Any]]
    origin: str  # "FILE:LINE"
    root: Path  # the workload file's folder: blob paths are looked for from here upward

    def fail(self, what: str) -> WorkloadError:
        return WorkloadError(f"--workloads {self.origin} (uuid {self.uuid}): {what}")


def read_workloads(path: Path | str) -> list[Workload]:
    """Every workload line of a JSONL file, checked for form (blobs are read by ``workload_case``)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise WorkloadError(f"--workloads={str(path)!r}: cannot read it ({error})") from None
    workloads = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            workloads.append(_workload(line, f"{path}:{number}", path.resolve().parent))
    if not workloads:
        raise WorkloadError(f"--workloads={str(path)!r}: no workload lines")
    return workloads


def _workload(line: str, origin: str, root: Path) -> Workload:
    try:
        trace = json.loads(line)
    except json.JSONDecodeError as error:
        raise WorkloadError(f"--workloads {origin}: not JSON ({error})") from None
    body = trace.get("workload") if isinstance(trace, dict) else None
    if not isinstance(body, dict) or not isinstance(trace.get("definition"), str):
        raise WorkloadError(f"--workloads {origin}: expected a trace object with 'definition' and 'workload'")
    axes, inputs = body.get("axes"), body.get("inputs")
    if not isinstance(axes, dict) or not all(isinstance(v, int) and v >= 0 for v in axes.values()):
        raise WorkloadError(f"--workloads {origin}: 'axes' must map axis names to non-negative integers")
    if not isinstance(inputs, dict) or not all(isinstance(v, dict) for v in inputs.values()):
        raise WorkloadError(f"--workloads {origin}: 'inputs' must map input names to {{'type': ...}}")
    return Workload(trace["definition"], str(body.get("uuid", "?")), dict(axes), dict(inputs), origin, root)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (8-byte little-endian header size, a JSON header of
    ``{name: {dtype, shape, data_offsets}}``, then the bytes); dtypes other than ``_SAFETENSORS_DTYPES`` are
    refused."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise WorkloadError(f"{path}: tensor {name!r} is {entry.get('dtype')}; only "
                                f"{', '.join(_SAFETENSORS_DTYPES)} are read")
        begin, end = entry["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if end > begin else torch.zeros(0, dtype=dtype)
        tensors[name] = flat.view(entry["shape"])
    return tensors


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` (of ``_SAFETENSORS_DTYPES``) as one safetensors file, in the layout ``read_safetensors``
    reads: each tensor's bytes contiguous, little-endian, in the given order; the header padded to 8 bytes."""
    names = {dtype: name for name, dtype in _SAFETENSORS_DTYPES.items()}
    header, chunks, offset = {}, [], 0
    for name, tensor in tensors.items():
        if tensor.dtype not in names:
            raise WorkloadError(f"{path}: tensor {name!r} is {tensor.dtype}; only {', '.join(names)} are written")
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))


def _blob(workload: Workload, name: str, spec: dict) -> torch.Tensor:
    tensor = _blob_tensor(workload, name, spec)
    if tensor.dtype not in (torch.int32, torch.int64):
        raise workload.fail(f"input {name!r}: an index tensor must be I32 or I64, not {tensor.dtype}")
    return tensor.flatten().long()


def _blob_tensor(workload: Workload, name: str, spec: dict) -> torch.Tensor:
    """The tensor a safetensors input names, its blob looked for from the workload file's folder upward."""
    relative = spec.get("path")
    if not isinstance(relative, str) or not isinstance(spec.get("tensor_key"), str):
        raise workload.fail(f"input {name!r}: a safetensors input needs 'path' and 'tensor_key'")
    for folder in (workload.root, *workload.root.parents):
        path = (folder / relative).resolve()
        if path.is_file():
            break
    else:
        raise workload.fail(f"input {name!r}: blob {relative!r} not found beside the workload file or above it")
    tensors = read_safetensors(path)
    if spec["tensor_key"] not in tensors:
        raise workload.fail(f"input {name!r}: {path} has no tensor {spec['tensor_key']!r}")
    return tensors[spec["tensor_key"]]


def _index(workload: Workload, name: str) -> torch.Tensor | None:
    spec = workload.inputs.get(name)
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "safetensors":
        return _blob(workload, name, spec)
    raise workload.fail(f"input {name!r} of type {kind!r} is not supported: the suite takes index tensors as "
                        "given (safetensors); a random one is not a valid call")


def _scale(workload: Workload) -> float | None:
    spec = workload.inputs.get("sm_scale")
    if spec is None:
        return None
    if spec.get("type") != "scalar" or isinstance(spec.get("value"), bool) or \
            not isinstance(spec.get("value"), (int, float)):
        raise workload.fail(f"input 'sm_scale' {spec!r} is not supported: expected {{'type': 'scalar', 'value': x}}")
    return float(spec["value"])


def _tokens(workload: Workload, definition: Definition, pages: list[int]) -> list[int]:
    """Tokens per sequence: its pages, the last one holding ``kv_last_page_len`` tokens where pages hold several."""
    last = _index(workload, "kv_last_page_len")
    if not definition.paged:
        if last is not None:
            raise workload.fail(f"kv_last_page_len is not an input of {definition.name} (pages of one token)")
        return pages
    if last is None or last.numel() != len(pages):
        raise workload.fail(f"{definition.name} needs kv_last_page_len, one per sequence (safetensors)")
    size = definition.page_size
    if any(not (1 <= n <= size) for n, p in zip(last.tolist(), pages) if p):
        raise workload.fail(f"kv_last_page_len must lie in 1..{size} for a sequence with pages")
    return [(p - 1) * size + n if p else 0 for p, n in zip(pages, last.tolist())]


def workload_case(workload: Workload, definition: Definition) -> DecodeCase:
    """The ``DecodeCase`` of one workload of ``definition`` (see the module docstring)."""
    if workload.definition != definition.name:
        raise workload.fail(f"it is a workload of {workload.definition!r}, not of {definition.name!r}")
    for name, spec in workload.inputs.items():
        if name in _DRAWN and spec.get("type") != "random":
            raise workload.fail(f"input {name!r} of type {spec.get('type')!r} is not supported: the suite draws "
                                "q, K and V itself (only type 'random')")
        if name not in (*_DRAWN, *_INDICES, "sm_scale"):
            raise workload.fail(f"input {name!r} is not an input of {definition.name}")
    indptr, indices = _index(workload, "kv_indptr"), _index(workload, "kv_indices")
    if indptr is None or indices is None:
        raise workload.fail("kv_indptr and kv_indices must be given (safetensors)")
    if indptr.numel() < 1 or int(indptr[0]) != 0 or bool((indptr[1:] < indptr[:-1]).any()) \
            or int(indptr[-1]) != indices.numel():
        raise workload.fail("kv_indptr must start at 0, never decrease and end at len(kv_indices)")
    pages_per_sequence = (indptr[1:] - indptr[:-1]).tolist()
    lengths = tuple(_tokens(workload, definition, pages_per_sequence))
    pages = tuple(indices.tolist())
    highest = max(pages, default=-1) + 1
    spare = max(workload.axes.get("num_pages", highest) - highest, 0)
    seed = int.from_bytes(hashlib.sha256(workload.uuid.encode()).digest()[:4], "little")
    return DecodeCase(lengths=lengths, page_layout="given", given_pages=pages, spare_pages=spare,
                      scale=_scale(workload), seed=seed, definition=definition.name)


# ---- the benchmark's view, and writing ------------------------------------------------------


def _input_shapes(definition: Definition) -> dict[str, dict]:
    """Each input's axis names (None for a scalar) and dtype, as the definition file states them."""
    return definition.to_json()["inputs"]


def workload_tensors(workload: Workload, definition: Definition) -> dict[str, Any]:
    """Every input of a workload as the benchmark's loader takes it: a safetensors input's tensor checked to have
    the shape its definition gives at the workload's axes and the definition's dtype, a scalar's value; a random
    input is absent."""
    if workload.definition != definition.name:
        raise workload.fail(f"it is a workload of {workload.definition!r}, not of {definition.name!r}")
    constants = {name: axis["value"] for name, axis in definition.to_json()["axes"].items() if "value" in axis}
    values: dict[str, Any] = {}
    for name, declared in _input_shapes(definition).items():
        spec = workload.inputs.get(name, {"type": "random"})
        if spec.get("type") == "scalar":
            values[name] = spec.get("value")
        elif spec.get("type") == "safetensors":
            tensor = _blob_tensor(workload, name, spec)
            try:
                expected = [constants[axis] if axis in constants else workload.axes[axis] for axis in declared["shape"]]
            except KeyError as missing:
                raise workload.fail(f"input {name!r}: axis {missing} is not among the workload's axes") from None
            if list(tensor.shape) != expected or tensor.dtype != _DEFINITION_DTYPES[declared["dtype"]]:
                raise workload.fail(f"input {name!r} is {list(tensor.shape)} {tensor.dtype}; the definition "
                                    f"wants {expected} {declared['dtype']}")
            values[name] = tensor
    return values


def write_workload(root: Path, inputs: Any, definition: Definition, uuid: str) -> dict[str, Any]:
    """One call (``cases.DecodeInputs``) as a FlashInfer-Bench workload in the trace set whose root is ``root``:
    its tensors, contiguous and in the definition's dtypes, in ``blob/workloads/gqa_paged/<definition>/
    <definition>_<uuid>.safetensors``, and its line appended to ``workloads/gqa_paged/<definition>.jsonl`` (the
    benchmark's own layout; blob paths relative to the root). ``sm_scale`` is a scalar (the definition's default
    where the call left it out). Returns the line and both paths."""
    shapes = _input_shapes(definition)
    variable = {name for name, axis in definition.to_json()["axes"].items() if axis.get("type") == "var"}
    tensors, axes = {}, {}
    for name in definition.arguments:
        if name == "sm_scale":
            continue
        tensor = getattr(inputs, name).detach().to("cpu").contiguous().to(_DEFINITION_DTYPES[shapes[name]["dtype"]])
        tensors[name] = tensor
        axes.update((axis, int(size)) for axis, size in zip(shapes[name]["shape"], tensor.shape) if axis in variable)
    blob = f"blob/workloads/gqa_paged/{definition.name}/{definition.name}_{uuid}.safetensors"
    write_safetensors(root / blob, tensors)
    scale = definition.default_sm_scale if inputs.sm_scale is None else float(inputs.sm_scale)
    described = {name: {"type": "safetensors", "path": blob, "tensor_key": name} for name in tensors}
    line = {"definition": definition.name,
            "workload": {"uuid": uuid, "axes": axes, "inputs": {**described, "sm_scale": {"type": "scalar",
                                                                                         "value": scale}}},
            "solution": None, "evaluation": None}
    jsonl = root / "workloads" / "gqa_paged" / f"{definition.name}.jsonl"
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    with open(jsonl, "a", encoding="utf-8") as file:
        file.write(json.dumps(line) + "\n")
    return {"jsonl": str(jsonl), "safetensors": str(root / blob), "uuid": uuid, "line": line}
