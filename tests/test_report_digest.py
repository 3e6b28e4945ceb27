"""benchmarks/report_digest.py: the digest a GPU call or the production workflow brings back of each run report."""

import importlib.util
import json

from tests.pytest_runs import ROOT

_SPEC = importlib.util.spec_from_file_location("report_digest", ROOT / "benchmarks" / "report_digest.py")
report_digest = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report_digest)

PS1, PS64 = "gqa_paged_decode_h32_kv4_d128_ps1", "gqa_paged_decode_h32_kv4_d128_ps64"


def _entry(verdict: str, examples: int, unstarted: int = 0, seconds: float = 0.0) -> dict:
    return {"verdict": verdict, "examples": examples, "items": 12, "unstarted_shards": unstarted, "seconds": seconds}


def test_the_digest_counts_per_definition_and_ends_with_a_findings_row(tmp_path):
    report = {
        f"properties/test_decode.py::test_central[{PS1}]": _entry("passed", 300, seconds=10.0),
        f"properties/test_decode.py::test_scales[{PS1}]": _entry("failed", 5, seconds=30.0),
        f"properties/test_decode.py::test_central[{PS64}]": _entry("passed", 280, seconds=10.0),
        f"properties/test_decode.py::test_scales[{PS64}]": _entry("skipped", 0, unstarted=12),
        "causes": {"causes": [{"summary": "scale <= 0, any length",
                               "properties": [f"properties/test_decode.py::test_scales[{PS1}]",
                                              f"properties/test_decode.py::test_central[{PS64}]",
                                              f"properties/test_decode.py::test_other[{PS64}]"],
                               "representative": {"case": "DecodeCase(lengths=(1,), scale=0.0)", "definition": PS1,
                                                  "error": "got nan", "replay": "python -m ..."},
                               "members": [{"joined": "the representative's case fails its check too"},
                                           {"joined": "the representative's case fails its check too"}]}]},
    }
    (tmp_path / "report.json").write_text(json.dumps(report), encoding="utf-8")
    (tmp_path / "report.md").write_text("# Run\n\n**FAILED: 1 of 4 properties failed**\n", encoding="utf-8")
    lines = report_digest.digest(tmp_path)
    assert "**FAILED: 1 of 4 properties failed**" in lines
    assert "1. scale <= 0, any length (3 properties)" in lines
    assert f"   definitions: {PS64} (2); {PS1} (1)" in lines
    assert "   joined: the representative's case fails its check too (2)" in lines
    assert f"| {PS1} | 1 | 300 | 0 | scales failed |" in lines
    assert f"| {PS64} | 1 | 280 | 1 |  |" in lines
    assert lines[-4] == ("In all: 2 definitions, 2 properties passed over 580 examples (280 to 300 per definition); "
                         "properties left unstarted by the time budget: 1; not passed: 1; root causes: 1.")
    assert lines[-2] == "Items' time: 50 s over the workers, 30 s (60%) in the properties that did not pass."


def test_the_findings_row_says_how_many_causes_are_failures_left_unprobed(tmp_path):
    unprobed = {"summary": "x", "properties": ["a"], "note": "not probed: budget spent (40 probes, 30.1 s)",
                "unprobed": True, "representative": {"case": "DecodeCase(lengths=(3,))", "definition": PS1}}
    report = {f"properties/test_decode.py::test_scales[{PS1}]": _entry("failed", 5),
              "causes": {"causes": [{**unprobed, "note": None, "unprobed": False}, unprobed, unprobed]}}
    (tmp_path / "report.json").write_text(json.dumps(report), encoding="utf-8")
    (tmp_path / "report.md").write_text("**FAILED: 1 of 1 properties failed**\n", encoding="utf-8")
    assert report_digest.digest(tmp_path)[-4].endswith(
        "root causes: 3, 2 of them failures left unprobed, one entry per property.")
