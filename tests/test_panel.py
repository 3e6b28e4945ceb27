"""The correct panel: independent implementations (tests/impls/panel_*.py) the default tier must pass.

They are written differently from this project's kernel on purpose (split-KV with random
splits, two-pass softmax, tokens last to first, P rounded to bf16, float32 throughout,
CPU tensors, their own error types and wording; two are Triton kernels, run here in the
interpreter). A property that fails one of them is a bug of the suite, not of the panel.

Each member serves every definition of the family (``run.for_definition``); CI runs each on
the seed's definition and on two others: 20 query heads in groups of 5 (not a power of two)
with pages of one token, and 24 in groups of 6 with pages of 64 tokens.
"""

import importlib
import inspect

import pytest

from gqa_decode_fuzz.reference.definitions import BUILT_IN, SEED_NAME
from tests.pytest_runs import ROOT, clean_environment, run_pytest

PANEL = sorted(path.name for path in (ROOT / "tests" / "impls").glob("panel_*.py"))
DEFINITIONS = (SEED_NAME, "gqa_paged_decode_h20_kv4_d128_ps1", "gqa_paged_decode_h24_kv4_d128_ps64")


# The ci profile, at 3 of its 40 examples per definition (plus each property's explicit examples): two panel members
# are Triton kernels that the interpreter runs several times slower than ours, each member runs under three
# definitions, and CI has 2 cores (this file, -n 2, on an idle 2-core machine: 147 s). The H200 runs thousands per
# member (docs/gpu.md).
EXAMPLES = "--max-examples=3"


def _suite(tmp_path, *args: str):
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    return run_pytest("-n", "0", "--hypothesis-profile=ci", EXAMPLES, *args, env=env, timeout=2400)


def test_the_panel_is_there():
    assert len(PANEL) >= 4 and sum("triton" in name for name in PANEL) >= 2, PANEL


@pytest.mark.parametrize("impl", PANEL)
def test_each_member_serves_every_built_in_definition(impl):
    """``for_definition`` accepts each definition of the family and returns an entry point taking its arguments,
    in its order (``kv_last_page_len`` before ``sm_scale`` with pages of several tokens)."""
    run = importlib.import_module(f"tests.impls.{impl.removesuffix('.py')}").run
    for definition in BUILT_IN.values():
        served = run.for_definition(definition)
        assert tuple(inspect.signature(served).parameters) == definition.arguments, definition.name


@pytest.mark.parametrize("impl", PANEL)
def test_a_correct_implementation_passes_the_correct_tier(tmp_path, impl):
    result = _suite(tmp_path, "properties", "-v", "--contract=correct", f"--impl=tests/impls/{impl}:run",
                    f"--definition={','.join(DEFINITIONS)}")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert "contract tier correct" in result.stdout
    for name in DEFINITIONS:  # each definition ran, the bound checked under it
        assert f"test_output_and_lse_within_error_bound[{name}] PASSED" in result.stdout, name


def test_a_wrong_triton_kernel_that_is_not_ours_fails_in_the_interpreter(tmp_path):
    """Red for the right reason: the bf16 layer serves any Triton kernel, so what fails is the defect."""
    source = (ROOT / "tests" / "impls" / "panel_triton_two_pass.py").read_text()
    assert "LOG2E = 1.4426950408889634" in source
    (tmp_path / "natural_base.py").write_text(source.replace("LOG2E = 1.4426950408889634", "LOG2E = 1.0"))
    result = _suite(tmp_path, "properties/test_decode.py", "-x", f"--impl={tmp_path / 'natural_base.py'}:run")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "not within bound" in result.stdout
