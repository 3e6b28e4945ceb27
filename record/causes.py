"""Root causes: the run's failing properties grouped by what their minimal cases need, found by experiment.

A kernel wrong in one way fails many properties, each with its own shrunk case. After the
run (in the process that writes the run report) each failing property's case file gives
its minimal ``DecodeCase`` and the test's other draws; the claims of ``properties/claims.py``
(the properties' own bodies) are replayed on cases ("probes"), through the suite's own
guarded implementation, each with its property's draws:

1. The simplest failing case not yet explained becomes a representative; its own claim must
   fail on it again (else it stays a cause of its own, "not reproduced by its probe").
2. Each knob the representative ran (the implementation's declared default first), then one
   descriptor field at a time, moves toward its default (``DEFAULTS``; a ``PrefillCase``'s:
   ``PREFILL_DEFAULTS``, its query and key counts moved as one field): a knob or field whose
   default makes the failure go away is one the failure needs ("use_tensor_cores=True"). A needed scale, length,
   pool or seed is then described by its class ("scale <= 0", "an empty sequence", "page ids >=
   2^22", "particular values": any seed but the default's), confirmed with one more member
   of the class where one is at hand; fields that
   are not needed are said to be free ("any length" once a longer batch fails too). Needed
   values, scale or seed that put a head's every logit far below zero are that one need
   (the domain of a finite mask sentinel, which many regimes reach).
3. Another failing property joins the cause when its own minimal case has what the cause
   needs, it ran the knob values the cause needs, and either the representative's case (under
   the other's definition, with the other's knobs) breaks its claim, or, where it ran with the
   representative's knobs, its own case stops failing once the needed fields but the definition
   go to their defaults (passing under the seed's definition shows no shared cause; under other
   knobs, another code path of the implementation, needing the same fields shows no shared defect).
4. A claim that its draws decide rather than its case (the bad-input claim: each corruption
   a check the implementation makes or lacks) is one cause when its representative needs
   nothing of its case: its other failures join it once each fails again on its own case,
   and the cause lists each corruption. No other claim joins it: failing on its plain case
   says nothing of the draws, so such a failure is a defect of its own.

Every probe counts against one budget (``Budget.for_failures``: 40 probes and 60 s, or six probes
and a second per failure where there are more, at most 300 s, and within what a run's --time-budget has
left, or 30 s past it; a failure left unprobed is a cause of its own, marked so); what was tried is
kept and reported; a claim that does not apply to a probe's case leaves it undecided.
Crashed properties are not probed where the implementation runs in-process (a fault would
poison this process's CUDA context; an isolated child's fault is an ordinary failure, probed)
and properties without a case file cannot be; each is a cause of its own.
Properties stay separate pytest items: this is a report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import importlib
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis.errors import UnsatisfiedAssumption

from gqa_decode_fuzz.engine.containment import CudaContextLost, is_sticky_cuda_error
from gqa_decode_fuzz.engine.examples import property_name
from gqa_decode_fuzz.generation.cases import SuiteOutOfMemory, unobserved, using_definition
from gqa_decode_fuzz.generation.oracles import oracle_of
from gqa_decode_fuzz.reference import definitions

from .casefiles import (
    CaseFileError,
    build_case,
    case_from_fields,
    claim_from_fields,
    definition_of,
    load_case,
    replay_command,
)

if TYPE_CHECKING:
    from gqa_decode_fuzz.generation.case_types import Case

__all__ = [
    "Budget", "Cause", "ClaimReferenceError", "Failure", "Prober", "as_json", "claim_at", "failures_of_run",
    "find_causes", "grouped", "load", "save", "short_case", "summary_lines",
]

FILE_NAME = "causes.json"
INT32_LIMIT = 2**31  # a page id whose page_id * page_stride (elements) reaches this overflows int32 offsets
BLOCK = 128  # tokens per block of the usual decode kernels: a longer sequence needs a second block

# Where each field of a DecodeCase moves when a probe asks whether the failure needs it.
DEFAULTS: dict[str, Any] = {
    "lengths": (1,), "scale": None, "values": "normal", "page_layout": "shuffled", "spare_pages": 0,
    "pool_fill": "nan", "q_layout": "contiguous", "kv_layout": "separate", "index_layout": "int32", "seed": 0,
    "definition": None,  # the seed's
}
# A PrefillCase's: its lengths are one field here, (q_lens, kv_lens), moved together (``_moved``); no definition
# (the seed's is a decode one).
PREFILL_DEFAULTS: dict[str, Any] = {
    "lengths": ((1,), (1,)), "scale": None, "values": "normal", "page_layout": "shuffled", "spare_pages": 0,
    "pool_fill": "nan", "seed": 0,
}
KEY_BLOCK = 64  # keys per block of the usual prefill kernels
LONGER = (3, BLOCK + 2)  # lengths tried when a one-token failure may not need its lengths
# A head whose exact LSE (base 2) is below this has every logit far below zero: under a finite mask sentinel
# (FlashInfer's -5e4) the masked slots then outweigh every real logit. Several value regimes and scales get there.
FAR_BELOW_LSE2 = -1.0e4
FAR_BELOW_WORDS = "a head whose every logit is far below zero (its LSE < -10^4)"
LOGIT_FIELDS = ("values", "scale", "seed")  # what sets the logits; a need of theirs may be the derived one above
# A case the derived test builds and solves on the prober's device: at most these tokens and slots. A GPU takes the
# 128k-token sequences (on the CPU one took 13.5 s and 4 GB), not the huge pools of millions of pages.
DERIVED_TOKENS = {"cpu": 1 << 16, "cuda": 1 << 18}
FREE_WORDS = {"lengths": "any length", "scale": "any scale"}  # a field shown not to matter, in words


@dataclass(frozen=True)
class Failure:
    """A failing property as the run saw it: its shard's node id, case file and first error line."""

    nodeid: str
    case_file: str | None = None
    error: str = ""
    crashed: bool = False
    case: Case | None = None  # the case its claim was about (its case file says), if any
    draws: dict = field(default_factory=dict)  # the test's other draws, as its claim took them
    knobs: dict = field(default_factory=dict)  # the implementation's knobs as the example drew them (its calls')
    claim: str | None = None  # its property's claim, a reference (``module:name``) its case file recorded

    @property
    def prop(self) -> str:
        return property_name(self.nodeid)

    @property
    def probeable(self) -> bool:
        return self.case is not None and self.claim is not None and not self.crashed


