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
import torch
from hypothesis import given, note
from hypothesis import strategies as st

from ._plugin.plugin import current_run
from .cases import KV_LAYOUTS, Q_LAYOUTS, build
from .checks import (
    assert_equivalent,
    assert_result_metadata,
    assert_same_result,
    assert_unchanged,
    assert_within_bound,
    poisoned_allocations,
    run_and_check,
    share_of_examples,
    shorter,
    snapshot,
)
from .strategies import decode_cases
from .transforms import copy_queries_within_groups, reference_rows, relabel_pages, result_rows, single_sequence

LIMITS = current_run().limits
SHORT = shorter(LIMITS)


@share_of_examples(0.5)
@given(case=decode_cases(limits=SHORT, min_batch=2))
def test_a_sequence_gets_the_same_answer_alone_as_in_a_batch(impl, device, case):
    inputs = build(case, device)
    batched_output, batched_lse, reference, _ = run_and_check(impl, inputs, f"case {case}")
    for seq in range(case.batch):
        alone = single_sequence(inputs, seq)
        output, lse = impl(*alone)
        context = f"case {case}, sequence {seq} alone"
        assert_result_metadata(output, lse, alone, context)
        # The oracle treats each sequence on its own: alone and batched are judged against one answer.
        assert_within_bound(output, lse, reference_rows(reference, slice(seq, seq + 1)), context=context)
        batched = result_rows(batched_output, batched_lse, slice(seq, seq + 1))
        if not (torch.equal(output, batched[0]) and (lse is None or torch.equal(lse, batched[1]))):
            note(f"sequence {seq}: alone and batched differ in the last bits (allowed; both within bound)")


@share_of_examples(0.5)
@given(case=decode_cases(limits=SHORT), extra_pages=st.integers(0, 64), relabel_seed=st.integers(0, 2**32 - 1))
def test_moving_pages_to_other_slots_changes_nothing(impl, contract, device, case, extra_pages, relabel_seed):
    inputs = build(case, device)
    moved = relabel_pages(inputs, extra_pages, torch.Generator().manual_seed(relabel_seed))
    assert_equivalent(impl, contract, moved, impl(*inputs), f"case {case}, pages relabelled into a pool +{extra_pages}")


@share_of_examples(0.5)
@given(case=decode_cases(limits=SHORT), other=decode_cases(limits=SHORT))
def test_repeating_a_call_gives_the_same_answer(impl, contract, device, case, other):
    inputs = build(case, device)
    first = impl(*inputs)
    impl(*build(other, device))  # a different call in between: no state may carry over
    assert_equivalent(impl, contract, inputs, first, f"case {case}, second call (after {other})")


@share_of_examples(0.5)
@given(case=decode_cases(limits=SHORT, q_layouts=Q_LAYOUTS, kv_layouts=KV_LAYOUTS, min_empty=0))
def test_inputs_are_left_unchanged(impl, device, case):
    inputs = build(case, device)
    before = snapshot(inputs)
    impl(*inputs)
    assert_unchanged(inputs, before, f"case {case}")


@share_of_examples(0.5)
@given(case=decode_cases(limits=SHORT, min_batch=0))
def test_every_output_element_is_written(impl, device, case):
    inputs = build(case, device)
    # Memory the implementation allocates but never writes stays NaN; a destination-passing one's destinations are
    # poisoned and checked by its adapter (_plugin/destinations.py), here and in every other property.
    with poisoned_allocations():
        output, lse = impl(*inputs)
    run_and_check(lambda *_: (output, lse), inputs, f"case {case}, fresh allocations filled with NaN")


@pytest.mark.strict  # under correct, rows may round differently by alignment; each is held to the bound elsewhere
@share_of_examples(0.5)
@given(case=decode_cases(limits=SHORT), copy_seed=st.integers(0, 2**32 - 1))
def test_heads_sharing_a_kv_head_and_a_query_give_equal_results(impl, device, case, copy_seed):
    inputs = build(case, device)
    q, pairs = copy_queries_within_groups(inputs.q, inputs.k_cache.shape[2], torch.Generator().manual_seed(copy_seed))
    output, lse = impl(*inputs._replace(q=q))
    for head, source in pairs:
        one_head = lambda h: (output[:, h:h + 1], None if lse is None else lse[:, h:h + 1])  # noqa: E731
        assert_same_result(
            one_head(head), one_head(source),
            f"case {case}: head {head} has the query of head {source} (same KV head), so the same result",
        )
