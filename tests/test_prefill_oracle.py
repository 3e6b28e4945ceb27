"""The float64 causal-prefill oracle (``reference.prefill_oracle``): against a naive per-row float64 loop, its
fully-masked rows exact, paged and ragged alike, and its bound holding for float32 computations (every built-in
prefill definition's own reference) while failing planted errors (top-left alignment, NaN for rows that see
nothing, a dropped key)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gqa_decode_fuzz.generation.cases import DecodeCase, build, using_definition
from gqa_decode_fuzz.reference.compare import check_against_reference
from gqa_decode_fuzz.reference.definitions import PAGED_PREFILL, PREFILL, RAGGED_PREFILL, Definition, built_in
from gqa_decode_fuzz.reference.oracle import float32_scale
from gqa_decode_fuzz.reference.prefill_oracle import attend_paged_prefill, attend_ragged_prefill, visible_keys

PREFILL_BUILT_IN = built_in(*PREFILL)
SMALL = Definition("gqa_paged_prefill_causal_h4_kv2_d16_ps4", 4, 2, 16, 4, op_type=PAGED_PREFILL)
# (q_lens, kv_lens) per sequence: q_len > kv_len (first rows see nothing), q_len = kv_len (a fresh prefill),
# q_len = 1 (decode), a short chunk after a long prefix (chunked prefill), empty q, empty kv, both empty.
LENGTHS = [
    ((5, 3, 1, 2), (2, 3, 9, 20)),
    ((0, 4, 3), (6, 0, 0)),
    ((1, 1, 7), (1, 70, 7)),
    ((), ()),
    ((0, 0), (0, 0)),
]


@dataclass
class PrefillCall:
    """A causal prefill call in both layouts: the paged cache the decode builder makes (shuffled page ids, NaN in
    spare pages and unused last-page slots) and the same tokens gathered into ragged K/V."""

    q: torch.Tensor
    qo_indptr: torch.Tensor
    paged: tuple  # k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len or None
    ragged: tuple  # k, v, kv_indptr (tokens)
    sm_scale: float


def _pool_shape(definition: Definition) -> Definition:
    """The decode definition whose builder makes this prefill's page pool (ragged: one-token pages)."""
    page_size = max(definition.page_size, 1)
    return Definition(f"pool_h{definition.num_qo_heads}_kv{definition.num_kv_heads}_d{definition.head_dim}_ps"
                      f"{page_size}", definition.num_qo_heads, definition.num_kv_heads, definition.head_dim, page_size)


def _tokens(k_cache, kv_indptr, kv_indices, lengths: tuple[int, ...]) -> torch.Tensor:
    """Every sequence's tokens, in order, out of the page pool: [sum(lengths), H_kv, D]."""
    rows = []
    for b, length in enumerate(lengths):
        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
        rows.append(k_cache[pages].reshape(-1, *k_cache.shape[2:])[:length])
    return torch.cat(rows) if rows else k_cache.new_zeros(0, *k_cache.shape[2:])


