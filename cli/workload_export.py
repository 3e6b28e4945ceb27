"""A case file's minimal case as a FlashInfer-Bench workload (``generation.workloads.write_workload``).

The case file's descriptor is rebuilt by the suite's builder on the CPU (bit for bit the tensors the failing run
built) and written as one workload line with its tensors in a safetensors blob, in a trace set of the benchmark's
own layout. A workload holds values, not memory layouts: the benchmark's loader makes every tensor contiguous,
so a failure that needs a strided q, a combined K/V buffer or int64 indices replays from the case file
(``plain_layout`` false says so).
"""

from __future__ import annotations

import dataclasses
import json
import uuid as uuids
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gqa_decode_fuzz.generation import cases, workloads
from gqa_decode_fuzz.record import casefiles

if TYPE_CHECKING:
    from gqa_decode_fuzz.generation.cases import DecodeCase
    from gqa_decode_fuzz.reference.definitions import Definition

MAX_WORKLOAD_BYTES = 512 * 2**20  # a huge-pool case stays a case file: its pool would be gigabytes of blob
_UUID_NAMESPACE = uuids.UUID("5f0c7a52-3c3e-4b61-9d2a-6a8f2f1e0d34")  # this suite's: the same case, the same uuid
_PLAIN_LAYOUT = {"q_layout": "contiguous", "kv_layout": "separate", "index_layout": "int32"}


def _case_of(payload: dict) -> Any:
    """The case file's descriptor (the case last built), else its claim's case; None where it holds neither."""
    case = casefiles.case_from_fields(payload.get("case_fields"))
    if case is None:
        claim = casefiles.claim_from_fields(payload.get("claim"))
        case = claim[0] if claim else None
    return case


def _pool_bytes(case: DecodeCase, definition: Definition) -> int:
    """Bytes of the K and V pools the builder allocates for ``case``."""
    pages = sum(-(-n // definition.page_size) for n in case.lengths) + case.spare_pages
    if case.page_layout == "given":
        pages = max(case.given_pages, default=-1) + 1 + case.spare_pages
    return 2 * pages * definition.page_elements * 2  # K and V, bf16


def workload_uuid(definition: Definition, fields: dict) -> str:
    """A uuid that names the case: the same descriptor under the same definition always gets the same one."""
    return str(uuids.uuid5(_UUID_NAMESPACE, definition.name + json.dumps(fields, sort_keys=True, default=str)))


def export(case_file: str | Path, root: Path) -> dict[str, Any]:
    """Write the case file's minimal case as a workload under the trace set ``root``; what was written
    (``jsonl``, ``safetensors``, ``uuid``, ``line``, ``plain_layout``), or ``{"omitted": why}``."""
    try:
        payload = casefiles.load_case(case_file)
        definition = casefiles.definition_of(payload)
        case = _case_of(payload)
    except (casefiles.CaseFileError, TypeError, KeyError, ValueError) as error:
        return {"omitted": f"the case file cannot be read: {error}"}
    if case is None:
        return {"omitted": "the case file holds no case descriptor"}
    if _pool_bytes(case, definition) > MAX_WORKLOAD_BYTES:
        return {"omitted": f"its K/V pool is over {MAX_WORKLOAD_BYTES // 2**20} MiB: replay the case file"}
    with cases.using_definition(definition):
        inputs = cases.build(case, "cpu", observe=False)
        uuid = workload_uuid(case.shape, dataclasses.asdict(case))
        written = workloads.write_workload(root, inputs, case.shape, uuid)
    written["plain_layout"] = all(getattr(case, name) == value for name, value in _PLAIN_LAYOUT.items())
    return written
