"""``gqa-decode-fuzz merge-reports``: parts of two hosts merged into one report (record/report_merge.py).

Two nested runs of the planted one-defect kernel (tests/impls/nonpositive_scale_nan.py) stand for two hosts of
a sweep: each runs one of a property's two shards, in a folder of its own, then the folders move (as a CI job's
artifacts do) before they are merged.
"""

import json
import shutil

import pytest

from gqa_decode_fuzz.cli import main
from tests.pytest_runs import clean_environment, run_module, run_pytest

BOUND = "properties/test_decode.py::test_output_and_lse_within_error_bound"
EMPTIES = "properties/test_decode.py::test_empty_sequences_give_zero_output_and_negative_infinite_lse"
CHOSEN = "test_output_and_lse_within_error_bound or test_empty_sequences_give_zero"


def _host(root, tag: str, shard: str) -> None:
    """One host's run: shard ``shard`` of each chosen property, its parts and case files under ``root / tag``."""
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(root / tag / "failures"),
                            GQA_DECODE_REPORT_DIR=str(root / tag / "reports"), GQA_DECODE_HOST_TAG=tag, CI="true")
    result = run_pytest("properties/test_decode.py", "-p", "no:xdist", "--shards=2", "--max-examples=8",
                        "-k", f"{shard} and ({CHOSEN})", "--impl=tests/impls/nonpositive_scale_nan.py:run", env=env)
    assert result.returncode == 1, result.stdout + result.stderr  # the planted defect fails both properties


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """Both hosts' folders, moved away from where they were written."""
    written, moved = tmp_path_factory.mktemp("written"), tmp_path_factory.mktemp("moved")
    _host(written, "host-a", "shard1of2")
    _host(written, "host-b", "shard2of2")
    for tag in ("host-a", "host-b"):
        shutil.move(str(written / tag), str(moved / tag))
    return moved


def test_two_hosts_parts_merge_into_one_report_with_one_set_of_causes(two_hosts, tmp_path):
    parts = sorted(path.name for path in two_hosts.rglob("parts-*.jsonl"))
    assert [name.rsplit("-", 2)[0] for name in parts] == ["parts-host-a", "parts-host-b"], parts  # by host
    out = tmp_path / "merged"
    result = run_module("cli", "merge-reports", str(two_hosts / "host-a"), str(two_hosts / "host-b"),
                        "--out", str(out), env=clean_environment())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED: 2 of 2 properties failed" in result.stdout, result.stdout
    report = json.loads((out / "report.json").read_text())
    for prop in (BOUND, EMPTIES):  # each property once, its two shards (one per host) counted in it
        assert report[prop]["items"] == 2 and report[prop]["verdict"] == "failed", report[prop]
        assert report[prop]["case_file"].startswith(str(two_hosts)), report[prop]  # found where it lies now
    found = report["causes"]["causes"]  # one set: each failing property in one cause, no needs found twice
    named = [prop for cause in found for prop in cause["properties"]]
    assert sorted(named) == sorted({BOUND, EMPTIES}), found
    assert len({tuple(cause["needs"]) for cause in found}) == len(found), found
    assert "not run by merge-reports" in report["causes"]["probes"]["stopped"]
    markdown = (out / "report.md").read_text()
    assert "| host-a/main |" in markdown and "| host-b/main |" in markdown, markdown
    assert (out / "summary.png").is_file()


def test_with_the_implementation_the_merge_probes_every_hosts_failures_into_one_set_of_causes(two_hosts, tmp_path):
    """Probed again here (the CPU standing for the merge job's GPU): the one defect is one cause over both hosts,
    whichever of its properties each host happened to fail."""
    out = tmp_path / "probed"
    assert main(["merge-reports", str(two_hosts), "--out", str(out), "--impl=tests/impls/nonpositive_scale_nan.py:run",
                 "--device=cpu"]) == 0
    saved = json.loads((out / "causes.json").read_text())
    (cause,) = saved["causes"]
    assert set(cause["properties"]) == {BOUND, EMPTIES}, saved
    assert saved["probes"]["used"] > 0 and saved["probes"]["stopped"] is None, saved["probes"]


def _synthetic_host(root, tag: str, prop: str, needs: list[str]) -> None:
    """A host's run folder by hand: one failing line of ``prop`` and its own cause, needing ``needs``."""
    run = root / tag / "reports" / f"run-{tag}"
    run.mkdir(parents=True)
    line = {"nodeid": f"{prop}[shard1of2]", "property": prop, "examples": 3, "failed_examples": 1,
            "outcome": "failed", "tier": "correct", "host": tag, "worker": "main", "error": "AssertionError"}
    (run / f"parts-{tag}-main-7.jsonl").write_text(json.dumps(line) + "\n")
    failure = {"property": prop, "nodeid": line["nodeid"], "case": "DecodeCase(lengths=(1,), scale=0.0)",
               "definition": None, "case_file": None, "replay": None, "error": "AssertionError", "crashed": False}
    cause = {"summary": ", ".join(needs), "needs": needs, "free": [], "note": "", "properties": [prop],
             "representative": failure, "members": []}
    (run / "causes.json").write_text(json.dumps({"causes": [cause], "probes": {}}))


def test_the_hosts_causes_with_the_same_needs_are_one_cause(tmp_path):
    """Two hosts (the same process id: containers) found one cause each with the same needs: one cause."""
    _synthetic_host(tmp_path, "a", BOUND, ["scale <= 0"])
    _synthetic_host(tmp_path, "b", EMPTIES, ["scale <= 0"])
    _synthetic_host(tmp_path, "c", "properties/test_layouts.py::test_strides", ["kv_layout dim_outer"])
    assert main(["merge-reports", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c"),
                 "--out", str(tmp_path / "out")]) == 0
    found = json.loads((tmp_path / "out" / "causes.json").read_text())["causes"]
    assert [cause["properties"] for cause in found] == [[BOUND, EMPTIES], ["properties/test_layouts.py::test_strides"]]
    assert found[0]["members"][0]["joined"] == "the same needs, found by the probes of run run-b"
    assert "2 distinct failures" in (tmp_path / "out" / "report.md").read_text()


def test_a_folder_without_parts_or_with_a_malformed_part_is_refused_in_one_line(tmp_path, capsys):
    assert main(["merge-reports", str(tmp_path / "absent")]) == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["merge-reports", str(tmp_path / "empty")]) == 2
    assert "holds no report parts" in capsys.readouterr().err
    run = tmp_path / "bad" / "reports" / "run1"
    run.mkdir(parents=True)
    (run / "parts-h-main-1.jsonl").write_text('{"nodeid": "x::y", "property": "x::y", "examples": 1}\nnot json\n')
    assert main(["merge-reports", str(tmp_path / "bad"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "parts-h-main-1.jsonl:2: not a JSON line" in error, error
