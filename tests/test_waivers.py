"""The ``empty_sequences`` waiver (engine/guarded.py): rows that see no key read as the contract's (0, -inf), for
decode (empty sequences) and causal prefill (rows whose causal window is empty, paged and ragged); every other row
is passed through as the implementation gave it, so the waiver cannot hide a wrong row that sees a key."""

import math
import warnings

import pytest
import torch

from adapters import torch_sdpa, torch_sdpa_prefill
from gqa_decode_fuzz.engine import guarded
from gqa_decode_fuzz.engine.target import Target
from gqa_decode_fuzz.generation import cases
from gqa_decode_fuzz.generation.cases import DecodeCase, build
from gqa_decode_fuzz.generation.oracles import oracle_of
from gqa_decode_fuzz.generation.prefill_cases import PrefillCase, build_prefill
from gqa_decode_fuzz.reference import assert_within_bound, definitions

# Per definition: a case with rows that see no key (an empty decode sequence; prefill rows of more queries than
# keys and a sequence of no keys), and its blind rows' count.
CASES = {
    "gqa_paged_decode_h32_kv4_d128_ps1": (DecodeCase(lengths=(3, 0, 5, 0)), 2),
    "gqa_paged_decode_h32_kv8_d128_ps64": (DecodeCase(lengths=(70, 0, 1)), 1),
    "gqa_paged_prefill_causal_h32_kv4_d128_ps1": (PrefillCase(q_lens=(5, 6, 3), kv_lens=(5, 3, 0)), 6),
    "gqa_paged_prefill_causal_h32_kv8_d128_ps64": (PrefillCase(q_lens=(6, 2, 0), kv_lens=(3, 130, 4)), 3),
    "gqa_ragged_prefill_causal_h8_kv1_d256": (PrefillCase(q_lens=(4, 3), kv_lens=(0, 2)), 5),
}


def _inputs(name: str):
    case, _ = CASES[name]
    if isinstance(case, PrefillCase):
        return build_prefill(PrefillCase(**{**vars(case), "definition": name, "scale": 0.1}), observe=False)
    return build(DecodeCase(**{**vars(case), "definition": name, "scale": 0.1}), observe=False)


def _blind_rows_poisoned(definition: definitions.Definition, wrong_seen_row: bool = False):
    """torch's math attention, with NaN output and +inf LSE in the rows that see no key (as FA2 answers them), and
    with ``wrong_seen_row`` also a wrong output in the first row that sees a key."""
    adapter = torch_sdpa_prefill if definition.prefill else torch_sdpa
    math_entry = adapter.math.for_definition(definition)

    def poisoned(*args):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns that q_len > kv_len rows see nothing
            output, lse = math_entry(*args)
        blind = torch.isneginf(lse[:, 0])
        output, lse = output.clone(), lse.clone()
        output[blind], lse[blind] = math.nan, math.inf
        if wrong_seen_row:
            output[(~blind).nonzero()[0, 0]] += 1.0
        return output, lse

    return poisoned


def _called(name: str, waives: frozenset[str], wrong_seen_row: bool = False):
    definition = definitions.by_name(name)
    target = Target("poisoned", _blind_rows_poisoned(definition, wrong_seen_row), waives=waives)
    inputs = _inputs(name)
    with cases.using_definition(definition):
        return inputs, guarded._as_declared(target, target.serving(definition))(*inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_waiver_reads_rows_that_see_no_key_as_zero_and_negative_infinity(name):
    inputs, (output, lse) = _called(name, frozenset({"empty_sequences"}))
    assert_within_bound(output, lse, oracle_of(inputs), context=name)
    assert int(torch.isneginf(lse[:, 0]).sum()) == CASES[name][1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_without_the_waiver_the_blind_rows_answers_are_checked(name):
    inputs, (output, lse) = _called(name, frozenset())
    with pytest.raises(AssertionError):
        assert_within_bound(output, lse, oracle_of(inputs), context=name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_waiver_leaves_rows_that_see_a_key_as_they_are(name):
    inputs, (output, lse) = _called(name, frozenset({"empty_sequences"}), wrong_seen_row=True)
    with pytest.raises(AssertionError):
        assert_within_bound(output, lse, oracle_of(inputs), context=name)


@pytest.mark.parametrize(("name", "case"), [
    ("gqa_paged_decode_h32_kv4_d128_ps1", DecodeCase(lengths=())),
    ("gqa_paged_prefill_causal_h32_kv4_d128_ps1", PrefillCase(q_lens=(), kv_lens=())),
])
def test_the_waiver_passes_a_batch_of_no_sequences_through(name, case, monkeypatch):
    # A batch of none has no row to mend: the waiver once built its row mask as a float tensor there and raised.
    monkeypatch.setitem(CASES, name, (case, 0))
    inputs, (output, lse) = _called(name, frozenset({"empty_sequences"}))
    assert output.shape[0] == lse.shape[0] == 0
    assert_within_bound(output, lse, oracle_of(inputs), context=name)
