"""Edge shapes: batch 0, every sequence empty, single tokens, lengths at block edges, 128k-token sequences."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gqa_decode_fuzz.generation.cases import DecodeCase
from gqa_decode_fuzz.generation.strategies import block_edge_lengths, decode_cases, run_sized
from gqa_decode_fuzz.properties import claims
from gqa_decode_fuzz.properties.checks import share_of_examples
from gqa_decode_fuzz.properties.claims import property_claim

LONG_CONTEXT = 128 * 1024


@property_claim(claims.within_bound)
@share_of_examples(0.25)
@given(case=run_sized(lambda limits: decode_cases(limits=replace(limits, max_batch=0), min_batch=0)))
# The seed launched a grid of 0 programs for batch 0 (an error or a poisoned context on some stacks).
@example(case=DecodeCase(lengths=()))
def test_batch_zero_gives_empty_results(impl, device, contract, case):
    claims.within_bound(impl, case, device, contract)


@property_claim(claims.within_bound)
@pytest.mark.empty_sequences
@share_of_examples(0.25)
@given(case=run_sized(lambda limits: decode_cases(limits=limits, lengths=st.just(0))))
@example(case=DecodeCase(lengths=(0,)))  # a pool of 0 pages
def test_all_sequences_empty_give_zero_output_and_negative_infinite_lse(impl, device, contract, case):
    claims.within_bound(impl, case, device, contract)


@property_claim(claims.within_bound)
@share_of_examples(0.25)
@given(case=run_sized(lambda limits: decode_cases(limits=limits, lengths=st.sampled_from([1, 0]))))
# Any CPU run of the seed: it demanded CUDA even for CPU tensors.
@example(case=DecodeCase(lengths=(1,)))
def test_single_token_sequences_stay_within_error_bound(impl, device, contract, case):
    claims.within_bound(impl, case, device, contract)


@property_claim(claims.within_bound)
@share_of_examples(0.5)
@given(case=run_sized(lambda limits: decode_cases(limits=limits, lengths=block_edge_lengths(max_len=limits.max_len))))
def test_lengths_at_block_edges_stay_within_error_bound(impl, device, contract, case):
    claims.within_bound(impl, case, device, contract)


@property_claim(claims.within_bound)
@pytest.mark.gpu
@share_of_examples(0.1, at_least=3)
@given(
    case=run_sized(lambda limits: decode_cases(limits=replace(limits, max_batch=2, max_len=2048, max_spare_pages=4096),
                                               min_batch=0)),
    long_length=st.sampled_from([LONG_CONTEXT, LONG_CONTEXT - 1, LONG_CONTEXT + 1]),
    position=st.integers(0, 2),
)
@example(case=DecodeCase(lengths=(1,), values="peaky"), long_length=LONG_CONTEXT, position=0)
def test_128k_token_sequences_stay_within_error_bound(impl, device, contract, case, long_length, position):
    lengths = list(case.lengths)
    lengths.insert(min(position, len(lengths)), long_length)
    case = replace(case, lengths=tuple(lengths))
    claims.within_bound(impl, case, device, contract)