def _prefill(case: Case) -> bool:
    return getattr(case, "q_lens", None) is not None


def _defaults(case: Case) -> dict[str, Any]:
    """Where each field of ``case`` moves when a probe asks whether the failure needs it."""
    return PREFILL_DEFAULTS if _prefill(case) else DEFAULTS


def _field(case: Case, name: str) -> Any:
    """A field of ``case`` as ``_defaults`` names it (a prefill case's lengths: the pair (q_lens, kv_lens))."""
    if name == "lengths" and _prefill(case):
        return case.q_lens, case.kv_lens
    return getattr(case, name)


def _moved(case: Case, **fields: Any) -> Case:
    """``case`` with ``fields`` replaced (a prefill case's lengths as the pair)."""
    if "lengths" in fields and _prefill(case):
        fields["q_lens"], fields["kv_lens"] = fields.pop("lengths")
    return replace(case, **fields)


SECONDS_PAST_A_TIME_BUDGET = 30.0  # probing that a run's --time-budget may still get once it is spent


@dataclass
class Budget:
    """At most ``probes`` replays and ``seconds`` of them in all."""

    probes: int = 40
    seconds: float = 60.0
    used: int = 0
    spent: float = 0.0

    @classmethod
    def for_failures(cls, count: int, seconds_left: float | None = None) -> Budget:
        """A budget that grows with the failures to group (a family run fails a property once per definition):
        six probes and one second per failure, at least the defaults, at most 300 s. ``seconds_left``: what a
        run's --time-budget has left, which the probes keep to, but for ``SECONDS_PAST_A_TIME_BUDGET`` (a run
        that spent its budget still groups its simplest failures)."""
        seconds = min(300.0, max(cls.seconds, float(count)))
        if seconds_left is not None:
            seconds = min(seconds, max(SECONDS_PAST_A_TIME_BUDGET, seconds_left))
        return cls(probes=max(cls.probes, 6 * count), seconds=seconds)

    def left(self) -> bool:
        return self.used < self.probes and self.spent < self.seconds


class ClaimReferenceError(ValueError):
    """A recorded claim reference that does not import to a claim; the message names it."""


@functools.cache
def claim_at(reference: str) -> Callable:
    """The claim a reference (``package.module:name``, as a case file or report part records it) names, imported
    by its module (the claims' own, never a test module's)."""
    module, _, name = reference.partition(":")
    try:
        claim = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ClaimReferenceError(f"claim {reference!r} does not import: {error}") from None
    if getattr(claim, "reference", None) != reference or not callable(claim):
        raise ClaimReferenceError(f"claim {reference!r} imports {claim!r}, which is not that claim")
    return claim


