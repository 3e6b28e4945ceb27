"""The one comparison (reference/compare.py): verdicts, and several comparisons sharing one read-back."""

import math

import torch

from gqa_decode_fuzz.reference.compare import compare, compare_all


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