def prefill_call(definition: Definition, q_lens, kv_lens, *, values="normal", scale=None, seed=0) -> PrefillCall:
    """The call ``q_lens`` and ``kv_lens`` describe, for ``definition``'s shape (random values, ``values`` regime)."""
    with using_definition(_pool_shape(definition)):
        pool = build(DecodeCase(lengths=tuple(kv_lens), spare_pages=2, values=values, scale=scale, seed=seed))
        queries = build(DecodeCase(lengths=(1,) * sum(q_lens), values=values, seed=seed + 1)).q
    qo_indptr = torch.tensor([0, *torch.tensor(q_lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    kv_tokens = torch.tensor([0, *torch.tensor(kv_lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    pages = (pool.k_cache, pool.v_cache, pool.kv_indptr, pool.kv_indices, pool.kv_last_page_len)
    k = _tokens(pool.k_cache, pool.kv_indptr, pool.kv_indices, tuple(kv_lens))
    v = _tokens(pool.v_cache, pool.kv_indptr, pool.kv_indices, tuple(kv_lens))
    return PrefillCall(queries, qo_indptr, pages, (k, v, kv_tokens), float32_scale(scale, definition.head_dim))


def oracle(call: PrefillCall, ragged: bool):
    if ragged:
        return attend_ragged_prefill(call.q, *call.ragged[:2], call.qo_indptr, call.ragged[2], call.sm_scale)
    k_cache, v_cache, kv_indptr, kv_indices, last = call.paged
    return attend_paged_prefill(call.q, k_cache, v_cache, call.qo_indptr, kv_indptr, kv_indices, call.sm_scale, last)


def naive_prefill(call: PrefillCall, *, top_left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Straight from the contract, float64, one sequence, row and head at a time: query i of q_len sees keys
    j <= i + kv_len - q_len (``top_left``: j <= i, the planted error)."""
    k, v, kv_indptr = call.ragged
    rows, heads, dim = call.q.shape
    group = heads // k.shape[1]
    output = torch.zeros(rows, heads, dim, dtype=torch.float64)
    lse = torch.full((rows, heads), -math.inf, dtype=torch.float64)
    for b in range(call.qo_indptr.numel() - 1):
        first, end = int(call.qo_indptr[b]), int(call.qo_indptr[b + 1])
        keys, values = k[int(kv_indptr[b]):int(kv_indptr[b + 1])], v[int(kv_indptr[b]):int(kv_indptr[b + 1])]
        for i in range(end - first):
            seen = i + 1 if top_left else i + 1 + keys.shape[0] - (end - first)
            seen = min(max(seen, 0), keys.shape[0])
            if seen == 0:
                continue
            for head in range(heads):
                logits = call.sm_scale * (keys[:seen, head // group].double() @ call.q[first + i, head].double())
                top = logits.max()
                total = torch.exp(logits - top).sum()
                output[first + i, head] = (torch.exp(logits - top) / total) @ values[:seen, head // group].double()
                lse[first + i, head] = (top + torch.log(total)) / math.log(2.0)
    return output, lse


def test_visible_keys_are_bottom_right_aligned():
    sequence, seen = visible_keys(torch.tensor([3, 0, 2, 1]), torch.tensor([1, 5, 4, 0]))
    assert sequence.tolist() == [0, 0, 0, 2, 2, 3]
    assert seen.tolist() == [0, 0, 1, 3, 4, 0]


@pytest.mark.parametrize("ragged", [False, True], ids=["paged", "ragged"])
@pytest.mark.parametrize("q_lens, kv_lens", LENGTHS)
def test_oracle_matches_a_naive_per_row_loop(q_lens, kv_lens, ragged):
    call = prefill_call(SMALL, q_lens, kv_lens, seed=len(q_lens))
    reference = oracle(call, ragged)
    output, lse = naive_prefill(call)
    torch.testing.assert_close(reference.output, output, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(reference.lse, lse, rtol=1e-9, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 13)), max_size=4), seed=st.integers(0, 99),
       values=st.sampled_from(["normal", "wide", "peaky", "large_logits"]))
def test_oracle_matches_a_naive_per_row_loop_on_drawn_lengths(lengths, seed, values):
    q_lens, kv_lens = [q for q, _ in lengths], [n for _, n in lengths]
    call = prefill_call(SMALL, q_lens, kv_lens, values=values, seed=seed)
    output, lse = naive_prefill(call)
    for ragged in (False, True):
        reference = oracle(call, ragged)
        torch.testing.assert_close(reference.output, output, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(reference.lse, lse, rtol=1e-9, atol=1e-9)


def test_rows_that_see_no_key_are_zero_and_negative_infinity_with_zero_bound():
    call = prefill_call(SMALL, (5, 2, 3), (2, 0, 3), seed=7)
    for ragged in (False, True):
        reference = oracle(call, ragged)
        blind = torch.tensor([1, 1, 1, 0, 0, 1, 1, 0, 0, 0], dtype=torch.bool)  # 5 over 2 keys; no keys; 3 over 3
        assert bool((reference.output[blind] == 0).all()) and bool((reference.lse[blind] == -math.inf).all())
        assert not reference.output_bound[blind].any() and not reference.lse_bound[blind].any()
        assert bool(reference.lse[~blind].isfinite().all()) and bool((reference.output_bound[~blind] > 0).all())


def test_paged_and_ragged_give_the_same_rows():
    call = prefill_call(SMALL, (3, 9, 1), (11, 9, 30), values="peaky", seed=3)
    paged, ragged = oracle(call, False), oracle(call, True)
    for ours, theirs in zip(paged, ragged):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def _their_reference(definition: Definition):
    scope: dict = {}
    exec(compile(definition.reference, f"<{definition.name} reference>", "exec"), scope)  # noqa: S102 - our own data
    return scope["run"]


def _run_reference(definition: Definition, call: PrefillCall, run=None):
    """The definition's own float32 reference on ``call``, in its argument order."""
    run = run or _their_reference(definition)
    if definition.op_type == RAGGED_PREFILL:
        k, v, kv_indptr = call.ragged
        return run(call.q, k, v, call.qo_indptr, kv_indptr, call.sm_scale)
    k_cache, v_cache, kv_indptr, kv_indices, last = call.paged
    pages = (call.q, k_cache, v_cache, call.qo_indptr, kv_indptr, kv_indices)
    return run(*pages, *([last] if definition.paged else []), call.sm_scale)


CASES = [  # (q_lens, kv_lens, values, scale)
    ((5, 3, 1, 2), (2, 3, 9, 20), "normal", None),
    ((0, 4, 3), (6, 0, 0), "wide", None),
    ((1, 7, 2), (70, 7, 65), "peaky", 0.3),
    ((), (), "normal", None),
    ((4,), (130,), "large_logits", None),
]


@pytest.mark.parametrize("name", sorted(PREFILL_BUILT_IN))
def test_each_prefill_definitions_own_reference_is_within_the_bound(name):
    """Its float32 reference is a correct implementation: within the float64 oracle's bound on cases with
    q_len > kv_len, q_len = kv_len, q_len = 1, empty q and empty kv; its rows that see nothing exact."""
    definition = PREFILL_BUILT_IN[name]
    for seed, (q_lens, kv_lens, values, scale) in enumerate(CASES):
        call = prefill_call(definition, q_lens, kv_lens, values=values, scale=scale, seed=seed)
        with torch.no_grad():
            output, lse = _run_reference(definition, call)
        mismatches = check_against_reference(output, lse, oracle(call, definition.op_type == RAGGED_PREFILL))
        assert all(m.ok for m in mismatches), (name, q_lens, kv_lens, [m.message for m in mismatches])


def _float32_prefill(call: PrefillCall, *, alignment: str = "bottom_right", blind: str = "zero", drop_last=False):
    """A float32 computation of the call through the ragged definition's reference pattern, with planted errors:
    ``alignment="top_left"`` (query i sees keys j <= i), ``blind="nan"`` (a softmax over all -inf for rows that see
    nothing), ``drop_last`` (every row misses its last visible key)."""
    k, v, kv_indptr = call.ragged
    rows, heads, dim = call.q.shape
    group = heads // k.shape[1]
    output = torch.zeros(rows, heads, dim, dtype=torch.bfloat16)
    lse = torch.full((rows, heads), -math.inf)
    for b in range(call.qo_indptr.numel() - 1):
        first, end = int(call.qo_indptr[b]), int(call.qo_indptr[b + 1])
        keys = k[int(kv_indptr[b]):int(kv_indptr[b + 1])].float().repeat_interleave(group, dim=1)
        values = v[int(kv_indptr[b]):int(kv_indptr[b + 1])].float().repeat_interleave(group, dim=1)
        offset = 0 if alignment == "top_left" else keys.shape[0] - (end - first)
        last = torch.arange(end - first)[:, None] + offset - int(drop_last)
        seen = torch.arange(keys.shape[0])[None, :] <= last
        logits = torch.einsum("qhd,lhd->hql", call.q[first:end].float(), keys) * call.sm_scale
        logits = logits.masked_fill(~seen, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)
        weights = torch.softmax(logits, dim=-1)  # NaN where a row sees nothing
        if blind == "zero":
            weights = weights.masked_fill(~seen, 0.0)
        output[first:end] = torch.einsum("hql,lhd->qhd", weights, values).to(torch.bfloat16)
        lse[first:end] = (row_lse / math.log(2.0)).transpose(0, 1)
    return output, lse


PLANTED = [
    pytest.param({}, True, id="correct"),
    pytest.param({"alignment": "top_left"}, False, id="top_left"),
    pytest.param({"blind": "nan"}, False, id="nan_for_rows_that_see_nothing"),
    pytest.param({"drop_last": True}, False, id="drop_last_visible_key"),
]


@pytest.mark.parametrize("ragged", [False, True], ids=["paged", "ragged"])
@pytest.mark.parametrize("planted, passes", PLANTED)
def test_the_bound_holds_for_float32_and_fails_planted_errors(planted, passes, ragged):
    definition = built_in(PAGED_PREFILL)["gqa_paged_prefill_causal_h32_kv4_d128_ps64"]
    call = prefill_call(definition, (6, 1, 40, 3), (3, 50, 40, 0), seed=11)
    mismatches = check_against_reference(*_float32_prefill(call, **planted), oracle(call, ragged))
    assert all(m.ok for m in mismatches) is passes, [m.message for m in mismatches]