@dataclass
class Prober:
    """Replays claims on cases through ``impl`` (the suite's guarded implementation), within ``budget``.

    A failure's claim is the one its case file names (``Failure.claim``, imported by ``claim_at``);
    ``release`` frees what a probe left where the device is short of memory. ``tried`` lists every probe in words.
    ``knob_defaults``: each of the implementation's knobs at its declared default (``knobs.defaults``), which a
    representative's knob moves to as a case field moves to its default.
    """

    impl: Callable
    device: Any
    contract: str
    budget: Budget = field(default_factory=Budget)
    release: Callable[[], None] = lambda: None
    knob_defaults: dict[str, Any] = field(default_factory=dict)
    tried: list[str] = field(default_factory=list)
    stopped: str | None = None  # why probing ended early (budget, a lost CUDA context)

    def fails(self, failure: Failure, case: Case) -> bool | None:
        """Whether ``failure``'s claim fails on ``case`` with its draws, the implementation called with its knobs
        (else their defaults); None when the probe could not decide (budget spent, the claim does not apply to the
        case or does not import, the suite out of memory, the context lost)."""
        if self.stopped or not self.budget.left():
            self.stopped = self.stopped or (f"budget spent ({self.budget.used} probes, "
                                            f"{self.budget.spent:.1f} s)")
            return None
        prop, draws, knobs = failure.prop, failure.draws, failure.knobs
        said = _with(case, {**(draws or {}), **knobs})  # the case as probed, its knob values with it
        start, verdict = time.perf_counter(), None
        try:
            claim = claim_at(failure.claim)
            with using_definition(case.shape), unobserved():  # the implementation serves the active definition
                impl = functools.partial(self.impl, **knobs) if knobs else self.impl
                claim(impl, case, self.device, self.contract, **(draws or {}))
            verdict = False
        except ClaimReferenceError as error:
            self.tried.append(f"{_short(prop)} on {said}: undecided, {error}")
        except (UnsatisfiedAssumption, pytest.skip.Exception):
            self.tried.append(f"{_short(prop)} on {said}: undecided, the claim does not apply")
        except (SuiteOutOfMemory, MemoryError) as error:
            self.tried.append(f"{_short(prop)} on {said}: undecided, {type(error).__name__}")
        except CudaContextLost as error:
            self.stopped = f"the CUDA context was lost: {str(error).splitlines()[0]}"
        # pytest's own failure (``pytest.fail``, ``pytest.raises``' "DID NOT RAISE") is a BaseException: a claim
        # written with it fails as any other does.
        except (Exception, pytest.fail.Exception) as error:  # noqa: BLE001 - any failure of the claim is the answer
            if is_sticky_cuda_error(error):
                self.stopped = f"the CUDA context was lost: {str(error).splitlines()[0]}"
            else:
                verdict = True
            traceback.clear_frames(error.__traceback__)  # the frames hold the probe's tensors
        finally:
            # The young generations only: in a run's reporting process a full collection costs more than most
            # probes, and after each of hundreds it took most of the grouping's time (docs/gpu.md section 46).
            gc.collect(1)
            with contextlib.suppress(Exception):
                self.release()
            self.budget.used += 1
            self.budget.spent += time.perf_counter() - start  # its clean-up too: the budget bounds the wall time
        if verdict is not None:
            self.tried.append(f"{_short(prop)} on {said}: {'fails' if verdict else 'passes'}")
        return verdict


@dataclass
class Cause:
    """One distinct failure: what its minimal cases need, one representative and the properties it broke."""

    representative: Failure
    needs: list[str] = field(default_factory=list)  # "scale <= 0", "kv_layout dim_outer"
    free: list[str] = field(default_factory=list)  # "any length", "any seed"
    members: list[tuple[Failure, str]] = field(default_factory=list)  # another property, and why it joined
    note: str = ""  # why this cause was not probed or not grouped
    unprobed: bool = False  # a property's failures that probing never reached, listed together, not grouped by cause

    @property
    def summary(self) -> str:
        if self.note and not self.needs and not self.free:
            return self.note
        said = self.needs or ["any case (fails with each field it varies at its default)"]
        return ", ".join(said + self.free)

    @property
    def properties(self) -> list[str]:
        return [self.representative.prop, *(member.prop for member, _ in self.members)]

    def to_json(self) -> dict:
        rep = self.representative
        return {
            "summary": self.summary, "needs": self.needs, "free": self.free, "note": self.note,
            "unprobed": self.unprobed,
            "properties": self.properties,
            "representative": _failure_json(rep),
            "members": [{**_failure_json(member), "joined": why} for member, why in self.members],
        }


