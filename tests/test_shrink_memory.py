"""A failing example's tensors are released before the next example is built, and running out of memory while
shrinking reports the failure already found.

Hypothesis keeps the exception of every failing example it meets while shrinking, and an exception's
traceback keeps its frames and their tensors: before the suite cleared those frames, each shrink step of a
huge-pool failure kept its pool alive (109 GB on one worker of an H200) until an allocation failed.
"""

import json

from tests.pytest_runs import clean_environment, run_pytest

CASES = "tests/shrink_memory_cases.py"
WRONG_EVERYWHERE = (
    "from tests.impls.torch_float32 import run as correct\n"
    "def run(*args):\n"
    "    output, lse = correct(*args)\n"
    "    return output, lse + 1.0\n"
)


def _run(tmp_path, test: str):
    (tmp_path / "wrong.py").write_text(WRONG_EVERYWHERE)
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none",
                            GQA_SHRINK_MEMORY_OUT=str(tmp_path / "peak.json"))
    return run_pytest(f"{CASES}::{test}", f"--impl={tmp_path / 'wrong.py'}:run", "--device=cpu", "-n", "0",
                      "-p", "no:randomly", env=env)


def test_at_most_one_pool_is_alive_while_a_failure_shrinks(tmp_path):
    result = _run(tmp_path, "test_a_failing_large_pool_shrinks")
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "1 failed" in result.stdout, output
    peak = json.loads((tmp_path / "peak.json").read_text())
    assert peak["builds"] >= 10, peak  # it shrank: many failing examples, each a pool of 20k-40k pages
    assert peak["earlier_pools_alive"] == 0 and peak["earlier_pool_bytes"] == 0, peak


def test_out_of_memory_while_shrinking_reports_the_failure_found_first(tmp_path):
    result = _run(tmp_path, "test_out_of_memory_while_shrinking")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "ERROR (infrastructure)" not in result.stdout and "1 failed" in result.stdout, output
    assert "is the smallest one seen" in result.stdout and "simulated: the suite could not allocate" in output, output
    (case_file,) = (tmp_path / "failures").glob("*.pt")
    assert "python -m gqa_decode_fuzz.record.repro" in result.stdout and case_file.name in result.stdout, output
    # without xdist this process groups the failure too: one cause, the failure's own case file
    assert "gqa-decode: 1 distinct failure" in result.stdout and f"case file: {case_file}" in result.stdout, output


def test_the_case_file_is_the_reported_failures_example(tmp_path):
    """Two failing @examples, then a passing one: the case file holds the first failure Hypothesis reports, not
    the last case built (the recorder's)."""
    from gqa_decode_fuzz.record import casefiles

    (tmp_path / "wrong.py").write_text(WRONG_EVERYWHERE)
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("tests/explicit_examples_cases.py", f"--impl={tmp_path / 'wrong.py'}:run", "--device=cpu",
                        "-n", "0", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "1 failed" in result.stdout, output
    (case_file,) = (tmp_path / "failures").glob("*.pt")
    assert casefiles.load_case(case_file)["case_fields"]["lengths"] == (3,), output
