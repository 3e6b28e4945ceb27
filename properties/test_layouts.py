"""Memory layouts: sliced, strided and combined inputs give the right answer or a clear error.

Padding and gaps in the storage behind each view hold NaN (or an in-range wrong
page id for index tensors), so a kernel that assumes a stride reads junk.
"""

from __future__ import annotations

from hypothesis import example, given, note

from ._plugin.plugin import current_run
from .cases import INDEX_LAYOUTS, KV_LAYOUTS, Q_LAYOUTS, DecodeCase, build
from .checks import run_and_check, shorter
from .strategies import decode_cases

LIMITS = shorter(current_run().limits)
ARGUMENTS = ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices")


@given(case=decode_cases(limits=LIMITS, q_layouts=Q_LAYOUTS, kv_layouts=KV_LAYOUTS, index_layouts=INDEX_LAYOUTS))
# The seed assumed a unit last-dimension stride in q, K and V: every other element is junk here.
@example(case=DecodeCase(lengths=(2,), q_layout="strided_dim"))
@example(case=DecodeCase(lengths=(2,), kv_layout="padded_dim"))
@example(case=DecodeCase(lengths=(2,), kv_layout="dim_outer"))
# The seed's output = torch.empty_like(q) copies a dense q's strides; its kernel then writes as if contiguous.
@example(case=DecodeCase(lengths=(2,), q_layout="dim_outer"))
# A slice of a fused QKV projection and one K/V buffer: batch and page strides other than the plain ones.
@example(case=DecodeCase(lengths=(2, 3), q_layout="fused_qkv", kv_layout="combined"))
@example(case=DecodeCase(lengths=(2, 3), index_layout="int64_strided"))
def test_strided_and_sliced_inputs_give_the_right_answer_or_a_clear_error(impl, contract, device, case):
    inputs = build(case, device)
    try:
        result = impl(*inputs)
    except Exception as error:  # refusing a layout is allowed; strict: TypeError/ValueError naming the input
        if contract == "strict":
            assert isinstance(error, (TypeError, ValueError)), f"case {case}: refused with {error!r}"
            assert any(name in str(error) for name in ARGUMENTS), f"case {case}: unclear error {error!r}"
        note(f"refused: {error!r}")
        return
    run_and_check(lambda *_: result, inputs, f"case {case}")
