"""Each property's claim: the body of its test, as a function of a case and the test's other draws.

A property's test draws its arguments and calls its claim here; the run's root-cause probes
(``record/causes.py``) call the same claim on other cases, so a probe asks exactly what the
property asked. A claim is called ``claim(impl, case, device, contract, **draws)``: ``case`` is
the ``DecodeCase`` the claim is about, ``draws`` the test's other draws (a relabelling seed, a
second case, a corruption), each with a plain default for probes of another property's case.
Each call tells the claim observers (``cases.add_claim_observer``: the plugin's case recorder) its
reference, case and draws, so a case file names all three; ``cases.unobserved()`` (the probes) silences them.

A claim raises (``AssertionError`` from the checks, or whatever the implementation raised) when
it does not hold, ``hypothesis.errors.UnsatisfiedAssumption`` when it does not apply to its case
(a probe: undecided), and returns None (``within_bound``: the check's result) when it holds.

Each test declares its claim where it is defined, ``@property_claim(claims.within_bound)``: the plugin
refuses to collect a property without one, fails a test whose body calls another claim, and records the
claim's ``reference`` (``module:name``) in the run's report parts and case files, from which the root causes
import it again (``Claim.reference``) without importing any test module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import assume, note
from hypothesis.control import currently_in_test_context
from hypothesis.errors import UnsatisfiedAssumption

from gqa_decode_fuzz.generation.cases import POOL_FILLS, DecodeCase, build, note_claim
from gqa_decode_fuzz.generation.transforms import (
    copy_queries_within_groups,
    poison_page,
    reference_rows,
    relabel_pages,
    result_rows,
    sequences_reading,
    single_sequence,
)

from .checks import (
    Checked,
    assert_equivalent,
    assert_result_metadata,
    assert_same_result,
    assert_unchanged,
    assert_within_bound,
    oracle_of,
    poisoned_allocations,
    run_and_check,
    snapshot,
)
from .corruptions import CORRUPTIONS, assert_handled, is_refusal

__all__ = ["Claim", "assert_empty_sequences_exact", "property_claim", "within_bound"]

LAYOUT_ARGUMENTS = ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices")


class Claim:
    """A claim: ``function`` with its reference, case and draws told to the claim observers first.

    Unless it judges refusals itself (``judges_refusals``), a case with a strided or sliced layout that the
    implementation refuses, as test_layouts allows, is one the claim does not apply to (``_refusing_layouts``).
    ``decided_by_draws``: its failures are decided by its draws, not its case (each corruption a check the
    implementation makes or lacks), so the root causes put one such claim's failures together.
    """

    def __init__(self, function: Callable, *, judges_refusals: bool = False, decided_by_draws: bool = False) -> None:
        functools.update_wrapper(self, function)
        self.function = function
        self.judges_refusals = judges_refusals
        self.decided_by_draws = decided_by_draws
        self.reference = f"{function.__module__}:{function.__qualname__}"  # what importing it back takes

    def __call__(self, impl: Callable, case: DecodeCase, device: Any, contract: str = "correct", **draws: Any) -> Any:
        note_claim(case, draws, self.reference)
        if not self.judges_refusals and not _plain_layouts(case):
            impl = _refusing_layouts(impl, case, contract)
        return self.function(impl, case, device, contract, **draws)

    def __repr__(self) -> str:
        return f"<claim {self.reference}>"


def _claim(function: Callable | None = None, *, judges_refusals: bool = False,
           decided_by_draws: bool = False) -> Claim | Callable[[Callable], Claim]:
    """``@_claim`` or ``@_claim(judges_refusals=..., decided_by_draws=...)``: ``function`` as a ``Claim``."""

    def decorate(function: Callable) -> Claim:
        return Claim(function, judges_refusals=judges_refusals, decided_by_draws=decided_by_draws)

    return decorate(function) if function is not None else decorate


def property_claim(claim: Claim) -> pytest.MarkDecorator:
    """Declare the claim a property's test checks: ``@property_claim(claims.within_bound)`` above its ``@given``.

    Marks the test with the claim's reference (the ``claim`` marker the plugin registers), which the plugin
    requires of every test in the property suite, compares with the claim the body calls, and records per property.
    """
    if not isinstance(claim, Claim):
        raise TypeError(f"property_claim(claim={claim!r}): expected a Claim (properties/claims.py, prefill_claims.py)")
    return pytest.mark.claim.with_args(claim.reference)


def _plain_layouts(case: DecodeCase) -> bool:
    return (case.q_layout, case.kv_layout, case.index_layout) == ("contiguous", "separate", "int32")


def _refusing_layouts(impl: Callable, case: DecodeCase, contract: str) -> Callable:
    """``impl`` whose refusal of ``case``'s layout (an allowed one: ``_refused_clearly``) leaves the claim undecided."""

    @functools.wraps(impl)
    def call(*args, **kwargs):
        try:
            return impl(*args, **kwargs)
        except Exception as error:
            if not is_refusal(error):
                raise
            _refused_clearly(error, contract, LAYOUT_ARGUMENTS, f"case {case}")
            _applies(False)

    return call


