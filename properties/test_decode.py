"""Properties of the implementation under test against the float64 oracle."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given

from ._plugin.plugin import current_run
from .cases import build
from .checks import run_and_check, steer_toward_the_bound
from .strategies import decode_cases

LIMITS = current_run().limits


@given(case=decode_cases(limits=LIMITS))
def test_output_and_lse_within_error_bound(impl, device, case):
    checked = run_and_check(impl, build(case, device), f"case {case}")
    steer_toward_the_bound(checked.worst_ratio)


@pytest.mark.empty_sequences
@given(case=decode_cases(limits=LIMITS, min_empty=1))
def test_empty_sequences_give_zero_output_and_negative_infinite_lse(impl, device, case):
    inputs = build(case, device)
    output, lse = impl(*inputs)
    for seq, length in enumerate(case.lengths):
        if length:
            continue
        assert torch.count_nonzero(output[seq].float()) == 0, f"sequence {seq} is empty but its output is not 0"
        if lse is not None:
            assert bool((lse[seq] == -math.inf).all()), f"sequence {seq} is empty but its lse is {lse[seq].tolist()}"
