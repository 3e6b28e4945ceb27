"""Metamorphic properties: changes to a call that must not change its result.

Under ``--contract=strict`` (this project's kernel's promises) relabelled pages, a
repeated call and equal queries in one KV group give identical bits. Under
``correct`` each such call is held to the oracle's bound instead: a correct
implementation may round differently from call to call (split points chosen per
call, reductions whose order follows memory alignment). A sequence alone versus in
a batch is judged by the bound in both tiers.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gqa_decode_fuzz.generation.cases import KV_LAYOUTS, Q_LAYOUTS
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.properties.checks import share_of_examples, short_cases
from gqa_decode_fuzz.properties.claims import property_claim


@property_claim(claims.alone_and_batched)
@share_of_examples(0.5)
@given(case=short_cases(min_batch=2))
def test_a_sequence_gets_the_same_answer_alone_as_in_a_batch(impl, contract, device, case):
    claims.alone_and_batched(impl, case, device, contract)


@property_claim(claims.relabelled)
@share_of_examples(0.5)
@given(case=short_cases(), extra_pages=st.integers(0, 64), relabel_seed=st.integers(0, 2**32 - 1))
def test_moving_pages_to_other_slots_changes_nothing(impl, contract, device, case, extra_pages, relabel_seed):
    claims.relabelled(impl, case, device, contract, extra_pages=extra_pages, relabel_seed=relabel_seed)


@property_claim(claims.repeated)
@share_of_examples(0.5)
@given(case=short_cases(), other=short_cases())
def test_repeating_a_call_gives_the_same_answer(impl, contract, device, case, other):
    claims.repeated(impl, case, device, contract, other=other)


@property_claim(claims.inputs_unchanged)
@share_of_examples(0.5)
@given(case=short_cases(q_layouts=Q_LAYOUTS, kv_layouts=KV_LAYOUTS, min_empty=0))
def test_inputs_are_left_unchanged(impl, contract, device, case):
    claims.inputs_unchanged(impl, case, device, contract)


@property_claim(claims.every_output_written)
@share_of_examples(0.5)
@given(case=short_cases(min_batch=0))
def test_every_output_element_is_written(impl, contract, device, case):
    claims.every_output_written(impl, case, device, contract)


@property_claim(claims.equal_heads)
@pytest.mark.strict  # under correct, rows may round differently by alignment; each is held to the bound elsewhere
@share_of_examples(0.5)
@given(case=short_cases(), copy_seed=st.integers(0, 2**32 - 1))
def test_heads_sharing_a_kv_head_and_a_query_give_equal_results(impl, contract, device, case, copy_seed):
    claims.equal_heads(impl, case, device, contract, copy_seed=copy_seed)
