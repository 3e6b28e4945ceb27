"""The oracle against a naive per-head implementation and against identities."""

import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gqa_decode_fuzz.generation.cases import DecodeCase, build, host_values
from gqa_decode_fuzz.generation.strategies import SizeLimits, decode_cases
from gqa_decode_fuzz.reference import attend, float32_scale

SMALL = SizeLimits(max_batch=3, max_len=40, max_spare_pages=16)


def naive_attention(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """Straight from the contract: one sequence, one head at a time, float64."""
    scale = float32_scale(sm_scale)
    batch = q.shape[0]
    output = torch.zeros(batch, 32, 128, dtype=torch.float64)
    lse = torch.full((batch, 32), -math.inf, dtype=torch.float64)
    for seq in range(batch):
        pages = kv_indices[int(kv_indptr[seq]):int(kv_indptr[seq + 1])].long()
        if pages.numel() == 0:
            continue
        for head in range(32):
            keys = k_cache[pages, 0, head // 8].double()
            values = v_cache[pages, 0, head // 8].double()
            logits = scale * (keys @ q[seq, head].double())
            top = logits.max()
            total = torch.exp(logits - top).sum()
            output[seq, head] = (torch.exp(logits - top) / total) @ values
            lse[seq, head] = (top + torch.log(total)) / math.log(2.0)
    return output, lse


@settings(max_examples=60)
@given(case=decode_cases(limits=SMALL, values=("normal", "wide", "peaky", "large_logits", "offset_values")))
def test_oracle_matches_naive_per_head_loop(case):
    inputs = build(case)
    reference = attend(*inputs)
    output, lse = naive_attention(*inputs.arguments())
    torch.testing.assert_close(reference.output, output, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(reference.lse, lse, rtol=1e-9, atol=1e-9)


@settings(max_examples=20)
@given(case=decode_cases(limits=SMALL, min_empty=1))
def test_empty_sequence_is_zero_and_negative_infinity_with_zero_bound(case):
    reference = attend(*build(case))
    for seq, length in enumerate(case.lengths):
        if length == 0:
            assert bool((reference.output[seq] == 0).all()) and bool((reference.lse[seq] == -math.inf).all())
            assert bool((reference.output_bound[seq] == 0).all()) and bool((reference.lse_bound[seq] == 0).all())


@settings(max_examples=20)
@given(case=decode_cases(limits=SMALL, min_batch=1), value=st.floats(-100, 100))
def test_constant_values_give_that_constant(case, value):
    inputs = build(case)
    constant = torch.tensor(value).to(torch.bfloat16)
    inputs = inputs._replace(v_cache=torch.full_like(inputs.v_cache, float(constant)))
    reference = attend(*inputs)
    for seq, length in enumerate(case.lengths):
        expected = float(constant) if length else 0.0
        torch.testing.assert_close(reference.output[seq], torch.full_like(reference.output[seq], expected))


@settings(max_examples=20)
@given(case=decode_cases(limits=SMALL))
def test_zero_scale_gives_mean_of_values_and_log2_length(case):
    inputs = build(DecodeCase(**{**case.__dict__, "scale": 0.0}))
    reference = attend(*inputs)
    for seq, length in enumerate(case.lengths):
        if length == 0:
            continue
        pages = inputs.kv_indices[int(inputs.kv_indptr[seq]):int(inputs.kv_indptr[seq + 1])].long()
        mean = inputs.v_cache[pages, 0].double().mean(0).repeat_interleave(8, dim=0)
        torch.testing.assert_close(reference.output[seq], mean)
        torch.testing.assert_close(reference.lse[seq], torch.full((32,), math.log2(length), dtype=torch.float64))


@settings(max_examples=20)
@given(case=decode_cases(limits=SMALL), data=st.data())
def test_permuting_a_sequences_tokens_changes_nothing(case, data):
    inputs = build(case)
    indices = inputs.kv_indices.clone()
    bounds = inputs.kv_indptr.tolist()
    for seq in range(case.batch):
        piece = indices[bounds[seq]:bounds[seq + 1]]
        order = data.draw(st.permutations(range(piece.numel())))
        indices[bounds[seq]:bounds[seq + 1]] = piece[list(order)] if order else piece
    before, after = attend(*inputs), attend(*inputs._replace(kv_indices=indices))
    torch.testing.assert_close(after.output, before.output, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(after.lse, before.lse, rtol=1e-12, atol=1e-12)


def test_chunking_gives_the_same_answer(monkeypatch):
    import gqa_decode_fuzz.reference.oracle as oracle

    inputs = build(DecodeCase(lengths=(5, 0, 33, 17), values="wide", seed=3))
    whole = attend(*inputs)
    monkeypatch.setattr(oracle, "_CHUNK_ELEMENTS", 1)  # one sequence per chunk
    torch.testing.assert_close(attend(*inputs), whole, rtol=1e-12, atol=1e-15)  # padding reorders float64 sums


@pytest.mark.parametrize("scale, expected", [(None, 1 / math.sqrt(128)), (0.1, 0.1)])
def test_scale_is_rounded_to_float32(scale, expected):
    assert float32_scale(scale) == float(torch.tensor(expected, dtype=torch.float32))


def test_bound_is_the_same_one_head_or_all_heads_at_a_time(monkeypatch):
    import gqa_decode_fuzz.reference.bound as bound

    inputs = build(DecodeCase(lengths=(5, 0, 33, 17), values="outliers", seed=4))
    whole = attend(*inputs)
    monkeypatch.setattr(bound, "_DEVIATION_ELEMENTS", 1)  # one query head per pass
    torch.testing.assert_close(attend(*inputs), whole, rtol=1e-12, atol=1e-15)


@settings(max_examples=30)
@given(case=decode_cases(limits=SMALL))
def test_lengths_known_on_the_host_give_the_same_bits(case):
    """The builder's host copy of kv_indptr (no read-back) gives the oracle's every output bit for bit."""
    inputs = build(case)
    known = host_values(inputs.kv_indptr)
    assert known == inputs.kv_indptr.tolist()
    for read_back, from_host in zip(attend(*inputs), attend(*inputs, indptr_on_host=known)):
        assert torch.equal(read_back.view(torch.int64), from_host.view(torch.int64))


def test_lengths_given_on_the_host_are_used_instead_of_the_tensor():
    """A kernel that wrote into its kv_indptr is still held to the call it was given."""
    inputs = build(DecodeCase(lengths=(7, 0, 12), seed=5))
    given = inputs.kv_indptr.tolist()
    expected = attend(*inputs)
    inputs.kv_indptr.copy_(torch.tensor([0, 1, 1, 2]))  # what such a kernel might leave behind
    assert host_values(inputs.kv_indptr) is None
    for fresh, from_host in zip(expected, attend(*inputs, indptr_on_host=given)):
        assert torch.equal(fresh.view(torch.int64), from_host.view(torch.int64))


@pytest.mark.parametrize("count, smallest, half_steps, expected", [
    (0, 1, False, 1), (1, 1, False, 1), (3, 1, False, 4), (16, 1, False, 16), (17, 1, False, 32),
    (0, 16, True, 16), (17, 16, True, 24), (24, 16, True, 24), (25, 16, True, 32), (33, 16, True, 48),
    (1537, 16, True, 2048), (2049, 16, True, 3072),
])
def test_graph_shapes_round_up(count, smallest, half_steps, expected):
    import gqa_decode_fuzz.reference.oracle as oracle

    assert oracle._round_up(count, smallest, half_steps=half_steps) == expected


def _padded_reference(inputs, shape, q_junk=math.nan):
    """The oracle computed eagerly in a graph's padded shape (stale q rows beyond the batch), cut to the batch."""
    import gqa_decode_fuzz.reference.oracle as oracle

    bounds = inputs.kv_indptr.tolist()
    starts, lengths = bounds[:-1], [b - a for a, b in zip(bounds, bounds[1:])]
    rows = oracle._empty_rows(*shape, oracle._Shape.of(inputs.q, inputs.k_cache), inputs.q.device)
    rows.q.fill_(q_junk)  # what a previous, larger batch may have left
    scale = float32_scale(inputs.sm_scale)
    oracle._fill(rows, inputs.q, inputs.k_cache, inputs.v_cache, inputs.kv_indices, starts, lengths, scale)
    return [field[:len(lengths)] for field in oracle._reference_of(rows)]


@settings(max_examples=40)
@given(case=decode_cases(limits=SMALL))
def test_padding_to_a_graph_shape_gives_the_same_answer(case):
    """The shapes a GPU replays add masked token slots and empty sequences: the answer agrees to float64 rounding."""
    import gqa_decode_fuzz.reference.oracle as oracle

    inputs = build(case)
    shape = oracle._graph_shape(case.batch, max(case.lengths, default=0))
    for exact, padded in zip(attend(*inputs), _padded_reference(inputs, shape)):
        # atol: a logsumexp over more (masked) slots rounds at the ulp of its maximum, |log w| up to ~10
        torch.testing.assert_close(padded, exact, rtol=1e-12, atol=1e-13)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replays_give_the_padded_computation_bit_for_bit(monkeypatch):
    """On CUDA: a replayed graph gives the bits of the same padded computation run eagerly, each call keeps its
    own answer (the graph's outputs are copied out), and without graphs the answers agree to rounding."""
    import gqa_decode_fuzz.reference.oracle as oracle

    oracle._GRAPHS.clear()
    cases = [DecodeCase(lengths=(5, 0, 33), values="wide", seed=3), DecodeCase(lengths=(40, 2, 7), seed=4),
             DecodeCase(lengths=(0, 0, 1), seed=5), DecodeCase(lengths=(700,), values="outliers", seed=6)]
    built = [build(case, "cuda", observe=False) for case in cases]
    replayed = [attend(*inputs) for inputs in built]  # the first two share a graph: 4 sequences, 48 slots
    # a key: the padded (sequences, slots), then the definition's shape constants (the seed's here)
    assert sorted(key[:2] for _, key in oracle._GRAPHS._captured) == [(1, 768), (4, 16), (4, 48)]
    for case, inputs, reference in zip(cases, built, replayed):
        shape = oracle._graph_shape(case.batch, max(case.lengths))
        for got, expected in zip(reference, _padded_reference(inputs, shape, q_junk=0.0)):
            assert torch.equal(got.view(torch.int64), expected.view(torch.int64)), case
    monkeypatch.setenv("GQA_DECODE_ORACLE_GRAPHS", "0")
    for inputs, reference in zip(built, replayed):
        for got, eager in zip(reference, attend(*inputs)):
            torch.testing.assert_close(got, eager, rtol=1e-12, atol=1e-13)


RAGGED = SizeLimits(max_batch=6, max_len=300, max_spare_pages=64)


@settings(max_examples=25, deadline=None)
@given(case=decode_cases(limits=RAGGED, values=("normal", "wide", "outliers")))
def test_rows_grouped_by_length_give_the_answer_of_one_padded_batch(case):
    """Every cut the grouping may make (a group costing nothing) gives each sequence its own answer and bound, in
    the call's order, to float64 rounding; against the naive loop as well."""
    import gqa_decode_fuzz.reference.oracle as oracle

    inputs = build(case)
    with mock.patch.object(oracle, "_GROUP_COST_SLOTS", 10**9):  # never cut: one batch, in order
        whole = attend(*inputs)
    with mock.patch.object(oracle, "_GROUP_COST_SLOTS", 0):  # cut wherever the padded length changes
        grouped = attend(*inputs)
    for exact, cut in zip(whole, grouped):
        torch.testing.assert_close(cut, exact, rtol=1e-12, atol=1e-13)
    output, lse = naive_attention(*inputs.arguments())
    torch.testing.assert_close(grouped.output, output, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grouped.lse, lse, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("graphed", [False, True])
@pytest.mark.parametrize("lengths, expected", [
    ([], [[]]), ([7], [[0]]), ([5, 0, 33, 17], [[0, 1, 2, 3]]),  # cutting saves less than a group costs
    ([2048] + [16] * 15, [[0], list(range(1, 16))]),  # one long row apart from fifteen short ones
    ([3, 2048, 1, 2000, 5], [[1, 3], [4, 0, 2]]),  # longest first, then the rest longest first
])
def test_rows_are_grouped_by_length_where_padding_costs_more_than_a_group(lengths, expected, graphed):
    import gqa_decode_fuzz.reference.oracle as oracle

    assert oracle._length_groups(lengths, graphed) == expected