def _note(text: str) -> None:
    """Hypothesis's ``note`` inside a test; nothing in a probe."""
    if currently_in_test_context():
        note(text)


def _applies(condition: bool) -> None:
    """Hypothesis's ``assume`` inside a test; elsewhere (a probe, a parametrized test) the same exception."""
    if currently_in_test_context():
        assume(condition)
    elif not condition:
        raise UnsatisfiedAssumption("the claim does not apply to this case")


def _refused_clearly(error: Exception, contract: str, names: tuple[str, ...], context: str) -> None:
    """A call refused where refusing is allowed: strict wants a TypeError or ValueError naming one of ``names``."""
    __tracebackhide__ = True
    if contract == "strict":
        assert isinstance(error, (TypeError, ValueError)), f"{context}: refused with {error!r}"
        assert any(name in str(error) for name in names), f"{context}: unclear error {error!r}"
    _note(f"refused: {error!r}")


# ---- against the oracle -----------------------------------------------------------------------


@_claim
def within_bound(impl, case, device, contract) -> Checked:
    """The call's output and LSE are within the oracle's bound (empty sequences exactly 0 and -inf)."""
    return run_and_check(impl, build(case, device), f"case {case}")


def assert_empty_sequences_exact(output: torch.Tensor, lse: torch.Tensor | None, lengths: tuple[int, ...]) -> None:
    """Every empty sequence's output is exactly 0 and its LSE exactly -inf (unless the LSE is None)."""
    __tracebackhide__ = True
    for seq, length in enumerate(lengths):
        if length:
            continue
        assert torch.count_nonzero(output[seq].float()) == 0, f"sequence {seq} is empty but its output is not 0"
        if lse is not None:
            assert bool((lse[seq] == -math.inf).all()), f"sequence {seq} is empty but its lse is {lse[seq].tolist()}"


@_claim
def empty_sequences_exact(impl, case, device, contract) -> None:
    """Each empty sequence's output is exactly 0 and its LSE -inf."""
    assert_empty_sequences_exact(*impl(*build(case, device)), case.lengths)


@_claim(judges_refusals=True)
def right_answer_or_clear_error(impl, case, device, contract) -> None:
    """A strided or sliced input gives the right answer or, strict, a TypeError/ValueError naming the input."""
    inputs = build(case, device)
    try:
        result = impl(*inputs)
    except Exception as error:  # refusing a layout is allowed; strict: TypeError/ValueError naming the input
        if not is_refusal(error):
            raise
        _refused_clearly(error, contract, LAYOUT_ARGUMENTS, f"case {case}")
        return
    run_and_check(lambda *_: result, inputs, f"case {case}")


@_claim(judges_refusals=True)
def destinations_written(impl, case, device, contract, layout: str = "contiguous") -> None:
    """A destination-passing call writes its destinations whole (a strided one may be refused) and nothing else."""
    inputs = build(case, device)
    context = f"case {case}, {layout} destinations"
    try:
        result = impl(*inputs, destinations=layout)
    except Exception as error:  # a strided destination may be refused, never the plain one
        if layout == "contiguous" or not is_refusal(error):
            raise
        _refused_clearly(error, contract, ("output", "lse"), context)
        return
    run_and_check(lambda *_: result, inputs, context)


# ---- against another call (metamorphic) ---------------------------------------------------------


@_claim
def alone_and_batched(impl, case, device, contract) -> None:
    """Each sequence alone is within the bound of the answer the batch is judged against."""
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
            _note(f"sequence {seq}: alone and batched differ in the last bits (allowed; both within bound)")


@_claim
def relabelled(impl, case, device, contract, extra_pages: int = 8, relabel_seed: int = 0) -> None:
    """Pages moved to other slots of a larger pool give the same answer."""
    inputs = build(case, device)
    moved = relabel_pages(inputs, extra_pages, torch.Generator().manual_seed(relabel_seed))
    assert_equivalent(impl, contract, moved, impl(*inputs), f"case {case}, pages relabelled into a pool +{extra_pages}")


