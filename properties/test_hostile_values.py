"""Hostile values: extreme logits and scales, and NaN/Inf where it must not matter or must stay put.

Logits reach 1e6 in magnitude but |q|·|k| stays far inside float32, where the
contract computes them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import assume, example, given, note
from hypothesis import strategies as st

from ._plugin.plugin import current_run
from .cases import HOSTILE_REGIMES, KV_LAYOUTS, POOL_FILLS, DecodeCase, build
from .checks import assert_equivalent, assert_within_bound, attend, run_and_check, share_of_examples, shorter
from .strategies import decode_cases, hostile_scales
from .transforms import poison_page, reference_rows, result_rows, sequences_reading

LIMITS = current_run().limits
SHORT = shorter(LIMITS)


@given(case=decode_cases(limits=SHORT, values=HOSTILE_REGIMES))
# All logits below a finite mask sentinel (-5e4): a kernel masking with it weights padding like real tokens.
@example(case=DecodeCase(lengths=(3, 130), values="beyond_sentinel", seed=1))
# One token 1e4 logits above the rest, behind an empty sequence.
@example(case=DecodeCase(lengths=(0, 129), values="dominant_token", seed=2))
def test_extreme_logits_stay_within_error_bound(impl, device, case):
    run_and_check(impl, build(case, device), f"case {case}")


@share_of_examples(0.5)
@given(case=decode_cases(limits=SHORT, values=("normal", "constant_keys", "peaky", "exact_ties"),
                         sm_scales=hostile_scales()))
def test_tiny_and_huge_scales_stay_within_error_bound(impl, device, case):
    run_and_check(impl, build(case, device), f"case {case}")


@share_of_examples(0.5)
@given(case=decode_cases(limits=SHORT, min_spare_pages=1, kv_layouts=KV_LAYOUTS),
       other_fill=st.sampled_from(POOL_FILLS))
def test_junk_in_unreferenced_pages_changes_nothing(impl, contract, device, case, other_fill):
    other = replace(case, pool_fill=other_fill)
    assert_equivalent(
        impl, contract, build(other, device), impl(*build(case, device)),
        f"case {case}; unreferenced pages filled with {other_fill} instead of {case.pool_fill}",
    )


@pytest.mark.paged
@share_of_examples(0.5)
@given(case=decode_cases(limits=SHORT, kv_layouts=KV_LAYOUTS), other_fill=st.sampled_from(POOL_FILLS))
# One token in the last page: every other slot of it is junk.
@example(case=DecodeCase(lengths=(65, 1), pool_fill="nan"), other_fill="noise")
def test_junk_in_unused_slots_of_last_pages_changes_nothing(impl, contract, device, case, other_fill):
    page_size = case.shape.page_size
    assume(any(n % page_size for n in case.lengths))  # some last page is not full
    other = replace(case, pool_fill=other_fill)
    inputs = build(case, device)
    assert_equivalent(
        impl, contract, build(other, device), run_and_check(impl, inputs, f"case {case}")[:2],
        f"case {case}; unused slots of last pages (and unreferenced pages) hold {other_fill}, not {case.pool_fill}",
    )


@share_of_examples(0.5)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, in the interpreter
@given(case=decode_cases(limits=SHORT, min_batch=2), data=st.data())
def test_nan_in_a_referenced_page_stays_in_the_sequences_reading_it(impl, device, case, data):
    inputs = build(case, device)
    referenced = sorted(set(inputs.kv_indices.tolist()))
    assume(referenced)  # some sequence must read a page
    page = data.draw(st.sampled_from(referenced), label="poisoned page")
    tensor = data.draw(st.sampled_from(("k_cache", "v_cache")), label="poisoned tensor")
    value = data.draw(st.sampled_from((math.nan, math.inf, -math.inf)), label="poison")
    output, lse = impl(*poison_page(inputs, page, tensor, value))
    reference = attend(*inputs)
    readers = sequences_reading(inputs, page)
    note(f"sequences reading page {page}: {sorted(readers)}")
    for seq in set(range(case.batch)) - readers:
        assert_within_bound(
            *result_rows(output, lse, slice(seq, seq + 1)), reference_rows(reference, slice(seq, seq + 1)),
            context=f"case {case}; {tensor}[{page}] = {value} reached sequence {seq}, which does not read it",
        )
