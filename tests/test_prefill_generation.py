"""Causal prefill generation: the strategy reaches each edge, and the builder's tensors match the descriptor."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from gqa_decode_fuzz.generation import cases
from gqa_decode_fuzz.generation.prefill_cases import PrefillCase, build_prefill
from gqa_decode_fuzz.generation.prefill_strategies import (
    LENGTH_SHAPES,
    length_shape,
    prefill_cases,
    query_and_key_lengths,
    query_block_edges,
)
from gqa_decode_fuzz.generation.sizes import SizeLimits
from gqa_decode_fuzz.generation.strategies import decode_cases
from gqa_decode_fuzz.reference import definitions

PS1 = definitions.by_name("gqa_paged_prefill_causal_h32_kv4_d128_ps1")
PS64 = definitions.by_name("gqa_paged_prefill_causal_h32_kv4_d128_ps64")
RAGGED = definitions.by_name("gqa_ragged_prefill_causal_h32_kv8_d128")
RAGGED_256 = definitions.by_name("gqa_ragged_prefill_causal_h8_kv1_d256")
LIMITS = SizeLimits()
FIND = settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck))


def _pairs(page_size: int = 1, group: int = 8):
    return query_and_key_lengths(max_q_len=LIMITS.max_q_len, max_kv_len=LIMITS.max_kv_len, page_size=page_size,
                                 group=group)


@pytest.mark.parametrize("shape", LENGTH_SHAPES[1:])
def test_each_length_shape_is_reached(shape):
    q_len, kv_len = find(_pairs(), lambda pair: length_shape(*pair) == shape, settings=FIND)
    assert length_shape(q_len, kv_len) == shape


def test_a_short_chunk_after_a_long_prefix_is_reached():
    q_len, kv_len = find(_pairs(), lambda p: 1 < p[0] <= 8 and p[1] >= 64 + p[0], settings=FIND)
    assert kv_len - q_len >= 64


@pytest.mark.parametrize("edge", [63, 64, 65, 128, 129])
def test_key_counts_reach_block_and_page_edges(edge):
    find(_pairs(page_size=64), lambda p: p[1] == edge and p[0] > 0, settings=FIND)


@pytest.mark.parametrize("group", [8, 2])
def test_query_counts_reach_tile_edges(group):
    tile = 64 // group  # query tokens per 64-row tile
    assert {tile - 1, tile, tile + 1} <= set(query_block_edges(max_q_len=LIMITS.max_q_len, group=group))
    find(_pairs(group=group), lambda p: p[0] == tile + 1, settings=FIND)


@given(pair=_pairs())
@settings(max_examples=300, database=None)
def test_lengths_stay_within_the_limits(pair):
    q_len, kv_len = pair
    assert 0 <= q_len <= LIMITS.max_q_len and 0 <= kv_len <= LIMITS.max_kv_len


@pytest.mark.parametrize("layout", ["shuffled", "contiguous", "shared_prefix", "pool_end"])
def test_cases_reach_every_page_layout_under_a_paged_definition(layout):
    with cases.using_definition(PS64):
        case = find(prefill_cases(limits=LIMITS, page_layouts=cases.PAGE_LAYOUTS),
                    lambda c: c.page_layout == layout and c.spare_pages > 0, settings=FIND)
    assert case.definition == PS64.name


def test_prefill_cases_refuse_a_decode_definition():
    with cases.using_definition(definitions.SEED), pytest.raises(Exception, match="decode definition"):
        find(prefill_cases(), lambda c: True, settings=FIND)


def _key_rows(inputs, case: PrefillCase, seq: int) -> torch.Tensor:
    """Sequence ``seq``'s keys in token order, read through the index tensors (K pool or ragged K)."""
    start = inputs.kv_indptr.tolist()[seq]
    if inputs.ragged:
        return inputs.k_cache[start:start + case.kv_lens[seq]]
    page = inputs.k_cache.shape[1]
    pages = inputs.kv_indices.tolist()[start:]
    return torch.stack([inputs.k_cache[pages[j // page], j % page] for j in range(case.kv_lens[seq])]) \
        if case.kv_lens[seq] else inputs.k_cache[:0, 0]


@pytest.mark.parametrize("definition", [PS1, PS64, RAGGED, RAGGED_256], ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["shuffled", "shared_prefix"])
def test_built_tensors_match_the_descriptor(definition, layout):
    case = PrefillCase(q_lens=(3, 0, 5, 2), kv_lens=(70, 4, 2, 0), page_layout=layout, spare_pages=3,
                       definition=definition.name, seed=7)
    inputs = build_prefill(case)
    heads, kv_heads, dim = definition.num_qo_heads, definition.num_kv_heads, definition.head_dim
    assert inputs.q.shape == (case.total_q, heads, dim) and inputs.q.dtype == torch.bfloat16
    assert inputs.qo_indptr.tolist() == [0, 3, 3, 8, 10]
    assert cases.host_values(inputs.qo_indptr) == [0, 3, 3, 8, 10]
    assert len(inputs.arguments()) == len(definition.arguments)
    if definition.op_type == definitions.RAGGED_PREFILL:
        assert inputs.k_cache.shape == (sum(case.kv_lens), kv_heads, dim)
        assert inputs.kv_indptr.tolist() == [0, 70, 74, 76, 76] and inputs.kv_indices is None
    else:
        page = definition.page_size
        assert inputs.k_cache.shape[1:] == (page, kv_heads, dim)
        assert inputs.kv_indptr.tolist() == [0, *torch.tensor(cases.page_counts(case.kv_lens, page)).cumsum(0)]
        assert (inputs.kv_last_page_len is None) == (page == 1)
        if page > 1:
            assert inputs.kv_last_page_len.tolist() == [6, 4, 2, 0]
    for seq in range(case.batch):
        assert torch.isfinite(_key_rows(inputs, case, seq).float()).all()  # every key written, junk elsewhere
    if layout == "shared_prefix" and definition.page_size == 1:
        first = [inputs.kv_indices[inputs.kv_indptr[s]].item() for s in (0, 1, 2)]
        assert len(set(first)) == 1  # a shared first page


def test_junk_stays_outside_the_keys():
    case = PrefillCase(q_lens=(2,), kv_lens=(65,), spare_pages=2, pool_fill="nan", definition=PS64.name)
    inputs = build_prefill(case)
    assert math.isnan(inputs.k_cache[inputs.kv_indices[1], 1, 0, 0].item())  # the last page's second slot


@given(st.data())
@settings(max_examples=20, database=None)
def test_decode_draws_are_unchanged_by_the_prefill_modules(data):
    """The decode builder, refactored to share its pieces with prefill, builds what a plain DecodeCase says."""
    case = data.draw(decode_cases(limits=SizeLimits(max_batch=2, max_len=40, max_spare_pages=4)))
    inputs = cases.build(case)
    assert inputs.q.shape[0] == case.batch
    assert inputs.kv_indptr.tolist()[-1] == sum(cases.page_counts(case.lengths, case.shape.page_size))
