"""Checks shared by the property files: run-and-compare, bitwise equality, untouched inputs, poisoned memory."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import NamedTuple

import torch
from hypothesis import note, settings, target
from hypothesis import strategies as st

from gqa_decode_fuzz import reference
from gqa_decode_fuzz.generation.cases import DecodeCase, DecodeInputs
from gqa_decode_fuzz.generation.oracles import oracle_of
from gqa_decode_fuzz.generation.stages import timed
from gqa_decode_fuzz.generation.strategies import SizeLimits, decode_cases, run_sized
from gqa_decode_fuzz.reference import compare as _compare

Reference = reference.Reference
assert_within_bound = timed("checks", reference.assert_within_bound)


def share_of_examples(fraction: float, *, at_least: int = 5) -> settings:
    """Settings running ``fraction`` of the active profile's examples: for properties that call the kernel often."""
    return settings(max_examples=max(at_least, round(settings.default.max_examples * fraction)))


class Checked(NamedTuple):
    """A result that passed ``run_and_check``, with the reference it was held to."""

    output: torch.Tensor
    lse: torch.Tensor
    reference: Reference
    worst_ratio: float  # the largest err/bound over output and lse


def run_and_check(impl: Callable, inputs: DecodeInputs, context: str) -> Checked:
    """Run ``impl`` on ``inputs``; assert shapes, dtypes, device and values within the oracle's bound.

    An implementation that declares no LSE returns ``lse=None``: the output is checked alone.
    """
    __tracebackhide__ = True
    output, lse = impl(*inputs)
    assert_result_metadata(output, lse, inputs, context)
    reference = oracle_of(inputs)
    worst = assert_within_bound(output, lse, reference, context=context)
    return Checked(output, lse, reference, worst)


def steer_toward_the_bound(worst_ratio: float) -> None:
    """Note an example's worst err/bound and let Hypothesis's target phase search for larger ones."""
    note(f"worst err/bound {worst_ratio:.3g}")
    target(min(worst_ratio, 1e6), label="worst err/bound")  # target needs a finite score


def assert_result_metadata(output: torch.Tensor, lse: torch.Tensor, inputs: DecodeInputs, context: str) -> None:
    """Output is [B, H, D] bfloat16 and lse [B, H] float32 (unless None), as q, both on q's device."""
    __tracebackhide__ = True
    q_shape, device = tuple(inputs.q.shape), inputs.q.device
    for name, tensor, shape, dtype in (
        ("output", output, q_shape, torch.bfloat16),
        ("lse", lse, q_shape[:2], torch.float32),
    ):
        if tensor is None and name == "lse":
            continue
        got = (tuple(tensor.shape), tensor.dtype, tensor.device)
        assert got == (shape, dtype, device), f"{context}\n{name} is {got}, expected {(shape, dtype, device)}"


@functools.partial(timed, "checks")
def assert_same_result(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor],
                       context: str) -> None:
    """Output and lse bit for bit equal (lse skipped when the implementation returns none)."""
    __tracebackhide__ = True
    _compare.raise_if_any([_compare.compare(name, a, e) for name, a, e in zip(("output", "lse"), actual, expected)
                           if a is not None or e is not None], context)


def assert_equivalent(impl: Callable, contract: str, inputs: DecodeInputs, baseline: tuple, context: str) -> None:
    """``impl(*inputs)`` gives the answer ``baseline`` gave for an equivalent call.

    strict: bit for bit. correct: within the oracle's bound (a correct implementation may round
    differently from call to call, e.g. with split points chosen per call).
    """
    __tracebackhide__ = True
    if contract == "strict":
        assert_same_result(impl(*inputs), baseline, context)
    else:
        run_and_check(impl, inputs, context)


def _storage_of(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor a view was cut from (padding and gaps included)."""
    return tensor._base if tensor._base is not None else tensor


def snapshot(inputs: DecodeInputs) -> dict[str, torch.Tensor]:
    """Copies of every input tensor's whole storage, to compare after a call."""
    return {
        name: _storage_of(value).clone()
        for name, value in inputs._asdict().items() if isinstance(value, torch.Tensor)
    }


@functools.partial(timed, "checks")
def assert_unchanged(inputs: DecodeInputs, before: dict[str, torch.Tensor], context: str) -> None:
    """Every input storage still holds the bits ``snapshot`` recorded."""
    __tracebackhide__ = True
    _compare.raise_if_any(
        [_compare.compare(f"{name} (whole storage)", _storage_of(getattr(inputs, name)), saved)
         for name, saved in before.items()],
        f"{context}\nthe call wrote into its inputs:",
    )


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Fresh torch.empty memory is filled with NaN (floats) or the maximum (integers) inside the block."""
    fill = torch.utils.deterministic
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = fill.fill_uninitialized_memory
    _deterministic_algorithms(True, warn_only=True)  # only the fill is wanted, not errors
    fill.fill_uninitialized_memory = True
    try:
        yield
    finally:
        fill.fill_uninitialized_memory = was_filling
        _deterministic_algorithms(was_deterministic, warn_only=was_warn_only)


# torch.use_deterministic_algorithms also sets an Inductor option, and importing Inductor for that costs
# each worker 2 s or more on its first call (most of this property's time); the switch itself is the C one.
_deterministic_algorithms = getattr(torch._C, "_set_deterministic_algorithms", torch.use_deterministic_algorithms)


def shorter(limits: SizeLimits) -> SizeLimits:
    """Half the longest sequence (at least two kernel blocks), for properties that run several calls per case."""
    return replace(limits, max_len=max(limits.max_len // 2, 129))


def short_cases(**options) -> st.SearchStrategy[DecodeCase]:
    """``decode_cases(**options)`` within ``shorter`` of the run's limits, built when it first draws
    (``run_sized``): for properties that run several calls per case."""
    return run_sized(lambda limits: decode_cases(limits=shorter(limits), **options))
