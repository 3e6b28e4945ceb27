"""Hostile values: extreme logits and scales, and NaN/Inf where it must not matter or must stay put.

Logits reach 1e6 in magnitude but |q|·|k| stays far inside float32, where the
contract computes them.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gqa_decode_fuzz.generation.cases import HOSTILE_REGIMES, KV_LAYOUTS, POOL_FILLS, DecodeCase
from gqa_decode_fuzz.generation.strategies import hostile_scales
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.properties.checks import share_of_examples, short_cases
from gqa_decode_fuzz.properties.claims import property_claim


@property_claim(claims.within_bound)
@given(case=short_cases(values=HOSTILE_REGIMES))
# All logits below a finite mask sentinel (-5e4): a kernel masking with it weights padding like real tokens.
@example(case=DecodeCase(lengths=(3, 130), values="beyond_sentinel", seed=1))
# One token 1e4 logits above the rest, behind an empty sequence.
@example(case=DecodeCase(lengths=(0, 129), values="dominant_token", seed=2))
def test_extreme_logits_stay_within_error_bound(impl, device, contract, case):
    claims.within_bound(impl, case, device, contract)


@property_claim(claims.within_bound)
@share_of_examples(0.5)
@given(case=short_cases(values=("normal", "constant_keys", "peaky", "exact_ties"),
                         sm_scales=hostile_scales()))
def test_tiny_and_huge_scales_stay_within_error_bound(impl, device, contract, case):
    claims.within_bound(impl, case, device, contract)


@property_claim(claims.junk_elsewhere)
@share_of_examples(0.5)
@given(case=short_cases(min_spare_pages=1, kv_layouts=KV_LAYOUTS),
       other_fill=st.sampled_from(POOL_FILLS))
def test_junk_in_unreferenced_pages_changes_nothing(impl, contract, device, case, other_fill):
    claims.junk_elsewhere(impl, case, device, contract, other_fill=other_fill)


@property_claim(claims.junk_in_last_pages)
@pytest.mark.paged
@share_of_examples(0.5)
@given(case=short_cases(kv_layouts=KV_LAYOUTS), other_fill=st.sampled_from(POOL_FILLS))
# One token in the last page: every other slot of it is junk.
@example(case=DecodeCase(lengths=(65, 1), pool_fill="nan"), other_fill="noise")
def test_junk_in_unused_slots_of_last_pages_changes_nothing(impl, contract, device, case, other_fill):
    claims.junk_in_last_pages(impl, case, device, contract, other_fill=other_fill)


@property_claim(claims.poison_stays_put)
@share_of_examples(0.5)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, in the interpreter
@given(case=short_cases(min_batch=2), page_rank=st.integers(0, 255),
       tensor=st.sampled_from(("k_cache", "v_cache")), value=st.sampled_from((math.nan, math.inf, -math.inf)))
def test_nan_in_a_referenced_page_stays_in_the_sequences_reading_it(impl, contract, device, case, page_rank, tensor,
                                                                      value):
    """The page poisoned is the referenced one at ``page_rank`` (modulo their count), in sorted order."""
    claims.poison_stays_put(impl, case, device, contract, page_rank=page_rank, tensor=tensor, value=value)
