"""The implementation as a run calls it: bound to the active definition, as declared, guarded, its knobs drawn.

``guarded_impl`` is what a run's tests and its root-cause probes call, and what ``merge-reports`` probes a merged
report's failures with: one composition, so that each of them calls the implementation the same way.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from gqa_decode_fuzz.generation import cases, stages
from gqa_decode_fuzz.generation.cases import DecodeInputs
from gqa_decode_fuzz.generation.prefill_cases import PrefillInputs
from gqa_decode_fuzz.reference.definitions import Definition
from gqa_decode_fuzz.reference.oracle import token_lengths
from gqa_decode_fuzz.reference.prefill_oracle import visible_keys

from . import knobs
from .containment import Guard
from .target import Target

__all__ = ["guarded_impl"]

def _rows_without_keys(definition: Definition, args: tuple, kwargs: dict) -> torch.Tensor:
    """A bool per output row of a call in the suite's order: True where the row sees no key (an empty decode
    sequence; a prefill row whose causal window is empty, under the bottom-right mask)."""
    names = PrefillInputs._fields if definition.prefill else DecodeInputs._fields
    bound = dict(zip(names, args)) | {name: kwargs[name] for name in names if name in kwargs}
    kv_bounds = bound["kv_indptr"].tolist()
    if not definition.prefill:
        return torch.tensor([end == start for start, end in zip(kv_bounds, kv_bounds[1:])], dtype=torch.bool)
    if not definition.page_size:  # ragged: kv_indptr counts tokens
        kv_lens = [end - start for start, end in zip(kv_bounds, kv_bounds[1:])]
    else:
        last = bound.get("kv_last_page_len")
        kv_lens = token_lengths(kv_bounds, None if last is None else last.tolist(), definition.page_size)
    q_lens = bound["qo_indptr"].to("cpu", torch.int64).diff()
    _, seen = visible_keys(q_lens, torch.tensor(kv_lens, dtype=torch.int64))
    return seen == 0


def _as_declared(target: Target, function: Callable) -> Callable:
    """``function`` whose LSE is None exactly when the target declares ``returns_lse = False``, and whose
    rows that see no key read as the contract's (0, -inf) when it waives ``empty_sequences``."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        output, lse = function(*args, **kwargs)
        if target.returns_lse and lse is None:
            raise AssertionError(f"{target.spec} returned lse=None; an implementation without a final LSE "
                                 "declares returns_lse = False")
        lse = lse if target.returns_lse else None
        if "empty_sequences" in target.waives and isinstance(output, torch.Tensor):
            unseen = _rows_without_keys(cases.active_definition(), args, kwargs).to(output.device)
            if unseen.shape[0] == output.shape[0]:  # a wrong-shaped answer is the comparison's to report
                output = torch.where(unseen[:, None, None], 0.0, output).to(output.dtype)
                if isinstance(lse, torch.Tensor) and lse.shape[0] == unseen.shape[0]:
                    lse = torch.where(unseen[:, None], -math.inf, lse)
        return output, lse

    return call


def guarded_impl(target: Target, guard: Guard, on_call: Callable[[tuple, dict], None], knob_draws: knobs.KnobDraws,
                 *, isolated: bool) -> Callable:
    """``target`` bound to the active definition, as declared, each call reported to ``on_call`` and its faults
    contained by ``guard``, its knobs drawn, its time counted as the kernel stage: what a run's tests and its
    root-cause probes call, and what ``report_merge`` probes a merged report's failures with."""

    @functools.wraps(target.function)
    def in_active_definition(*args, **kwargs):
        return target.serving(cases.active_definition())(*args, **kwargs)

    # The knobs outside the recorder: each recorded call holds the values it ran with, so a case file replays
    # them and the root-cause probes take them.
    guarded = guard.wrap(_as_declared(target, in_active_definition), on_call, settles=not isolated)
    return stages.timed("kernel", knob_draws.applied_to(guarded))
