"""adapters/: production kernels under this contract, in the interpreter (CI installs ``sglang --no-deps``).

SGLang's decode kernel takes seconds per example in the interpreter, so CI runs a few
examples of the central properties; the H200 run in docs/findings.md runs them all.
"""

import importlib.util

import pytest

from tests.pytest_runs import clean_environment, run_pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                                reason="the sglang wheel is not installed (pip install --no-deps sglang)")


def _suite(tmp_path, *args: str):
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    return run_pytest("-n", "0", "--hypothesis-profile=ci", "--max-examples=6", *args, env=env, timeout=2400)


def test_sglang_as_served_passes_the_central_properties(tmp_path):
    result = _suite(tmp_path, "properties/test_decode.py::test_output_and_lse_within_error_bound",
                    "properties/test_edge_shapes.py::test_lengths_at_block_edges_stay_within_error_bound",
                    "--impl=adapters/sglang_decode.py:run_as_served")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    for declared in ("no LSE: output checked alone", "knobs num_kv_splits", "waives empty_sequences"):
        assert declared in result.stdout, result.stdout


def test_sglang_gives_nan_for_an_empty_sequence(tmp_path):
    """A contract difference (docs/findings.md): SGLang's merge divides 0 by 0 for a sequence of no tokens."""
    result = _suite(tmp_path, "properties/test_edge_shapes.py::test_all_sequences_empty_give_zero_output_and_"
                    "negative_infinite_lse", "--impl=adapters/sglang_decode.py:run")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "nan" in result.stdout.lower()
