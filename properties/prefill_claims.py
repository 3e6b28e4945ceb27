"""Causal prefill's claims: each prefill property's body, as a function of its case and the test's other draws.

Called as the decode claims are (``claims``): ``claim(impl, case, device, contract, **draws)`` with a
``PrefillCase``; each tells the claim observers its case and draws first, raises when it does not hold, raises
``UnsatisfiedAssumption`` when it does not apply to its case, and returns None (``within_bound``: the check's
result) when it holds. The oracle is ``reference.prefill_oracle`` through ``checks.run_and_check``: one row per
query token, a row that sees no key output 0 and LSE -inf exactly (its bound is 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from gqa_decode_fuzz.engine.target import ImplSpecError
from gqa_decode_fuzz.generation import cases
from gqa_decode_fuzz.generation.prefill_cases import PrefillCase, PrefillInputs, build_prefill
from gqa_decode_fuzz.generation.prefill_transforms import (
    Piece,
    as_decode,
    perturb_keys,
    sub_call,
    token_slots,
    unaffected_rows,
)
from gqa_decode_fuzz.reference import Reference, definitions

from .checks import Checked, assert_equivalent, assert_result_metadata, assert_within_bound, oracle_of, run_and_check
from .claims import _applies, _claim, _next_fill, _note, _refused_clearly, assert_empty_sequences_exact
from .corruptions import is_refusal

__all__ = ["PREFILL_CORRUPTIONS", "bad_input_refused", "chunked_like_whole", "junk_elsewhere",
           "keys_beyond_the_window_ignored", "masked_rows_exact", "one_query_is_decode", "within_bound"]


def _rows(reference: Reference, rows: list[int] | torch.Tensor) -> Reference:
    index = torch.as_tensor(rows, dtype=torch.int64).to(reference.output.device)
    return Reference(*(t[index] for t in reference))


def _result_rows(output: torch.Tensor, lse: torch.Tensor | None, rows: list[int] | torch.Tensor) -> tuple:
    index = torch.as_tensor(rows, dtype=torch.int64).to(output.device)
    return output[index], None if lse is None else lse[index]


@_claim
def within_bound(impl, case: PrefillCase, device, contract) -> Checked:
    """The call's output and LSE are within the oracle's bound, row by row (masked rows exactly 0 and -inf)."""
    return run_and_check(impl, build_prefill(case, device), f"case {case}")


@_claim
def masked_rows_exact(impl, case: PrefillCase, device, contract) -> None:
    """Every row that sees no key (more queries than keys, or no keys) is output 0 and LSE -inf exactly."""
    seen = [n for row in case.visible() for n in row]
    _applies(0 in seen)
    output, lse = impl(*build_prefill(case, device))
    assert_empty_sequences_exact(output, lse, tuple(seen))  # a row per "sequence": a masked row is an empty one


@_claim
def keys_beyond_the_window_ignored(impl, case: PrefillCase, device, contract, seq: int = 0,
                                   cut: float = 0.5) -> None:
    """Changing keys that some rows cannot see (sequence ``seq``'s keys from ``cut`` of the way on) leaves those
    rows within the bound of the unchanged call's answer."""
    _applies(any(case.kv_lens))
    seq = [s for s, n in enumerate(case.kv_lens) if n][seq % sum(1 for n in case.kv_lens if n)]
    inputs = build_prefill(case, device)
    slots = token_slots(inputs, case)
    first = min(int(cut * case.kv_lens[seq]), case.kv_lens[seq] - 1)
    changed = set(slots[seq][first:])
    rows = unaffected_rows(case, slots, changed)
    _applies(bool(rows))
    _note(f"keys {first}.. of sequence {seq} changed; rows that cannot see them: {rows}")
    reference = oracle_of(inputs)
    output, lse = impl(*perturb_keys(inputs, sorted(changed)))
    assert_result_metadata(output, lse, inputs, f"case {case}")
    assert_within_bound(*_result_rows(output, lse, rows), _rows(reference, rows),
                        context=f"case {case}; keys {first}.. of sequence {seq} changed, which rows {rows} cannot "
                                "see")


@_claim
def chunked_like_whole(impl, case: PrefillCase, device, contract, split: float = 0.5) -> None:
    """Each sequence's queries in two calls, the first part's over the keys its rows can reach (a chunked
    prefill, the rest of the keys in the cache already), give rows within the bound of the whole call's."""
    _applies(any(1 < q <= kv for q, kv in zip(case.q_lens, case.kv_lens)))
    inputs = build_prefill(case, device)
    reference = oracle_of(inputs)
    first, second = [], []
    for seq, (q_len, kv_len) in enumerate(zip(case.q_lens, case.kv_lens)):
        if not 1 < q_len <= kv_len:
            continue
        cut = min(max(1, round(split * q_len)), q_len - 1)
        first.append(Piece(seq, 0, cut, kv_len - (q_len - cut)))
        second.append(Piece(seq, cut, q_len, kv_len))
    for name, pieces in (("first", first), ("second", second)):
        call, rows = sub_call(inputs, case, pieces)
        context = f"case {case}; the {name} chunk {pieces}"
        output, lse = impl(*call)
        assert_result_metadata(output, lse, call, context)
        assert_within_bound(output, lse, _rows(reference, rows), context=context)


def decode_twin(definition: definitions.Definition) -> definitions.Definition:
    """The decode definition of a prefill definition's constants (ragged: pages of one token), registered."""
    page_size = max(definition.page_size, 1)
    name = (f"gqa_paged_decode_h{definition.num_qo_heads}_kv{definition.num_kv_heads}_d{definition.head_dim}"
            f"_ps{page_size}")
    try:
        return definitions.by_name(name)
    except definitions.DefinitionError:
        return definitions.register(replace(definition, name=name, page_size=page_size, op_type=definitions.DECODE,
                                            reference="", origin=f"decode twin of {definition.name}"))


@_claim
def one_query_is_decode(impl, case: PrefillCase, device, contract) -> None:
    """A prefill of one query per sequence is a decode over the same cache: within the decode oracle's bound,
    and (where the implementation serves the decode definition of the same constants) so is its decode call."""
    _applies(bool(case.q_lens) and all(q == 1 for q in case.q_lens))
    inputs = build_prefill(case, device)
    decode = as_decode(inputs)
    twin = decode_twin(case.shape)
    reference = oracle_of(decode)
    prefill_output, prefill_lse = impl(*inputs)
    assert_within_bound(prefill_output, prefill_lse, reference,
                        context=f"case {case}: the one-query prefill against the decode oracle of {twin.name}")
    with cases.using_definition(twin):  # the implementation bound to the decode definition
        try:
            output, lse = impl(*decode)
        except ImplSpecError as error:  # it serves no decode definition of these constants
            _note(f"no decode call: {error}")
            return
    assert_within_bound(output, lse, reference, context=f"case {case}: the decode call of {twin.name}")


@_claim
def junk_elsewhere(impl, case: PrefillCase, device, contract, other_fill: str | None = None) -> None:
    """Other junk in the pool's pages and slots that no key occupies gives the same answer."""
    other_fill = other_fill or _next_fill(case.pool_fill)
    assert_equivalent(impl, contract, build_prefill(replace(case, pool_fill=other_fill), device),
                      impl(*build_prefill(case, device)),
                      f"case {case}; unreferenced pages and slots filled with {other_fill} instead of {case.pool_fill}")


# ---- bad input --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillCorruption:
    """A call the prefill contract forbids: ``apply`` breaks a valid one; a strict refusal is a TypeError or
    ValueError naming one of ``names``; ``applies`` says whether the case can show it; ``needs_pool``: paged
    definitions only."""

    apply: Callable[[PrefillInputs], PrefillInputs]
    names: tuple[str, ...]
    applies: Callable[[PrefillInputs], bool] = lambda inputs: True
    needs_pool: bool = False


def _bumped_last(tensor: torch.Tensor) -> torch.Tensor:
    broken = tensor.clone()
    broken[-1] += 1
    return broken


def _first_page_outside(inputs: PrefillInputs) -> PrefillInputs:
    indices = inputs.kv_indices.clone()
    indices[0] = inputs.k_cache.shape[0]
    return inputs._replace(kv_indices=indices)


PREFILL_CORRUPTIONS: dict[str, PrefillCorruption] = {
    "q_float16": PrefillCorruption(lambda i: i._replace(q=i.q.to(torch.float16)), ("q",)),
    "qo_indptr_past_q": PrefillCorruption(lambda i: i._replace(qo_indptr=_bumped_last(i.qo_indptr)), ("qo_indptr",)),
    "kv_indptr_past_keys": PrefillCorruption(lambda i: i._replace(kv_indptr=_bumped_last(i.kv_indptr)),
                                             ("kv_indptr", "kv_indices")),
    "page_id_outside_the_pool": PrefillCorruption(_first_page_outside, ("kv_indices",),
                                                  lambda i: i.kv_indices.numel() > 0, needs_pool=True),
}


@_claim(judges_refusals=True)
def bad_input_refused(impl, case: PrefillCase, device, contract, corruption: str = "q_float16") -> None:
    """The call broken by ``corruption`` is refused (strict: a TypeError or ValueError naming the argument), and
    the valid call after it is within the bound."""
    inputs = build_prefill(case, device)
    broken = PREFILL_CORRUPTIONS[corruption]
    _applies(broken.applies(inputs))
    context = f"case {case}, {corruption}"
    try:
        impl(*broken.apply(inputs))
    except Exception as error:  # noqa: BLE001 - how to refuse is the kernel's choice, but for the strict tier
        if not is_refusal(error):
            raise
        _refused_clearly(error, contract, broken.names, context)
    else:
        raise AssertionError(f"{context}: the call the contract forbids was not refused")
    run_and_check(impl, inputs, f"case {case}: the valid call after {corruption}")

