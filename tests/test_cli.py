"""``gqa-decode-fuzz check TARGET`` (cli/): the verdict a kernel-generation loop calls.

A pass and a fail each cost one nested suite run (the central property alone, a few examples, the CPU
interpreter's fastest profile); the fail's root cause is written as a FlashInfer-Bench workload and read back
through the suite's own workload reader, as the benchmark's loader would take it. Errors are exit 2 with one
line on stderr and no traceback; the ones found before pytest starts are checked in this process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gqa_decode_fuzz.cli import main
from gqa_decode_fuzz.generation import workloads
from gqa_decode_fuzz.generation.cases import DecodeCase, build, using_definition
from gqa_decode_fuzz.record import casefiles
from tests import solution_files
from tests.pytest_runs import ROOT, clean_environment

CENTRAL = "test_output_and_lse_within_error_bound"
FAST = ("--device=cpu", "--profile=ci", "--examples=3", "-k", CENTRAL)


def _check(tmp_path: Path, target: str, *options: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``python -m gqa_decode_fuzz.cli check TARGET`` from the repository root, its folders and JSON in ``tmp_path``."""
    out = tmp_path / "verdict.json"
    command = [sys.executable, "-m", "gqa_decode_fuzz.cli", "check", target, f"--out={tmp_path / 'checks'}",
               f"--json={out}", *options]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=clean_environment())
    return result, json.loads(out.read_text()) if out.is_file() else None


