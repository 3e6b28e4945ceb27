"""Properties of the implementation under test against the float64 oracle."""

from __future__ import annotations

import math

import torch
from hypothesis import given, note, target

from reference import assert_within_bound, attend

from .cases import build
from .session import current
from .strategies import decode_cases

LIMITS = current().limits


def run_case(impl, case, device):
    """Build the case, run the implementation and the oracle on it."""
    inputs = build(case, device)
    output, lse = impl(*inputs)
    return inputs, output, lse, attend(*inputs)


@given(case=decode_cases(limits=LIMITS))
def test_output_and_lse_within_error_bound(impl, device, case):
    _, output, lse, reference = run_case(impl, case, device)
    worst = assert_within_bound(output, lse, reference, context=f"case {case}")
    note(f"worst err/bound {worst:.3g}")
    target(min(worst, 1e6), label="worst err/bound")


@given(case=decode_cases(limits=LIMITS, min_empty=1))
def test_empty_sequences_give_zero_output_and_negative_infinite_lse(impl, device, case):
    inputs = build(case, device)
    output, lse = impl(*inputs)
    for seq, length in enumerate(case.lengths):
        if length:
            continue
        assert torch.count_nonzero(output[seq].float()) == 0, f"sequence {seq} is empty but its output is not 0"
        assert bool((lse[seq] == -math.inf).all()), f"sequence {seq} is empty but its lse is {lse[seq].tolist()}"
