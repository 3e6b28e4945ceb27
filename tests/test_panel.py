"""The correct panel: independent implementations (tests/impls/panel_*.py) the default tier must pass.

They are written differently from this project's kernel on purpose (split-KV with random
splits, two-pass softmax, tokens last to first, P rounded to bf16, float32 throughout,
CPU tensors, their own error types and wording; two are Triton kernels, run here in the
interpreter). A property that fails one of them is a bug of the suite, not of the panel.
"""

import pytest

from tests.pytest_runs import ROOT, clean_environment, run_pytest

PANEL = sorted(path.name for path in (ROOT / "tests" / "impls").glob("panel_*.py"))


# The ci profile, at a quarter of its examples: two panel members are Triton kernels that the interpreter
# runs several times slower than ours, and CI has 2 cores. The H200 runs thousands per member (docs/gpu.md).
EXAMPLES = "--max-examples=10"


def _suite(tmp_path, *args: str):
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    return run_pytest("-n", "0", "--hypothesis-profile=ci", EXAMPLES, *args, env=env, timeout=2400)


def test_the_panel_is_there():
    assert len(PANEL) >= 4 and sum("triton" in name for name in PANEL) >= 2, PANEL


@pytest.mark.parametrize("impl", PANEL)
def test_a_correct_implementation_passes_the_correct_tier(tmp_path, impl):
    result = _suite(tmp_path, "properties", "--contract=correct", f"--impl=tests/impls/{impl}:run")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert "contract tier correct" in result.stdout


def test_a_wrong_triton_kernel_that_is_not_ours_fails_in_the_interpreter(tmp_path):
    """Red for the right reason: the bf16 layer serves any Triton kernel, so what fails is the defect."""
    source = (ROOT / "tests" / "impls" / "panel_triton_two_pass.py").read_text()
    assert "LOG2E = 1.4426950408889634" in source
    (tmp_path / "natural_base.py").write_text(source.replace("LOG2E = 1.4426950408889634", "LOG2E = 1.0"))
    result = _suite(tmp_path, "properties/test_decode.py", "-x", f"--impl={tmp_path / 'natural_base.py'}:run")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "not within bound" in result.stdout
