"""Each property's claim on one case: what the run's root-cause probes replay (``_plugin/causes.py``).

A property draws more than a descriptor (a relabelling seed, a second case, a poisoned
page); its claim here fixes those extra draws to one plain choice, so that a
``DecodeCase`` alone decides whether the claim holds. ``claim_for(name)`` returns the
claim of a property's test function (its name, without parameters); a property not
listed claims what nearly every one does, that the call's result is within the
oracle's bound.

A claim raises (``AssertionError`` from the checks, or whatever the implementation
raised) when it does not hold, and returns None when it does. It builds without
notifying the build observers: a probe is not an example of the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch

from ._plugin.destinations import DestinationError
from .cases import POOL_FILLS, DecodeCase, DecodeInputs, build
from .checks import (
    assert_equivalent,
    assert_result_metadata,
    assert_same_result,
    assert_unchanged,
    assert_within_bound,
    attend,
    poisoned_allocations,
    run_and_check,
    snapshot,
)
from .transforms import (
    copy_queries_within_groups,
    poison_page,
    reference_rows,
    relabel_pages,
    result_rows,
    sequences_reading,
    single_sequence,
)

Claim = Callable[[Callable, DecodeCase, torch.device, str], None]  # (impl, case, device, contract)

__all__ = ["Claim", "assert_empty_sequences_exact", "claim_for", "within_bound"]

LAYOUT_ARGUMENTS = ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices")


def _built(case: DecodeCase, device: torch.device) -> DecodeInputs:
    return build(case, device, observe=False)


def within_bound(impl: Callable, case: DecodeCase, device: torch.device, contract: str) -> None:
    """The call's output and LSE are within the oracle's bound (empty sequences exactly 0 and -inf)."""
    run_and_check(impl, _built(case, device), f"case {case}")


def assert_empty_sequences_exact(output: torch.Tensor, lse: torch.Tensor | None, lengths: tuple[int, ...]) -> None:
    """Every empty sequence's output is exactly 0 and its LSE exactly -inf (unless the LSE is None)."""
    __tracebackhide__ = True
    for seq, length in enumerate(lengths):
        if length:
            continue
        assert torch.count_nonzero(output[seq].float()) == 0, f"sequence {seq} is empty but its output is not 0"
        if lse is not None:
            assert bool((lse[seq] == -math.inf).all()), f"sequence {seq} is empty but its lse is {lse[seq].tolist()}"


def _empty_sequences(impl, case, device, contract) -> None:
    assert_empty_sequences_exact(*impl(*_built(case, device)), case.lengths)


def _alone_and_batched(impl, case, device, contract) -> None:
    inputs = _built(case, device)
    reference = run_and_check(impl, inputs, f"case {case}").reference
    for seq in range(case.batch):
        alone = single_sequence(inputs, seq)
        output, lse = impl(*alone)
        context = f"case {case}, sequence {seq} alone"
        assert_result_metadata(output, lse, alone, context)
        assert_within_bound(output, lse, reference_rows(reference, slice(seq, seq + 1)), context=context)


def _relabelled(impl, case, device, contract) -> None:
    inputs = _built(case, device)
    moved = relabel_pages(inputs, 8, torch.Generator().manual_seed(0))
    assert_equivalent(impl, contract, moved, impl(*inputs), f"case {case}, pages relabelled into a pool +8")


def _repeated(impl, case, device, contract) -> None:
    inputs = _built(case, device)
    first = impl(*inputs)
    impl(*_built(DecodeCase(lengths=(3,), seed=1), device))
    assert_equivalent(impl, contract, inputs, first, f"case {case}, second call")


def _inputs_unchanged(impl, case, device, contract) -> None:
    inputs = _built(case, device)
    before = snapshot(inputs)
    impl(*inputs)
    assert_unchanged(inputs, before, f"case {case}")


def _every_output_written(impl, case, device, contract) -> None:
    inputs = _built(case, device)
    with poisoned_allocations():
        output, lse = impl(*inputs)
    run_and_check(lambda *_: (output, lse), inputs, f"case {case}, fresh allocations filled with NaN")


