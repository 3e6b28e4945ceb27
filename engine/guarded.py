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

from . import knobs
from .containment import Guard
from .target import Target

__all__ = ["guarded_impl"]

def _as_declared(target: Target, function: Callable) -> Callable:
    """``function`` whose LSE is None exactly when the target declares ``returns_lse = False``, and whose
    empty sequences' rows read as the contract's (0, -inf) when it waives ``empty_sequences``."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        output, lse = function(*args, **kwargs)
        if target.returns_lse and lse is None:
            raise AssertionError(f"{target.spec} returned lse=None; an implementation without a final LSE "
                                 "declares returns_lse = False")
        lse = lse if target.returns_lse else None
        if "empty_sequences" in target.waives and isinstance(output, torch.Tensor):
            indptr = kwargs["kv_indptr"] if "kv_indptr" in kwargs else args[3]
            empty = (indptr[1:] == indptr[:-1]).to(output.device)
            output = torch.where(empty[:, None, None], 0.0, output).to(output.dtype)
            lse = None if lse is None else torch.where(empty[:, None], -math.inf, lse)
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
