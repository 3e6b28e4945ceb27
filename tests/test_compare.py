"""The one comparison (reference/compare.py): verdicts, and several comparisons sharing one read-back."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gqa_decode_fuzz.reference.compare import compare, compare_all
from tests.fused_kernels import fused_device


def _triple(values, expected, bound):
    as_double = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return torch.tensor(values, dtype=torch.float32), as_double(expected), as_double(bound)


def test_within_bound_counts_the_off_elements_and_locates_the_worst():
    actual, expected, bound = _triple([[1.0, 2.5], [math.nan, 4.0]], [[1.0, 2.0], [3.0, 4.0]], [[0.1, 0.1], [1.0, 0.0]])
    mismatch = compare("output", actual, expected, bound, axes=("seq", "head"))
    assert (mismatch.count, mismatch.total) == (2, 4)  # 2.5 off by 5x its bound, NaN off by infinitely much
    assert mismatch.worst_index == (1, 0) and mismatch.worst_ratio == math.inf
    assert "seq=1, head=0" in mismatch.message


def test_equal_infinities_and_zero_error_pass_whatever_the_bound():
    actual, expected, bound = _triple([math.inf, -math.inf, 0.5], [math.inf, -math.inf, 0.5], [0.0, 0.0, 0.0])
    assert compare("lse", actual, expected, bound).ok


def test_bitwise_tells_minus_zero_from_zero_and_equates_the_same_nan():
    same_nan = torch.tensor([math.nan, 1.0])
    assert compare("output", same_nan, same_nan.clone()).ok
    mismatch = compare("output", torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))
    assert (mismatch.count, mismatch.worst_index, mismatch.bound) == (1, (0,), None)


def test_several_comparisons_keep_their_own_verdicts():
    """Each verdict of a shared read-back lands on its own comparison, with problems and bitwise ones between."""
    good = _triple([1.0, 2.0], [1.0, 2.0], [0.5, 0.5])
    bad = _triple([1.0, 9.0, 3.0], [1.0, 2.0, 3.0], [0.5, 0.5, 0.5])
    empty = _triple([], [], [])
    comparisons = [
        ("a", *good), ("b", *bad), ("shape", torch.zeros(2), torch.zeros(3), torch.ones(3)),
        ("bits", torch.tensor([1.0]), torch.tensor([2.0]), None), ("empty", *empty), ("c", *good),
    ]
    found = compare_all(comparisons)
    assert [m.name for m in found] == ["a", "b", "shape", "bits", "empty", "c"]
    assert [m.ok for m in found] == [True, False, False, False, True, True]
    assert (found[1].count, found[1].worst_index, found[1].worst_ratio) == (1, (1,), 14.0)
    assert "shape" in found[2].message and found[3].count == 1
    for single, (name, actual, expected, bound) in zip(found, comparisons):
        assert single == compare(name, actual, expected, bound)


def test_an_error_against_a_nan_bound_is_infinitely_over_it():
    """A NaN bound would make err / bound NaN, and NaN > 1 is false: the error would pass unseen."""
    from gqa_decode_fuzz.reference.compare import error_ratio

    err, ratio = error_ratio(torch.tensor([1.0, 2.0, 2.0]), torch.tensor([0.0, 2.0, 0.0], dtype=torch.float64),
                             torch.tensor([math.nan, math.nan, 0.5], dtype=torch.float64))
    assert ratio.tolist() == [math.inf, 0.0, 4.0] and err.tolist() == [1.0, 0.0, 2.0]


_HOSTILE = [0.0, -0.0, 1.0, -2.5, 1e-300, 3e38, 1e308, math.inf, -math.inf, math.nan]


@st.composite
def _verdict_inputs(draw):
    """A comparison's three tensors: ordinary values with hostile ones (NaN, infinities, zeros of either sign,
    subnormals, the largest floats) mixed in, in every dtype an implementation may return."""
    elements = draw(st.one_of(st.integers(1, 40), st.integers(300, 1100)))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    expected = torch.randn(elements, generator=generator, dtype=torch.float64)
    bound = torch.rand(elements, generator=generator, dtype=torch.float64).mul_(draw(st.sampled_from([1e-3, 1.0])))
    actual = expected + torch.randn(elements, generator=generator, dtype=torch.float64) * 1e-3
    for tensor in (actual, expected, bound):
        spots = draw(st.lists(st.tuples(st.integers(0, elements - 1), st.sampled_from(_HOSTILE)), max_size=6))
        for index, value in spots:
            tensor[index] = value
    exact = st.tuples(st.integers(0, elements - 1), st.sampled_from(_HOSTILE), st.sampled_from([0.0, math.nan, 1.0]))
    for index, value, its_bound in draw(st.lists(exact, max_size=4)):  # no error (equal infinities too), any bound
        actual[index] = expected[index] = value
        bound[index] = its_bound
    if draw(st.booleans()):  # ties for the worst, at err / bound exactly 1 or 2 (exact in every dtype)
        expected[: elements // 2], actual[: elements // 2] = 1.0, 2.0
        bound[: elements // 2] = draw(st.sampled_from([0.5, 1.0]))
    if draw(st.booleans()):  # no bound a correct result could meet: -0 and below (err / -0 is -inf)
        bound.neg_().clamp_(max=0.0).mul_(draw(st.sampled_from([0.0, 1.0])))
    dtype = draw(st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]))
    return actual.to(dtype), expected, bound


@settings(max_examples=30, deadline=None)
@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")  # numpy's IEEE warnings (x / 0)
@given(_verdict_inputs(), st.sampled_from([(1024, 1024), (64, 4), (16, 2)]))
def test_fused_verdict_is_the_torch_paths(inputs, blocks):
    """Count, first index of the worst and the worst ratio, bit for bit, over several partials and steps."""
    from gqa_decode_fuzz.reference import _fused_compare
    from gqa_decode_fuzz.reference.compare import _verdict_in_torch

    actual, expected, bound = inputs
    device = fused_device()
    got = _fused_compare.verdict(actual.to(device), expected.to(device), bound.to(device), block=blocks[0],
                                 partials_block=blocks[1]).cpu()
    expected_verdict = _verdict_in_torch(actual, expected, bound)  # on the CPU: torch's path
    assert torch.equal(got.view(torch.int64), expected_verdict.view(torch.int64)), (got, expected_verdict)
