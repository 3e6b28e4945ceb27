"""Properties of causal prefill (paged and ragged), against the float64 prefill oracle.

They run for prefill definitions only (the ``prefill`` marker; the decode properties are deselected for prefill
definitions, these for decode ones). Query i of a sequence of q_len queries over kv_len keys sees keys
j <= i + kv_len - q_len; each row is judged within the oracle's bound over the keys it sees, and a row that sees
none must be output 0 and LSE -inf exactly.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gqa_decode_fuzz.generation.cases import HOSTILE_REGIMES, PAGE_LAYOUTS, POOL_FILLS, active_definition
from gqa_decode_fuzz.generation.prefill_cases import PrefillCase
from gqa_decode_fuzz.generation.prefill_strategies import prefill_cases
from gqa_decode_fuzz.generation.sizes import SizeLimits
from gqa_decode_fuzz.generation.strategies import run_sized, sequence_lengths

from . import prefill_claims
from .checks import share_of_examples, steer_toward_the_bound
from .claims import property_claim

pytestmark = pytest.mark.prefill



def _cases(lengths=None, **options) -> st.SearchStrategy[PrefillCase]:
    """``prefill_cases(**options)`` within the run's case sizes, built when it first draws (``run_sized``);
    ``lengths`` maps those sizes to the strategy for one sequence's (q_len, kv_len)."""
    return run_sized(lambda limits: prefill_cases(limits=limits, lengths=lengths and lengths(limits), **options))


def _overhanging(limits: SizeLimits) -> st.SearchStrategy[tuple[int, int]]:
    """More queries than keys, or no keys: the first rows of such a sequence see nothing."""
    return st.builds(lambda kv, extra: (min(kv + extra, limits.max_q_len), kv),
                     st.integers(0, min(8, limits.max_q_len - 1)), st.integers(1, limits.max_q_len))


def _one_query(limits: SizeLimits) -> st.SearchStrategy[tuple[int, int]]:
    return st.tuples(st.just(1), sequence_lengths(max_len=limits.max_kv_len))


@property_claim(prefill_claims.within_bound)
@given(case=_cases(page_layouts=PAGE_LAYOUTS))
@example(case=PrefillCase(q_lens=(5,), kv_lens=(5,)))  # a fresh prefill
@example(case=PrefillCase(q_lens=(6, 1), kv_lens=(3, 9)))  # the first three rows see nothing; a decode row
@example(case=PrefillCase(q_lens=(3, 0), kv_lens=(130, 4)))  # a short chunk after two key blocks; no queries
@example(case=PrefillCase(q_lens=(9,), kv_lens=(65,), pool_fill="nan"))  # tiles of 8 tokens; one key in a page
def test_prefill_output_and_lse_within_error_bound(impl, device, contract, case):
    steer_toward_the_bound(prefill_claims.within_bound(impl, case, device, contract).worst_ratio)


@pytest.mark.empty_sequences
@property_claim(prefill_claims.masked_rows_exact)
@given(case=_cases(lengths=_overhanging))
def test_prefill_rows_that_see_no_key_give_zero_output_and_negative_infinite_lse(impl, device, contract, case):
    prefill_claims.masked_rows_exact(impl, case, device, contract)


@property_claim(prefill_claims.keys_beyond_the_window_ignored)
@share_of_examples(0.25)
@given(case=_cases(), seq=st.integers(0, 7), cut=st.floats(0.0, 1.0))
@example(case=PrefillCase(q_lens=(4,), kv_lens=(70,)), seq=0, cut=0.97)  # rows 0..1 miss the last keys
def test_prefill_keys_beyond_a_rows_causal_window_change_nothing(impl, device, contract, case, seq, cut):
    prefill_claims.keys_beyond_the_window_ignored(impl, case, device, contract, seq=seq, cut=cut)


@property_claim(prefill_claims.chunked_like_whole)
@share_of_examples(0.25)
@given(case=_cases(), split=st.floats(0.0, 1.0))
@example(case=PrefillCase(q_lens=(12,), kv_lens=(80,)), split=0.5)
def test_chunked_prefill_gives_the_same_rows(impl, device, contract, case, split):
    prefill_claims.chunked_like_whole(impl, case, device, contract, split=split)


@property_claim(prefill_claims.one_query_is_decode)
@share_of_examples(0.5)
@given(case=_cases(lengths=_one_query))
def test_one_query_prefill_equals_decode_on_the_same_cache(impl, device, contract, case):
    prefill_claims.one_query_is_decode(impl, case, device, contract)


@pytest.mark.pool
@property_claim(prefill_claims.junk_elsewhere)
@share_of_examples(0.25)
@given(case=_cases(page_layouts=PAGE_LAYOUTS), other_fill=st.sampled_from(POOL_FILLS))
def test_prefill_junk_in_unreferenced_pages_and_slots_changes_nothing(impl, device, contract, case, other_fill):
    prefill_claims.junk_elsewhere(impl, case, device, contract, other_fill=other_fill)


@property_claim(prefill_claims.within_bound)
@share_of_examples(0.5)
@given(case=_cases(values=HOSTILE_REGIMES))
# Every logit below a finite mask sentinel (-5e4), and rows that see no key.
@example(case=PrefillCase(q_lens=(6, 3), kv_lens=(3, 70), values="beyond_sentinel", seed=1))
def test_prefill_extreme_logits_stay_within_error_bound(impl, device, contract, case):
    prefill_claims.within_bound(impl, case, device, contract)


@pytest.mark.input_validation
@property_claim(prefill_claims.bad_input_refused)
@pytest.mark.parametrize("corruption", sorted(prefill_claims.PREFILL_CORRUPTIONS))
@share_of_examples(0.125, at_least=3)
@given(case=_cases())
def test_prefill_bad_input_is_refused_and_the_next_call_works(impl, device, contract, corruption, case):
    if prefill_claims.PREFILL_CORRUPTIONS[corruption].needs_pool and active_definition().page_size == 0:
        pytest.skip(f"{corruption}: ragged K and V have no page pool")
    prefill_claims.bad_input_refused(impl, case, device, contract, corruption=corruption)
