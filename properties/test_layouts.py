"""Memory layouts: sliced, strided and combined inputs give the right answer or a clear error.

Padding and gaps in the storage behind each view hold NaN (or an in-range wrong
page id for index tensors), so a kernel that assumes a stride reads junk.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import example, given

from gqa_decode_fuzz.generation.cases import INDEX_LAYOUTS, KV_LAYOUTS, Q_LAYOUTS, DecodeCase
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.properties.checks import share_of_examples, short_cases
from gqa_decode_fuzz.properties.claims import property_claim

ARGUMENTS = ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices")


@property_claim(claims.right_answer_or_clear_error)
# One test per K/V layout, each with its share of the examples: drawn from all seven, a derandomized CI run of
# 40 examples drew dim_outer once, so a kernel that assumes a unit head-dim stride passed every generated example.
@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@share_of_examples(1 / len(KV_LAYOUTS))
@given(case=short_cases(q_layouts=Q_LAYOUTS, index_layouts=INDEX_LAYOUTS))
# The seed assumed a unit last-dimension stride in q, K and V (K and V: the dim_outer and padded_dim layouts).
@example(case=DecodeCase(lengths=(2,)))
@example(case=DecodeCase(lengths=(2,), q_layout="strided_dim"))
# The seed's output = torch.empty_like(q) copies a dense q's strides; its kernel then writes as if contiguous.
@example(case=DecodeCase(lengths=(2,), q_layout="dim_outer"))
# A slice of a fused QKV projection (with the combined K/V buffer): batch and page strides other than the plain ones.
@example(case=DecodeCase(lengths=(2, 3), q_layout="fused_qkv"))
@example(case=DecodeCase(lengths=(2, 3), index_layout="int64_strided"))
def test_strided_and_sliced_inputs_give_the_right_answer_or_a_clear_error(impl, contract, device, kv_layout, case):
    claims.right_answer_or_clear_error(impl, replace(case, kv_layout=kv_layout), device, contract)