def _equal_heads(impl, case, device, contract) -> None:
    inputs = _built(case, device)
    q, pairs = copy_queries_within_groups(inputs.q, torch.Generator().manual_seed(0))
    output, lse = impl(*inputs._replace(q=q))
    for head, source in pairs:
        rows = [(output[:, h:h + 1], None if lse is None else lse[:, h:h + 1]) for h in (head, source)]
        assert_same_result(*rows, f"case {case}: head {head} has the query of head {source}")


def _junk_elsewhere(impl, case, device, contract) -> None:
    other_fill = POOL_FILLS[(POOL_FILLS.index(case.pool_fill) + 1) % len(POOL_FILLS)]
    baseline = impl(*_built(case, device))
    assert_equivalent(impl, contract, _built(replace(case, pool_fill=other_fill), device), baseline,
                      f"case {case}; unreferenced pages filled with {other_fill}")


def _poison_stays_put(impl, case, device, contract) -> None:
    inputs = _built(case, device)
    referenced = sorted(set(inputs.kv_indices.tolist()))
    if not referenced:
        return
    page = referenced[0]
    output, lse = impl(*poison_page(inputs, page, "k_cache", math.nan))
    reference = attend(*inputs)
    for seq in set(range(case.batch)) - sequences_reading(inputs, page):
        assert_within_bound(*result_rows(output, lse, slice(seq, seq + 1)),
                            reference_rows(reference, slice(seq, seq + 1)),
                            context=f"case {case}; k_cache[{page}] = nan reached sequence {seq}")


def _right_answer_or_clear_error(impl, case, device, contract) -> None:
    inputs = _built(case, device)
    try:
        result = impl(*inputs)
    except DestinationError:  # a destination-passing call that wrote outside its destinations refused nothing
        raise
    except Exception as error:  # a refusal is allowed; strict: TypeError/ValueError naming the input
        if contract == "strict":
            assert isinstance(error, (TypeError, ValueError)), f"case {case}: refused with {error!r}"
            assert any(name in str(error) for name in LAYOUT_ARGUMENTS), f"case {case}: unclear error {error!r}"
        return
    run_and_check(lambda *_: result, inputs, f"case {case}")


def _bad_input_refused(impl, case, device, contract) -> None:
    """One corruption of the bad-input table that reads no memory out of bounds when accepted (q in float16, a
    dtype the contract forbids) must be refused; the valid call after it must be within the bound."""
    inputs = _built(case, device)
    try:
        impl(*inputs._replace(q=inputs.q.to(torch.float16)))
    except DestinationError:
        raise
    except Exception:  # noqa: BLE001 - any refusal will do here (strict's wording is the property's own check)
        pass
    else:
        raise AssertionError(f"case {case}: q in float16 was accepted, not refused")
    run_and_check(impl, inputs, f"case {case}, the valid call after a refused one")


_CLAIMS: dict[str, Claim] = {
    "test_bad_input_is_refused_and_the_next_call_works": _bad_input_refused,
    "test_empty_sequences_give_zero_output_and_negative_infinite_lse": _empty_sequences,
    "test_a_sequence_gets_the_same_answer_alone_as_in_a_batch": _alone_and_batched,
    "test_moving_pages_to_other_slots_changes_nothing": _relabelled,
    "test_repeating_a_call_gives_the_same_answer": _repeated,
    "test_inputs_are_left_unchanged": _inputs_unchanged,
    "test_every_output_element_is_written": _every_output_written,
    "test_heads_sharing_a_kv_head_and_a_query_give_equal_results": _equal_heads,
    "test_junk_in_unreferenced_pages_changes_nothing": _junk_elsewhere,
    "test_junk_in_unused_slots_of_last_pages_changes_nothing": _junk_elsewhere,  # the fill reaches those slots too
    "test_nan_in_a_referenced_page_stays_in_the_sequences_reading_it": _poison_stays_put,
    "test_strided_and_sliced_inputs_give_the_right_answer_or_a_clear_error": _right_answer_or_clear_error,
}


def claim_for(prop: str) -> Claim:
    """The claim of a property, named by its node id or test function name (parameters ignored)."""
    function = prop.rpartition("::")[2].partition("[")[0]
    return _CLAIMS.get(function, within_bound)
