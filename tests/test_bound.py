"""The error bound's parts: exact where exactness is claimed, sound against correct arithmetic, not slack."""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gqa_decode_fuzz.generation.cases import VALUE_REGIMES, DecodeCase, build
from gqa_decode_fuzz.reference import attend, bound, check_against_reference
from gqa_decode_fuzz.reference.bound import (
    HOEFFDING_LAMBDA,
    MIN_BLOCK,
    U32,
    U_ACC,
    factor_columns,
    gamma,
    half_ulp_bf16,
    near_tie_counts,
)
from tests.fused_kernels import fused_device
from tests.impls import precision_defects, torch_float32


@given(st.lists(st.one_of(st.integers(0, 300), st.integers(0, 2**22 + 100)), max_size=20))
@example([0, 1, 16, 17, 131072, 3947577, 2**23])  # 3947577: gamma_N is exactly 1 (N = 2**22); 2**23: infinite
def test_factor_columns_are_the_bits_tensor_arithmetic_gives(lengths):
    # The same formulas elementwise on a float64 tensor, as the bound once formed them from the lengths.
    tokens = torch.tensor(lengths, dtype=torch.int64).double()
    rescales = (tokens / MIN_BLOCK).ceil()
    steps = gamma(tokens + rescales + 3, U_ACC)
    expected = torch.stack([tokens, rescales, steps, (steps + 8 * U32) / (1 - steps), -steps.clamp(max=1.0)])
    got = torch.tensor(factor_columns(lengths), dtype=torch.float64).view(5, len(lengths))
    assert torch.equal(got.view(torch.int64), expected.view(torch.int64))


@given(st.floats(width=32, allow_nan=False, allow_infinity=False).filter(lambda x: abs(x) < 3.3e38))
def test_half_ulp_bounds_bf16_rounding(x):
    value = torch.tensor([x], dtype=torch.float32)
    error = (value.bfloat16().double() - value.double()).abs()
    assert bool(error <= half_ulp_bf16(value.double().abs()))


@pytest.mark.parametrize("x", [1.0, 1.5, 2.0**-20, 100.0, 2.0**127])  # bf16 values
def test_half_ulp_is_attained_at_a_midpoint(x):
    # x + half an ulp is a tie between two bf16 neighbours: rounding moves it by exactly that much.
    half = float(half_ulp_bf16(torch.tensor([x], dtype=torch.float64)))
    midpoint = torch.tensor([x + half], dtype=torch.float32)
    assert float((midpoint.bfloat16().double() - midpoint.double()).abs()) == half


def test_half_ulp_of_zero_and_subnormals_is_the_subnormal_spacing():
    assert half_ulp_bf16(torch.tensor([0.0, 1e-40], dtype=torch.float64)).tolist() == [2.0**-134] * 2


def test_hoeffding_lambda_gives_the_stated_false_alarm_rate():
    assert 2.0 * math.exp(-(HOEFFDING_LAMBDA**2) / 2.0) == pytest.approx(1e-12)


def test_equal_weights_are_one_cluster_and_spread_weights_are_not():
    equal = torch.full((1, 1, 1, 500), 1.0 / 500, dtype=torch.float64)
    spread = torch.softmax(torch.linspace(0.0, 5.0, 500, dtype=torch.float64), 0).view(1, 1, 1, 500)
    no_error = torch.zeros_like(equal)
    assert bool((near_tie_counts(equal, no_error) == 500).all())
    assert bool((near_tie_counts(spread, no_error) == 1).all())


def test_empty_sequences_get_a_zero_bound_and_others_a_positive_one():
    reference = attend(*build(DecodeCase(lengths=(0, 3, 0, 1), seed=1)))
    assert bool((reference.output_bound[[0, 2]] == 0).all()) and bool((reference.lse_bound[[0, 2]] == 0).all())
    assert bool((reference.output_bound[[1, 3]] > 0).all()) and bool((reference.lse_bound[[1, 3]] > 0).all())


def test_bound_grows_with_the_logit_magnitude():
    inputs = build(DecodeCase(lengths=(200,), seed=2))
    small = attend(*inputs._replace(sm_scale=0.01))
    large = attend(*inputs._replace(sm_scale=1.0))
    assert float(large.lse_bound.min()) > float(small.lse_bound.max())


@pytest.mark.parametrize(
    "impl",
    [precision_defects.correct, precision_defects.correct_in_blocks_of_16, torch_float32.run],
    ids=["blockwise", "blocks_of_16", "torch_float32"],
)
@settings(max_examples=12, deadline=None)
@given(
    values=st.sampled_from(sorted(VALUE_REGIMES)),
    lengths=st.lists(st.integers(0, 1200), min_size=1, max_size=2),
    scale=st.one_of(st.none(), st.floats(0.01, 1.0), st.sampled_from([0.0, 1e-6, -0.088, 8.0, 64.0])),
    seed=st.integers(0, 2**32 - 1),
)
def test_correct_float32_implementations_stay_within_bound(impl, values, lengths, scale, seed):
    inputs = build(DecodeCase(lengths=tuple(lengths), values=values, scale=scale, seed=seed))
    for mismatch in check_against_reference(*impl(*inputs.arguments()), attend(*inputs)):
        assert not mismatch.message, mismatch.message


@st.composite
def _deviation_inputs(draw):
    """The deviation term's operands as the bound hands them over: a >= 0 and V 0 past each sequence's end."""
    count, groups, heads = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 10))
    slots = draw(st.one_of(st.integers(1, 40), st.integers(60, 140)))  # up to three of the kernel's 64-token splits
    dim = draw(st.sampled_from([1, 32, 40]))
    lengths = draw(st.lists(st.integers(0, slots), min_size=count, max_size=count))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    padding = torch.arange(slots)[None, None, None, :] >= torch.tensor(lengths)[:, None, None, None]
    coefficients = torch.rand(count, groups, heads, slots, generator=generator, dtype=torch.float64)
    coefficients = coefficients.mul_(draw(st.sampled_from([1e-3, 1.0, 30.0]))).masked_fill_(padding, 0.0)
    values = torch.randn(count, groups, slots, dim, generator=generator, dtype=torch.float64)
    values = values.mul_(draw(st.sampled_from([1.0, 1e30]))).masked_fill_(padding.transpose(2, 3), 0.0)
    output = torch.randn(count, groups, heads, dim, generator=generator, dtype=torch.float64)
    if draw(st.booleans()) and max(lengths) > 0:  # a NaN among one sequence's own values
        seq = lengths.index(max(lengths))
        values[seq, 0, draw(st.integers(0, lengths[seq] - 1)), 0] = math.nan
    return coefficients, values, output, padding, torch.tensor(lengths, dtype=torch.float64)


@settings(max_examples=25, deadline=None)
@given(_deviation_inputs())
def test_fused_deviation_term_matches_the_torch_path(inputs):
    from gqa_decode_fuzz.reference import _fused_deviation

    coefficients, values, output, padding, lengths = inputs
    expected = bound._logit_term_torch(coefficients, values, output, padding)
    device = fused_device()
    got = _fused_deviation.deviation_term(coefficients.to(device), values.to(device), output.to(device),
                                          lengths.to(device)).cpu()
    assert torch.equal(got.isnan(), expected.isnan())
    torch.testing.assert_close(got.nan_to_num(), expected.nan_to_num(), rtol=1e-12, atol=0.0)
