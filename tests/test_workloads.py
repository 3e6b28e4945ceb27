"""``--workloads``: FlashInfer-Bench workload lines (flashinfer-trace JSONL) become explicit examples of the
central property, with their lengths, page ids, pool size and sm_scale as given."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gqa_decode_fuzz.generation.cases import build
from gqa_decode_fuzz.generation.workloads import (
    WorkloadError,
    read_safetensors,
    read_workloads,
    workload_case,
)
from gqa_decode_fuzz.reference import definitions
from tests.pytest_runs import clean_environment, run_pytest

INDPTR = [0, 3, 3, 7]  # three sequences, the middle one empty
INDICES = [40, 2, 17, 2, 33, 9, 21]  # page 2 shared, as prefix caching shares pages
BLOB = "blob/workloads/gqa_paged/example/example_a.safetensors"


def _write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    header, body = {}, b""
    for name, values in tensors.items():
        data = struct.pack(f"<{len(values)}i", *values)
        header[name] = {"dtype": "I32", "shape": [len(values)], "data_offsets": [len(body), len(body) + len(data)]}
        body += data
    encoded = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + body)


def _trace_set(root: Path, **inputs) -> Path:
    """A trace set as the benchmark lays it out: workloads/<op>/<def>.jsonl, blobs under blob/."""
    _write_safetensors(root / BLOB, {"kv_indptr": INDPTR, "kv_indices": INDICES})
    blob = lambda key: {"type": "safetensors", "path": f"./{BLOB}", "tensor_key": key}  # noqa: E731
    described = {"q": {"type": "random"}, "k_cache": {"type": "random"}, "v_cache": {"type": "random"},
                 "kv_indptr": blob("kv_indptr"), "kv_indices": blob("kv_indices"),
                 "sm_scale": {"type": "scalar", "value": 0.0625}, **inputs}
    line = {"definition": definitions.SEED_NAME, "solution": None, "evaluation": None,
            "workload": {"uuid": "a1b2", "axes": {"len_indptr": 4, "num_kv_indices": 7, "num_pages": 64},
                         "inputs": {k: v for k, v in described.items() if v is not None}}}
    path = root / "workloads" / "gqa_paged" / f"{definitions.SEED_NAME}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(line) + "\n")
    return path


def test_a_workload_becomes_the_case_it_describes(tmp_path):
    path = _trace_set(tmp_path)
    assert read_safetensors(tmp_path / BLOB)["kv_indices"].tolist() == INDICES
    case = workload_case(read_workloads(path)[0], definitions.SEED)
    assert case.lengths == (3, 0, 4) and case.scale == 0.0625 and case.page_layout == "given"
    inputs = build(case, observe=False)
    assert inputs.kv_indices.tolist() == INDICES and inputs.kv_indptr.tolist() == INDPTR
    assert inputs.k_cache.shape[0] == 64 and inputs.sm_scale == 0.0625  # the pool of num_pages
    assert "given_pages" not in repr(case)


@pytest.mark.parametrize(("inputs", "message"), [
    ({"q": {"type": "safetensors", "path": BLOB, "tensor_key": "q"}}, "input 'q' of type 'safetensors'"),
    ({"kv_indptr": {"type": "random"}}, "input 'kv_indptr' of type 'random' is not supported"),
    ({"kv_indices": {"type": "custom"}}, "input 'kv_indices' of type 'custom' is not supported"),
    ({"kv_indices": {"type": "safetensors", "path": "blob/missing.safetensors", "tensor_key": "x"}}, "not found"),
    ({"sm_scale": {"type": "random"}}, "input 'sm_scale'"),
    ({"router_logits": {"type": "random"}}, "not an input of"),
])
def test_what_the_suite_cannot_build_is_refused_naming_the_input(tmp_path, inputs, message):
    workload = read_workloads(_trace_set(tmp_path, **inputs))[0]
    with pytest.raises(WorkloadError, match=message):
        workload_case(workload, definitions.SEED)


def test_a_workload_of_another_definition_is_refused(tmp_path):
    workload = read_workloads(_trace_set(tmp_path))[0]
    with pytest.raises(WorkloadError, match="it is a workload of 'gqa_paged_decode_h32_kv4_d128_ps1', not of"):
        workload_case(workload, definitions.by_name("gqa_paged_decode_h32_kv8_d128_ps1"))


def test_the_central_property_runs_each_workload(tmp_path):
    seen = tmp_path / "seen.txt"
    (tmp_path / "logging.py").write_text(
        "from tests.impls.torch_float32 import run as correct\n"
        "def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):\n"
        f"    with open({str(seen)!r}, 'a') as log:\n"
        "        log.write(f'{kv_indices.tolist()} {k_cache.shape[0]} {sm_scale}\\n')\n"
        "    return correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)\n"
    )
    env = clean_environment(GQA_DECODE_REPORT_DIR="none", GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"))
    result = run_pytest("properties/test_decode.py::test_output_and_lse_within_error_bound", "-n0",
                        "--hypothesis-profile=ci", "--max-examples=2", f"--impl={tmp_path / 'logging.py'}:run",
                        f"--workloads={_trace_set(tmp_path)}", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert seen.read_text().splitlines()[0] == f"{INDICES} 64 0.0625"  # the explicit example first


def test_a_workload_the_suite_cannot_build_is_a_usage_error(tmp_path):
    path = _trace_set(tmp_path, kv_indptr={"type": "random"})
    result = run_pytest("properties/test_decode.py", "-n0", f"--workloads={path}",
                        env=clean_environment(GQA_DECODE_REPORT_DIR="none"))
    assert result.returncode == 4 and "input 'kv_indptr' of type 'random' is not supported" in result.stderr


def test_a_paged_workload_counts_tokens_with_the_last_page_length(tmp_path):
    paged = definitions.by_name("gqa_paged_decode_h32_kv4_d128_ps64")
    _write_safetensors(tmp_path / BLOB, {"kv_indptr": [0, 2, 2, 3], "kv_indices": [5, 1, 9],
                                         "kv_last_page_len": [10, 0, 64]})
    blob = lambda key: {"type": "safetensors", "path": BLOB, "tensor_key": key}  # noqa: E731
    line = {"definition": paged.name, "workload": {"uuid": "p1", "axes": {"num_pages": 12}, "inputs": {
        "q": {"type": "random"}, "kv_indptr": blob("kv_indptr"), "kv_indices": blob("kv_indices"),
        "kv_last_page_len": blob("kv_last_page_len"), "sm_scale": {"type": "scalar", "value": 0.1}}}}
    (tmp_path / "paged.jsonl").write_text(json.dumps(line) + "\n")
    case = workload_case(read_workloads(tmp_path / "paged.jsonl")[0], paged)
    assert case.lengths == (74, 0, 64) and case.given_pages == (5, 1, 9) and case.definition == paged.name
    inputs = build(case, observe=False)
    assert inputs.kv_indices.tolist() == [5, 1, 9] and inputs.kv_last_page_len.tolist() == [10, 0, 64]
    assert inputs.k_cache.shape[:2] == (12, 64)
