"""Properties of the implementation under test against the float64 oracle."""

from __future__ import annotations

import pytest
from hypothesis import example, given

from gqa_decode_fuzz.generation.strategies import decode_cases
from gqa_decode_fuzz.runner.plugin import current_run

from . import claims
from .checks import steer_toward_the_bound

LIMITS = current_run().limits


def _with_workloads(test):
    """``--workloads``: each benchmark workload an explicit example (run before anything is generated)."""
    for case in current_run().workload_cases:
        test = example(case=case)(test)
    return test


@given(case=decode_cases(limits=LIMITS))
@_with_workloads
def test_output_and_lse_within_error_bound(impl, device, contract, case):
    steer_toward_the_bound(claims.within_bound(impl, case, device, contract).worst_ratio)


@pytest.mark.empty_sequences
@given(case=decode_cases(limits=LIMITS, min_empty=1))
def test_empty_sequences_give_zero_output_and_negative_infinite_lse(impl, device, contract, case):
    claims.empty_sequences_exact(impl, case, device, contract)