def _failure_json(failure: Failure) -> dict:
    case = _with(failure.case, {**failure.draws, **failure.knobs})  # the knobs it ran with, as the draws
    return {"property": failure.prop, "nodeid": failure.nodeid, "case": case,
            "definition": getattr(failure.case, "definition", None), "case_file": failure.case_file,
            "replay": replay_command(failure.case_file) if failure.case_file else None, "error": failure.error,
            "crashed": failure.crashed}


# ---- words ----------------------------------------------------------------------------------


def _short(prop: str) -> str:
    return prop.rpartition("::")[2]


def short_case(case: Case) -> str:
    """A case as its fields other than the defaults: ``DecodeCase(lengths=(1,), scale=0.0)``."""
    if case is None:
        return "no case descriptor"
    if not dataclasses.is_dataclass(case):
        return repr(case)
    shown = [f"lengths={case.lengths!r}"] + [
        f"{f.name}={getattr(case, f.name)!r}" for f in dataclasses.fields(case)
        if f.name not in ("lengths", "definition") and getattr(case, f.name) != f.default]  # definition: said apart
    return f"{type(case).__name__}({', '.join(shown)})"


def _with(case: Case, draws: dict | None) -> str:
    """A probe's case and the draws it took, in words."""
    shown = ", ".join(f"{name}={value!r}" for name, value in (draws or {}).items())
    return short_case(case) + (f" with {shown}" if shown else "")


