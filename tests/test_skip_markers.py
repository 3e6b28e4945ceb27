"""The suite skips a test for its markers (``gpu`` on the CPU, ``strict`` under the correct tier, ...), never for a
parameter's id that happens to spell one (``runner/suite_run.py``, ``pytest_collection_modifyitems``)."""

from tests.pytest_runs import run_pytest


def test_a_parameter_id_named_like_a_skip_marker_skips_nothing():
    run = run_pytest("tests/marker_cases.py", "-p", "no:xdist", "-q", "--device=cpu", "--contract=correct",
                     "--run-report=none")
    assert "3 passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