@_claim
def repeated(impl, case, device, contract, other: DecodeCase = DecodeCase(lengths=(3,), seed=1)) -> None:  # noqa: B008
    """A call repeated after a different one gives the same answer: no state carries over."""
    inputs = build(case, device)
    first = impl(*inputs)
    impl(*build(other, device))
    assert_equivalent(impl, contract, inputs, first, f"case {case}, second call (after {other})")


@_claim
def inputs_unchanged(impl, case, device, contract) -> None:
    """The call leaves every input storage as it was, padding and gaps included."""
    inputs = build(case, device)
    before = snapshot(inputs)
    impl(*inputs)
    assert_unchanged(inputs, before, f"case {case}")


@_claim
def every_output_written(impl, case, device, contract) -> None:
    """Memory the implementation allocates but never writes stays NaN: the result must still be within bound."""
    inputs = build(case, device)
    # A destination-passing implementation's destinations are poisoned and checked by its adapter
    # (engine/destinations.py), here and in every other property.
    with poisoned_allocations():
        output, lse = impl(*inputs)
    run_and_check(lambda *_: (output, lse), inputs, f"case {case}, fresh allocations filled with NaN")


@_claim
def equal_heads(impl, case, device, contract, copy_seed: int = 0) -> None:
    """Query heads of one KV group given the same query give identical results."""
    inputs = build(case, device)
    q, pairs = copy_queries_within_groups(inputs.q, inputs.k_cache.shape[2], torch.Generator().manual_seed(copy_seed))
    output, lse = impl(*inputs._replace(q=q))
    for head, source in pairs:
        rows = [(output[:, h:h + 1], None if lse is None else lse[:, h:h + 1]) for h in (head, source)]
        assert_same_result(*rows, f"case {case}: head {head} has the query of head {source} (same KV head), so the "
                                  "same result")


def _next_fill(fill: str) -> str:
    return POOL_FILLS[(POOL_FILLS.index(fill) + 1) % len(POOL_FILLS)]


@_claim
def junk_elsewhere(impl, case, device, contract, other_fill: str | None = None) -> None:
    """Other junk in the pages no sequence references gives the same answer."""
    other_fill = other_fill or _next_fill(case.pool_fill)
    assert_equivalent(impl, contract, build(replace(case, pool_fill=other_fill), device), impl(*build(case, device)),
                      f"case {case}; unreferenced pages filled with {other_fill} instead of {case.pool_fill}")


@_claim
def junk_in_last_pages(impl, case, device, contract, other_fill: str | None = None) -> None:
    """Other junk in the unused slots of last pages gives the same (right) answer."""
    page_size = case.shape.page_size
    _applies(any(n % page_size for n in case.lengths))  # some last page is not full
    other_fill = other_fill or _next_fill(case.pool_fill)
    inputs = build(case, device)
    baseline = run_and_check(impl, inputs, f"case {case}")[:2]
    assert_equivalent(impl, contract, build(replace(case, pool_fill=other_fill), device), baseline,
                      f"case {case}; unused slots of last pages (and unreferenced pages) hold {other_fill}, not "
                      f"{case.pool_fill}")


@_claim
def poison_stays_put(impl, case, device, contract, page_rank: int = 0, tensor: str = "k_cache",
                     value: float = math.nan) -> None:
    """A non-finite value in one referenced page reaches no sequence that does not read that page."""
    inputs = build(case, device)
    referenced = sorted(set(inputs.kv_indices.tolist()))
    _applies(bool(referenced))  # some sequence must read a page
    page = referenced[page_rank % len(referenced)]
    output, lse = impl(*poison_page(inputs, page, tensor, value))
    reference = oracle_of(inputs)
    readers = sequences_reading(inputs, page)
    _note(f"sequences reading page {page}: {sorted(readers)}")
    for seq in set(range(case.batch)) - readers:
        assert_within_bound(*result_rows(output, lse, slice(seq, seq + 1)),
                            reference_rows(reference, slice(seq, seq + 1)),
                            context=f"case {case}; {tensor}[{page}] = {value} reached sequence {seq}, which does "
                                    "not read it")


# ---- bad input ----------------------------------------------------------------------------------


@_claim(judges_refusals=True, decided_by_draws=True)
def bad_input_handled(impl, case, device, contract, corruption: str = "q_float16", where: int = 0,
                      then_valid: bool = True) -> None:
    """The call broken by ``corruption`` is refused as the tier demands; with ``then_valid``, the valid call made
    after it is within the bound (an out-of-range read on a GPU would have poisoned the context)."""
    inputs = build(case, device)
    _applies(CORRUPTIONS[corruption].applies(inputs))
    assert_handled(impl, contract, inputs, corruption, where, f"case {case}")
    if then_valid:
        run_and_check(impl, inputs, f"case {case}: the valid call after {corruption}")