def _pool_pages(case: Case) -> int:
    """The pool's pages (the builder's count: a sequence of n tokens owns ceil(n / page_size) pages)."""
    page = max(case.shape.page_size, 1)  # ragged K and V: a row per key
    return sum(-(-n // page) for n in case.lengths) + case.spare_pages


def _page_id_limit(case: Case) -> int:
    """The first page id whose offset in a plain pool (page_id * elements per page) passes 2^31."""
    return INT32_LIMIT // case.shape.page_elements


def _length_features(lengths: tuple[int, ...]) -> list[str]:
    features = []
    if 0 in lengths:
        features.append("an empty sequence")
    if len(lengths) >= 2:
        features.append("batch >= 2")
    if max(lengths, default=0) > BLOCK:
        features.append(f"a sequence longer than {BLOCK} tokens")
    elif max(lengths, default=0) >= 2:
        features.append("a sequence of 2 or more tokens")
    if not lengths:
        features.append("batch 0")
    return features


def _prefill_length_features(q_lens: tuple[int, ...], kv_lens: tuple[int, ...]) -> list[str]:
    pairs = list(zip(q_lens, kv_lens))
    features = []
    if any(q > kv for q, kv in pairs):
        features.append("a row that sees no key")
    if any(0 < q < kv for q, kv in pairs):
        features.append("a chunk of queries after cached keys")
    if max(q_lens, default=0) >= 2:
        features.append("a sequence of 2 or more queries")
    if max(kv_lens, default=0) > KEY_BLOCK:
        features.append(f"a sequence of more than {KEY_BLOCK} keys")
    if len(pairs) >= 2:
        features.append("batch >= 2")
    return features


def _features(case: Case) -> list[str]:
    """What a case's lengths show, in words (``_length_features``, or prefill's)."""
    return _prefill_length_features(case.q_lens, case.kv_lens) if _prefill(case) else _length_features(case.lengths)


def _scale_class(scale: float | None) -> tuple[str, Callable[[Any], bool], float | None]:
    """A needed scale's class in words, its membership test, and another member to confirm it with."""
    if scale is None:
        return "the default scale", lambda s: s is None, None
    if scale <= 0:
        return "scale <= 0", lambda s: s is not None and s <= 0, -0.5 if scale == 0 else 0.0
    if scale < 1e-3:
        return "scale < 1e-3", lambda s: s is not None and 0 < s < 1e-3, 1e-6 if scale != 1e-6 else 1e-5
    if scale > 1:
        return "scale > 1", lambda s: s is not None and s > 1, 8.0 if scale != 8.0 else 16.0
    return f"scale {scale!r}", lambda s: s == scale, None


# ---- the experiment -------------------------------------------------------------------------


@dataclass
class _Needed:
    """What a representative's failure needs: per field, words and a test on another case."""

    words: list[str] = field(default_factory=list)
    free: list[str] = field(default_factory=list)
    tests: dict[str, Callable[[Any], bool]] = field(default_factory=dict)  # field -> does a case have it
    knobs: dict[str, Any] = field(default_factory=dict)  # knob -> the value the failure needs

    def holds_for(self, failure: Failure) -> bool:
        """Whether ``failure``'s case has what is needed, and it ran the knob values needed."""
        return (all(test(failure.case) for test in self.tests.values())
                and all(failure.knobs.get(name) == value for name, value in self.knobs.items()))


def _vary(prober: Prober, rep: Failure) -> _Needed:
    """Move each knob the representative ran, then each field of its case, toward its default, one at a time."""
    case, needed = rep.case, _Needed()
    for name, value in rep.knobs.items():
        default = prober.knob_defaults.get(name, value)
        if value != default and prober.fails(replace(rep, knobs={**rep.knobs, name: default}), case) is False:
            needed.words.append(f"{name}={value!r}")
            needed.knobs[name] = value
    words_of: dict[str, list[str]] = {}
    for name, default in _defaults(case).items():
        value = _field(case, name)
        if value == default:
            continue
        verdict = prober.fails(rep, _moved(case, **{name: default}))
        if verdict is None:
            needed.free.append(f"{name} untested")
            continue
        if verdict:
            if name in FREE_WORDS:
                needed.free.append(FREE_WORDS[name])
            continue
        said = len(needed.words)
        _describe_needed(prober, rep, name, value, needed)
        words_of[name] = needed.words[said:]
    # One token: does a longer batch fail too? Not asked where the failure needs its seed: a longer batch draws
    # other values, so its passing would say nothing of lengths.
    if not _prefill(case) and case.lengths == DEFAULTS["lengths"] and "seed" not in needed.tests:
        verdict = prober.fails(rep, replace(case, lengths=LONGER))
        if verdict:
            needed.free.append(FREE_WORDS["lengths"])
        elif verdict is False:  # other logits, or other lengths: the derived need below may say which
            words_of["lengths"] = [f"lengths {case.lengths!r} (lengths {LONGER!r} pass)"]
            needed.words += words_of["lengths"]
            needed.tests["lengths"] = lambda c, n=case.lengths: c.lengths == n
    _fold_into_far_below(case, needed, words_of, prober.device)
    return needed


def _describe_needed(prober: Prober, rep: Failure, name: str, value: Any, needed: _Needed) -> None:
    case = rep.case
    if name == "scale":
        words, test, other = _scale_class(value)
        if other is not None and prober.fails(rep, replace(case, scale=other)) is False:
            words, test = f"scale {value!r} (scale {other!r} passes)", (lambda s, v=value: s == v)
        needed.words.append(words)
        needed.tests["scale"] = lambda c, t=test: t(c.scale)
    elif name == "lengths":
        features = _features(case)
        needed.words.append(" and ".join(features) or f"lengths {value!r}")
        needed.tests["lengths"] = lambda c, f=tuple(features): set(f) <= set(_features(c))
    elif name == "spare_pages" and _pool_pages(case) > _page_id_limit(case):
        needed.words.append(f"page ids >= 2^{_page_id_limit(case).bit_length() - 1} (a pool of "
                            f"{_pool_pages(case):,} pages)")
        needed.tests["spare_pages"] = lambda c: _pool_pages(c) > _page_id_limit(c)
    elif name == "spare_pages":
        needed.words.append("pages no sequence references")
        needed.tests["spare_pages"] = lambda c: c.spare_pages > 0
    elif name == "definition":  # another definition that fails the same way may join: its own probes decide
        needed.words.append(f"definition {value} (the seed's passes)")
        needed.tests["definition"] = lambda c: c.definition is not None
    elif name == "seed":  # a class, not one seed: a defect only some values reach (a precision one) fails many
        needed.words.append(f"particular values (seed {value} fails, seed 0 passes)")
        needed.tests["seed"] = lambda c: c.seed != DEFAULTS["seed"]
    else:
        needed.words.append(f"{name} {value}")
        needed.tests[name] = lambda c, n=name, v=value: getattr(c, n) == v


def _far_below_zero(case: Case, device: Any = "cpu") -> bool:
    """Whether some head of ``case`` has every logit far below zero (``FAR_BELOW_LSE2``), by the oracle on
    ``device`` (the prober's); False for a case too large to build there (``DERIVED_TOKENS``: its tokens or its
    pool)."""
    kind = "cuda" if getattr(device, "type", str(device)).startswith("cuda") else "cpu"
    try:
        if case is None or max(sum(case.lengths), _pool_pages(case) * case.shape.page_size) > DERIVED_TOKENS[kind]:
            return False
        return _far_below_in(case, case.shape.name, device)
    except Exception:  # noqa: BLE001 - a case the builder or the oracle cannot take just lacks the feature
        return False


@functools.lru_cache(maxsize=512)
def _far_below_in(case: Case, definition: str, device: Any) -> bool:  # ``definition``: what a case of None's means
    with using_definition(case.shape), unobserved():
        reference = oracle_of(build_case(case, device))
    return bool((reference.lse < FAR_BELOW_LSE2).any())


def _fold_into_far_below(case: Case, needed: _Needed, words_of: dict[str, list[str]], device: Any) -> None:
    """Where the logit fields a failure needs put a head far below zero, that is its one need: one defect (a
    finite sentinel) reached through wide values, large logits at a scale > 1 or one seed's draw is one cause."""
    fields = [name for name in LOGIT_FIELDS if name in needed.tests]
    far_below = functools.partial(_far_below_zero, device=device)
    if not fields or not far_below(case):
        return
    one_token = not _prefill(case) and case.lengths == DEFAULTS["lengths"]
    if one_token and "lengths" in needed.tests:  # a longer draw's other logits passed
        fields.append("lengths")
    for name in fields:
        del needed.tests[name]
        needed.words = [words for words in needed.words if words not in words_of.get(name, [])]
    needed.words.append(FAR_BELOW_WORDS)
    needed.tests["logits"] = far_below


def _needed_fields(needed: _Needed) -> list[str]:
    """The case fields a cause's needs are about (the derived "logits" need: every field that sets them), but the
    definition: a failure under another definition that passes under the seed's may do so for reasons of its own."""
    return [name for key in needed.tests if key != "definition"
            for name in (LOGIT_FIELDS if key == "logits" else (key,))]


def _toward_defaults(case: Case, fields: list[str]) -> Case:
    return _moved(case, **{name: _defaults(case)[name] for name in fields})


def _joins(prober: Prober, rep: Failure, needed: _Needed, other: Failure) -> str | None:
    """Why ``other`` belongs to the representative's cause, or None (never across op types: a decode case is no
    case of a prefill claim)."""
    if _prefill(rep.case) != _prefill(other.case) or not needed.holds_for(other):
        return None
    # A cause that needs its definition: the representative's case under the other's own definition, which may
    # fail for another reason (its own definition's), so under the representative's it would join wrongly.
    case = replace(rep.case, definition=other.case.definition) if "definition" in needed.tests else rep.case
    if prober.fails(other, case):
        return "the representative's case fails its check too" + (" under its own definition" if case is not rep.case
                                                                   else "")
    if other.knobs != rep.knobs:  # another path of the implementation, where the representative's case did not fail
        return None
    fields = _needed_fields(needed)
    passes_at_defaults = fields and prober.fails(other, _toward_defaults(other.case, fields)) is False
    if passes_at_defaults and prober.fails(other, other.case):
        moved = f"{fields[0]} goes" if len(fields) == 1 else f"{', '.join(fields)} go"
        return f"its own case passes once {moved} to the default" + (
            " under its own definition" if "definition" in needed.tests else "")
    return None


def _simplicity(failure: Failure) -> tuple:
    case = failure.case
    changed = sum(_field(case, name) != default for name, default in _defaults(case).items() if name != "seed")
    return (changed, _pool_pages(case), sum(case.lengths), len(case.lengths), failure.prop)


def _draw_words(failures: list[Failure]) -> list[str]:
    """The draws of these failures' claims with the values they took ("corruption page_id_negative, q_float16"):
    across several failures only the draws whose value changes (a corruption, not its seed)."""
    values: dict[str, set[str]] = {}
    for failure in failures:
        for name, value in failure.draws.items():
            if not isinstance(value, bool):  # switches such as then_valid say how, not what
                values.setdefault(name, set()).add(str(value))
    varying = {name: seen for name, seen in values.items() if len(seen) > 1}
    return [f"{name} {', '.join(sorted(seen))}" for name, seen in (varying or values).items()]


def _decided_by_draws(reference: str) -> bool:
    """Whether the claim's failures are decided by its draws rather than its case (``Claim.decided_by_draws``)."""
    try:
        return bool(getattr(claim_at(reference), "decided_by_draws", False))
    except ClaimReferenceError:
        return False


def _left_unprobed(unprobed: dict[str, Cause], causes: list[Cause], failure: Failure, stopped: str) -> None:
    """``failure``, which probing never reached, listed with its test function's others (a widely failing kernel
    leaves a thousand: one entry per property, not one per failure, keeps the report readable)."""
    function = failure.prop.partition("[")[0]
    if function in unprobed:
        unprobed[function].members.append((failure, "the same test function, not probed either"))
        return
    unprobed[function] = Cause(failure, note=f"not probed: {stopped} (this property's unprobed failures together, "
                                             "not grouped by cause)", unprobed=True)
    causes.append(unprobed[function])


def find_causes(failures: list[Failure], prober: Prober) -> list[Cause]:
    """Group ``failures`` into causes by probing (see the module docstring); the causes in the order found:
    those probed first (simplest representative first), then crashes and failures without a case."""
    causes: list[Cause] = []
    by_draws: dict[Any, Cause] = {}  # a claim its draws decide -> its cause that needs nothing of the case
    unprobed: dict[str, Cause] = {}  # by test function: its failures left once probing stopped
    waiting = sorted((f for f in failures if f.probeable), key=_simplicity)
    while waiting:
        rep, rest = waiting[0], waiting[1:]
        reproduced = prober.fails(rep, rep.case)
        if reproduced is None and prober.stopped:
            _left_unprobed(unprobed, causes, rep, prober.stopped)
            waiting = rest
            continue
        if not reproduced:
            note = ("its own check passed on its case when probed (the property relates several calls or draws "
                    "beyond the case)" if reproduced is False else "not probed: the probe could not decide")
            causes.append(Cause(rep, note=note))
            waiting = rest
            continue
        claim = rep.claim
        if claim in by_draws:  # the same claim failing with other draws: each a check made or lacking, one cause
            by_draws[claim].members.append((rep, f"the same claim, decided by its draws, fails on its own case with "
                                                 f"{'; '.join(_draw_words([rep]))}"))
            waiting = rest
            continue
        needed = _vary(prober, rep)
        cause = Cause(rep, needs=needed.words, free=needed.free)
        # A cause its claim's draws decide (a corruption refused wrongly) says nothing of another claim that also
        # fails on its plain case: that one fails for a defect of its own.
        decided_by_draws = not needed.tests and _decided_by_draws(claim)
        waiting = []
        for other in rest:
            joinable = not prober.stopped and (other.claim == claim or not decided_by_draws)
            why = _joins(prober, rep, needed, other) if joinable else None
            if why:
                cause.members.append((other, why))
            else:
                waiting.append(other)
        causes.append(cause)
        if decided_by_draws:
            by_draws[claim] = cause
    for cause in by_draws.values():
        decided = [cause.representative, *(member for member, _ in cause.members)]
        cause.needs = ["; ".join(_draw_words(decided)) + " (the claim's draws decide it: each one refused wrongly "
                       "or not at all)"]
    caseless: dict[str, Cause] = {}  # by test function: a parametrized test's variants, none of them probeable
    for failure in failures:
        if failure.crashed:
            causes.append(Cause(failure, note="crashed: not probed (a fault poisons the probing process's CUDA "
                                              "context)"))
        elif failure.case is not None and failure.claim is None:
            causes.append(Cause(failure, note="not probed: its case file names no claim (written before case files "
                                              "recorded their property's claim)"))
        elif failure.case is None:
            function = failure.prop.partition("[")[0]
            if function in caseless:
                caseless[function].members.append((failure, "the same test function, no case to probe"))
                continue
            caseless[function] = Cause(failure, note="no case descriptor to probe ("
                                       + ("no case file" if not failure.case_file else "not a DecodeCase")
                                       + "): grouped by test function")
            causes.append(caseless[function])
    return causes


# ---- the run's failures, and the file -------------------------------------------------------


def failures_of_run(index: list[dict], failed_nodeids: list[str], isolated: bool = False,
                    knobs: tuple[str, ...] = ()) -> list[Failure]:
    """One ``Failure`` per failing property: its case file from the run's index (``casefiles.runs_index``),
    else the failing node id alone. Its claim is the one its case file records (else its index entry's ``claim``,
    a report part's); a case file from before claims were recorded names none, and is not probed. ``isolated``:
    the implementation ran in a child process, whose fault this process outlives, so a failure that lost a CUDA
    context there is probed like any other. ``knobs``: the names of the implementation's knobs, whose values its
    recorded calls hold."""
    failures, seen = [], set()
    for entry in index:
        prop = property_name(entry["nodeid"])
        if prop in seen:
            continue
        seen.add(prop)
        try:
            payload = load_case(entry["path"])
            case, draws = claim_from_fields(payload.get("claim")) or (case_from_fields(payload.get("case_fields")), {})
            case = _in_its_definition(case, payload)
            draws = {name: _in_its_definition(value, payload) for name, value in draws.items()}
        except (CaseFileError, TypeError, KeyError):
            payload, case, draws = {}, None, {}
        error = entry.get("error") or (payload.get("error") or "").partition("\n")[0]
        failures.append(Failure(entry["nodeid"], entry["path"], error,
                                crashed=not isolated and is_sticky_cuda_error(RuntimeError(error)), case=case,
                                draws=draws, knobs=_knobs_of(payload, knobs),
                                claim=payload.get("property_claim") or entry.get("claim")))
    for nodeid in failed_nodeids:
        if property_name(nodeid) not in seen:
            seen.add(property_name(nodeid))
            failures.append(Failure(nodeid))
    return failures


def _knobs_of(payload: dict, names: tuple[str, ...]) -> dict:
    """The values of the knobs ``names`` in a case file's first recorded call."""
    calls = payload.get("calls") or [{}]
    return {name: value for name, value in calls[0].get("kwargs", {}).items() if name in names}


def _in_its_definition(value: Any, payload: dict) -> Any:
    """A case as its probes build it, naming its definition unless it is the seed's (a case naming none is built for
    the seed's, the default a probe moves toward). An explicit example's case names none even where it ran under
    another definition: the one its case file was found under is written in."""
    if not dataclasses.is_dataclass(value) or not hasattr(value, "definition"):
        return value
    name = value.definition if value.definition is not None else definition_of(payload).name
    return replace(value, definition=None if name == definitions.SEED.name else name)


def as_json(causes: list[Cause], prober: Prober) -> dict:
    """The causes and the probes tried, as ``causes.json`` holds them (and ``summary_lines`` reads them)."""
    budget = prober.budget
    return {"causes": [cause.to_json() for cause in causes],
            "probes": {"tried": prober.tried, "used": budget.used, "limit": budget.probes,
                       "seconds": round(budget.spent, 2), "seconds_limit": budget.seconds, "stopped": prober.stopped}}


def grouped(failures: list[Failure], prober: Prober) -> dict:
    """``failures`` grouped into causes by ``prober`` (``find_causes``), as ``causes.json`` holds them: the one
    grouping of a run's end and of a merge of many hosts' reports (``report_merge``)."""
    return as_json(find_causes(failures, prober), prober)


def save(directory: Path, saved: dict) -> None:
    """Write ``causes.json`` (``as_json``) into the run report's directory."""
    (directory / FILE_NAME).write_text(json.dumps(saved, indent=1), encoding="utf-8")


def load(directory: Path) -> dict | None:
    """What ``save`` wrote, or None."""
    path = directory / FILE_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def summary_lines(saved: dict | None) -> list[str]:
    """The causes in words, for the terminal summary and report.md: 'N distinct failures', then each cause:
    what its minimal cases need, its representative with case file and replay command, the properties."""
    if not saved or not saved["causes"]:
        return []
    causes = saved["causes"]
    unprobed = sum(bool(cause.get("unprobed")) for cause in causes)
    lines = [f"{len(causes)} distinct failure{'s' if len(causes) != 1 else ''}"
             + (f" ({unprobed} of them failures not probed, one entry per property)" if unprobed else "")]
    for number, cause in enumerate(causes, 1):
        rep = cause["representative"]
        lines.append(f"{number}. {cause['summary']}: {len(cause['properties'])} propert"
                     f"{'y' if len(cause['properties']) == 1 else 'ies'}")
        lines.append(f"   case: {rep['case']}" + (f" (definition {rep['definition']})" if rep["definition"] else ""))
        if rep["case_file"]:
            lines += [f"   case file: {rep['case_file']}", f"   replay: {rep['replay']}"]
        if rep["error"]:
            lines.append(f"   error: {rep['error'][:200]}")
        lines += [f"   - {prop}" for prop in cause["properties"]]
    probes = saved["probes"]
    lines.append(f"(grouped by {probes['used']} probes of at most {probes['limit']}, {probes['seconds']} s of "
                 f"{probes['seconds_limit']} s" + (f"; stopped: {probes['stopped']}" if probes["stopped"] else "")
                 + ")")
    return lines
