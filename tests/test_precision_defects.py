"""The derived bound is sharp enough to catch precision defects and loose enough to pass correct code.

Each defect in ``tests/impls/precision_defects.py`` moves the output by less than the
1e-2 .. 3e-2 tolerances of public test suites; the long-sequence property must
fail each one through ``--impl``, in a fresh pytest process, on the CI profile. A
correct implementation written independently of the kernel (plain torch, float32
math, bf16 output) must pass the same property: no false alarms. (The defects'
shared core passes the bound in ``tests/test_bound.py``.)
"""

from __future__ import annotations

import pytest

from tests.pytest_runs import run_pytest

DEFECTS = "tests/impls/precision_defects.py"
PRECISION_PROPERTY = "properties/test_precision.py"


def run_precision_property(impl: str, *extra: str):
    return run_pytest(PRECISION_PROPERTY, "-n0", "--hypothesis-profile=ci", "--device=cpu", "--impl", impl, *extra,
                      timeout=900)


@pytest.mark.parametrize("defect", ["drop_last_token", "bf16_accumulator", "clamped_exp", "default_scale_only"])
def test_precision_defect_is_caught(defect):
    # Without shrinking: the first failing example is the verdict, its minimisation is not.
    result = run_precision_property(f"{DEFECTS}:{defect}", "-x", "-p", "tests.corpus.plugin", "--corpus-no-shrink")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "not within bound" in result.stdout


def test_independent_correct_implementation_passes():
    result = run_precision_property("tests/impls/torch_float32.py:run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "passed" in result.stdout
