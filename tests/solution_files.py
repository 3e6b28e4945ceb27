"""FlashInfer-Bench Solution files for the tests, written on demand (``write``), each self-contained.

Each variant's sources are a ``main.py`` entry point of a few lines plus an implementation of the contract
taken whole from ``tests/impls/`` (the plain torch one, or the two-pass Triton panel kernel), which the entry
imports relatively, as the benchmark lays solutions out. The wrong ones break one thing each: the last query
head of ``output`` left unwritten, one batch row written past the end of ``output``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.pytest_runs import ROOT

DEFINITION = "gqa_paged_decode_h32_kv4_d128_ps1"
_IMPLS = {"python": "torch_float32.py", "triton": "panel_triton_two_pass.py"}
_RETURNING = ("def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):\n"
              "    return compute(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)\n")
_DPS = ("def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, output, lse):\n"
        "    result, log_sum_exp = compute(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)\n"
        "    output{rows}.copy_(result{rows})\n"
        "    lse.copy_(log_sum_exp)\n")
_ROW_PAST = ("    rows = output.shape[0] + 1  # as a kernel launched over B + 1 rows\n"
             "    output.as_strided((rows, *output.shape[1:]), output.stride())[-1].zero_()\n")

# name: (language, destination_passing_style as the spec states it (None: not stated), entry body)
VARIANTS = {
    "python_returning": ("python", False, _RETURNING),
    "python_dps": ("python", None, _DPS.format(rows="")),  # the schema's default, told by the signature
    "python_dps_last_head_unwritten": ("python", True, _DPS.format(rows="[:, :-1]")),
    "python_dps_row_past_output": ("python", True, _DPS.format(rows="") + _ROW_PAST),
    "triton_returning": ("triton", False, _RETURNING),
    "triton_dps": ("triton", True, _DPS.format(rows="")),
    "triton_dps_last_head_unwritten": ("triton", True, _DPS.format(rows="[:, :-1]")),
}


def solution(variant: str, **overrides) -> dict:
    """The Solution object of ``variant``; ``overrides`` replace top-level fields (``spec`` merges)."""
    language, dps, body = VARIANTS[variant]
    impl = _IMPLS[language]
    spec = {"language": language, "target_hardware": ["cpu", "cuda"], "entry_point": "main.py::run",
            "dependencies": []}
    if dps is not None:
        spec["destination_passing_style"] = dps
    spec.update(overrides.pop("spec", {}))
    main = f"from .{Path(impl).stem} import run as compute\n\n\n{body}"
    return {"name": variant, "definition": DEFINITION, "author": "gqa-decode-fuzz tests",
            "description": f"test variant {variant}", "spec": spec,
            "sources": [{"path": "main.py", "content": main},
                        {"path": impl, "content": (ROOT / "tests" / "impls" / impl).read_text()}],
            **overrides}


def write(directory: Path, variant: str, **overrides) -> Path:
    """``variant`` written as ``directory/VARIANT.json``; its path."""
    path = directory / f"{variant}.json"
    path.write_text(json.dumps(solution(variant, **overrides), indent=2) + "\n")
    return path