def test_a_correct_implementation_passes(tmp_path):
    result, verdict = _check(tmp_path, "tests/impls/torch_float32.py:run", *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("PASS: PASSED: 1 properties")
    assert verdict["verdict"] == "pass" and verdict["causes"] == [] and verdict["examples"] >= 1
    assert verdict["tier"] == "correct" and verdict["definitions"] == ["gqa_paged_decode_h32_kv4_d128_ps1"]


# The dev profile draws from the seed (ci is derandomized: the same examples whatever the seed).
PLANTED = ("tests/impls/wrong_kv_head.py:run", "--device=cpu", "--profile=dev", "--examples=3", "-k", CENTRAL,
           "--seed=7")


@pytest.fixture(scope="module")
def planted_check(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict | None]:
    """One check of a planted defect, shared by the tests that read its verdict."""
    return _check(tmp_path_factory.mktemp("planted"), *PLANTED)


def _what_the_seed_decides(verdict: dict) -> dict:
    """A verdict without what differs from run to run anyway (seconds, folders, time-stamped file names), with
    what its run report counts of the examples drawn (batch sizes, lengths, layouts, fills, scales)."""
    report = json.loads((Path(verdict["report"]).parent / "report.json").read_text())
    return {"drawn": {name: entry["counts"] for name, entry in report.items() if name != "causes"},
            "verdict": verdict["verdict"], "examples": verdict["examples"], "properties": verdict["properties"],
            "definitions": verdict["definitions"], "tier": verdict["tier"],
            "causes": [(cause["summary"], cause["properties"], cause["workload"]["uuid"], cause["workload"]["line"])
                       for cause in verdict["causes"]]}


def test_a_planted_defect_fails_with_its_case_as_a_workload_the_reader_takes_back(planted_check):
    result, verdict = planted_check
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdict["verdict"] == "fail" and verdict["properties"]["failed"] == 1
    (cause,) = verdict["causes"]
    assert cause["properties"] == [f"properties/test_decode.py::{CENTRAL}"]
    assert cause["replay"].startswith("python -m gqa_decode_fuzz.record.repro ") and cause["case_file"].endswith(".pt")
    assert cause["shrink_cut"] is None  # no --shrink-limit: shrunk to its end
    workload = cause["workload"]
    assert workload["plain_layout"] and f"uuid {workload['uuid']}" in result.stdout

    # The line as written, read back through the suite's reader and the benchmark loader's checks.
    (read,) = workloads.read_workloads(workload["jsonl"])
    assert json.loads(open(workload["jsonl"]).read()) == workload["line"]
    payload = casefiles.load_case(cause["case_file"])
    definition = casefiles.definition_of(payload)
    case = casefiles.case_from_fields(payload["case_fields"])
    with using_definition(definition):
        built = build(case, observe=False)
    given = workloads.workload_tensors(read, definition)
    for name in definition.arguments[:-1]:
        assert torch.equal(given[name], getattr(built, name).contiguous().to(given[name].dtype)), name
    assert given["sm_scale"] == (definition.default_sm_scale if built.sm_scale is None else built.sm_scale)
    # Its pages and lengths are the case's: the reader turns its index tensors into the same call.
    drawn = {name: {"type": "random"} for name in ("q", "k_cache", "v_cache")}
    again = workloads.workload_case(replace(read, inputs={**read.inputs, **drawn}), definition)
    rebuilt = build(again, observe=False)
    assert again.lengths == case.lengths and torch.equal(rebuilt.kv_indices.long(), built.kv_indices.long())
    assert rebuilt.k_cache.shape == built.k_cache.shape


def test_the_same_seed_gives_the_same_verdict(tmp_path, planted_check):
    """Two checks with one seed draw the same examples: the same counts, causes and minimal case (its uuid and
    workload line name its descriptor); another seed is free to differ."""
    first = planted_check[1]
    result, again = _check(tmp_path, *PLANTED)
    assert result.returncode == 1, result.stdout + result.stderr
    assert _what_the_seed_decides(again) == _what_the_seed_decides(first)


def test_the_writer_makes_files_the_safetensors_library_reads(tmp_path):
    """What the benchmark's loader calls (``safetensors.torch.load_file``) reads the blob: a paged definition's
    six tensors in their definition's dtypes, whatever the case's memory layouts."""
    safetensors = pytest.importorskip("safetensors.torch")
    from gqa_decode_fuzz.reference import definitions

    definition = definitions.by_name("gqa_paged_decode_h20_kv4_d128_ps64")
    case = DecodeCase(lengths=(70, 0, 3), spare_pages=2, scale=0.5, definition=definition.name,
                      index_layout="int64_strided", q_layout="fused_qkv")
    built = build(case, observe=False)
    written = workloads.write_workload(tmp_path, built, definition, "u1")
    loaded = safetensors.load_file(written["safetensors"])
    assert {name: str(t.dtype) for name, t in loaded.items()} == {
        "q": "torch.bfloat16", "k_cache": "torch.bfloat16", "v_cache": "torch.bfloat16", "kv_indptr": "torch.int32",
        "kv_indices": "torch.int32", "kv_last_page_len": "torch.int32"}
    assert written["line"]["workload"]["axes"] == {"batch_size": 3, "num_pages": 5, "len_indptr": 4,
                                                  "num_kv_indices": 3}
    assert torch.equal(loaded["q"].view(torch.int16), built.q.contiguous().view(torch.int16))
    assert loaded["kv_last_page_len"].tolist() == built.kv_last_page_len.tolist()


@pytest.mark.parametrize(("target", "options", "message"), [
    ("missing.json", (), "no such file"),
    ("malformed.json", (), "not JSON"),
    ("tests/impls/torch_float32.py:run", ("--definition=gqa_paged_decode_h7_kv1_d128_ps1",), "unknown definition"),
    ("tests/impls/nowhere.py:run", (), "no such file"),
])
def test_what_cannot_be_checked_is_exit_2_with_one_line(tmp_path, monkeypatch, capsys, target, options, message):
    (tmp_path / "malformed.json").write_text('{"name": "x", ')
    monkeypatch.chdir(tmp_path if target.endswith(".json") else ROOT)
    code = main(["check", target, f"--out={tmp_path / 'checks'}", f"--json={tmp_path / 'v.json'}", *options])
    error = capsys.readouterr().err
    assert code == 2 and message in error and len(error.strip().splitlines()) == 1, error
    assert json.loads((tmp_path / "v.json").read_text())["verdict"] == "error"


def test_a_solution_whose_source_does_not_import_is_exit_2_without_a_traceback(tmp_path):
    broken = {"path": "main.py", "content": "import no_such_module_anywhere\n\ndef run(*args):\n    pass\n"}
    solution = solution_files.write(tmp_path, "python_returning", sources=[broken])
    result, verdict = _check(tmp_path, str(solution), *FAST)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no_such_module_anywhere" in result.stderr and "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1 and verdict["verdict"] == "error"


def suite_command(tmp_path, *options: str) -> list[str]:
    """The pytest command ``check`` runs for the wrong-head example with ``options``."""
    from gqa_decode_fuzz.cli import check

    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    args = parser.parse_args(["tests/impls/wrong_kv_head.py:run", *options])
    args.passthrough = []
    return check._pytest_command(args, args.target, tmp_path)


@pytest.mark.parametrize(("options", "stops_at_first"), [((), False), (("--first-failure",), True)])
def test_first_failure_stops_the_suite_at_the_first_failing_property(tmp_path, options, stops_at_first):
    command = suite_command(tmp_path, *options)
    assert ("-x" in command) == stops_at_first
    assert ("--report-picture=off" in command) == stops_at_first  # the fastest verdict draws no summary.png


@pytest.mark.parametrize(("options", "passed"), [((), []), (("--shrink-limit", "20", "--time-budget", "60"),
                                                             ["--shrink-limit=20", "--time-budget=60"])])
def test_shrink_limit_and_time_budget_reach_the_suite(tmp_path, options, passed):
    command = suite_command(tmp_path, *options)
    assert sorted(part for part in command if part.startswith(("--shrink-limit", "--time-budget"))) == passed
