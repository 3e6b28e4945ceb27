"""The float64 oracle of a built call, either op type: the reference's answer and bound, fed the index values the
builder kept on the host (``cases.host_values``) so that no read-back from the device is needed."""

from __future__ import annotations

from gqa_decode_fuzz import reference
from gqa_decode_fuzz.reference import prefill_oracle

from .cases import DecodeInputs, host_values, suite_allocating
from .prefill_cases import PrefillInputs
from .stages import timed

__all__ = ["oracle_of"]

_attend = timed("oracle", reference.attend)
_attend_paged_prefill = timed("oracle", prefill_oracle.attend_paged_prefill)
_attend_ragged_prefill = timed("oracle", prefill_oracle.attend_ragged_prefill)


def oracle_of(inputs: DecodeInputs | PrefillInputs) -> reference.Reference:
    """The float64 answer and bound for a built call: one row per sequence (decode) or per query token (prefill).
    Running out of memory here is the suite's (``cases.SuiteOutOfMemory``), not the implementation's."""
    with suite_allocating(lambda: f"the float64 oracle of a call of {len(inputs.kv_indptr) - 1} sequences"):
        return _oracle_of(inputs)


def _oracle_of(inputs: DecodeInputs | PrefillInputs) -> reference.Reference:
    if isinstance(inputs, PrefillInputs):
        return _prefill_oracle_of(inputs)
    return _attend(*inputs, indptr_on_host=host_values(inputs.kv_indptr),
                   last_page_len_on_host=host_values(inputs.kv_last_page_len))


def _prefill_oracle_of(inputs: PrefillInputs) -> reference.Reference:
    hosts = dict(qo_indptr_on_host=host_values(inputs.qo_indptr), kv_indptr_on_host=host_values(inputs.kv_indptr))
    if inputs.ragged:
        return _attend_ragged_prefill(*inputs[:5], inputs.sm_scale, **hosts)
    return _attend_paged_prefill(*inputs[:6], inputs.sm_scale, inputs.kv_last_page_len,
                                 last_page_len_on_host=host_values(inputs.kv_last_page_len), **hosts)
