"""Properties of the implementation under test against the float64 oracle."""

from __future__ import annotations

import pytest
from hypothesis import given

from gqa_decode_fuzz.generation.strategies import decode_cases, run_sized
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.properties.checks import steer_toward_the_bound
from gqa_decode_fuzz.properties.claims import property_claim


@property_claim(claims.within_bound)
@pytest.mark.workloads("case")  # --workloads: each benchmark workload an explicit example (run before any draw)
@given(case=run_sized(lambda limits: decode_cases(limits=limits)))
def test_output_and_lse_within_error_bound(impl, device, contract, case):
    steer_toward_the_bound(claims.within_bound(impl, case, device, contract).worst_ratio)


@property_claim(claims.empty_sequences_exact)
@pytest.mark.empty_sequences
@given(case=run_sized(lambda limits: decode_cases(limits=limits, min_empty=1)))
def test_empty_sequences_give_zero_output_and_negative_infinite_lse(impl, device, contract, case):
    claims.empty_sequences_exact(impl, case, device, contract)
