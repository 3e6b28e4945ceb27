"""One comparison of an implementation's result against the oracle, with a readable report."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .oracle import Reference

__all__ = ["Mismatch", "assert_within_bound", "check_against_reference", "error_ratio"]

_OUTPUT_AXES = ("seq", "head", "dim")
_LSE_AXES = ("seq", "head")


@dataclass(frozen=True)
class Mismatch:
    """How one result tensor compares with the reference: empty ``message`` means within bound."""

    name: str
    worst_ratio: float  # max err / bound over finite elements (inf where the bound is 0 and err > 0)
    message: str


def _where(axes: tuple[str, ...], flat_index: int, shape: torch.Size) -> str:
    coords = []
    for size in reversed(shape):
        coords.append(flat_index % size)
        flat_index //= size
    return ", ".join(f"{axis}={c}" for axis, c in zip(axes, reversed(coords)))


def error_ratio(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Element-wise |actual - expected| and err / bound: NaN counts as infinite error, equal infinities as 0."""
    actual = actual.double().to(expected.device)
    same_inf = torch.isinf(expected) & (actual == expected)
    err = torch.where(same_inf, 0.0, (actual - expected).abs())
    err = torch.where(torch.isnan(err), torch.inf, err)  # NaN never passes
    return err, torch.where(err == 0, 0.0, err / bound)


def _compare(name: str, axes, actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> Mismatch:
    if actual.shape != expected.shape:
        return Mismatch(name, float("inf"), f"{name}: shape {list(actual.shape)}, expected {list(expected.shape)}")
    actual = actual.double().to(expected.device)
    err, ratio = error_ratio(actual, expected, bound)
    bad = ratio > 1
    worst = int(ratio.argmax()) if ratio.numel() else 0
    worst_ratio = float(ratio.flatten()[worst]) if ratio.numel() else 0.0
    if not bool(bad.any()):
        return Mismatch(name, worst_ratio, "")
    count, total = int(bad.sum()), bad.numel()
    flat = lambda t: float(t.flatten()[worst])  # noqa: E731
    message = (
        f"{name} not within bound: mismatched {count} / {total} ({100.0 * count / total:.2g}%); "
        f"worst at ({_where(axes, worst, expected.shape)}): got {flat(actual):.6g}, "
        f"expected {flat(expected):.6g}, err {flat(err):.3g}, bound {flat(bound):.3g} ({worst_ratio:.3g}x)"
    )
    return Mismatch(name, worst_ratio, message)


def check_against_reference(output: torch.Tensor, lse: torch.Tensor, reference: Reference) -> list[Mismatch]:
    """Compare output and LSE element-wise: |actual - ref| <= bound, NaN never, infinities exactly."""
    return [
        _compare("output", _OUTPUT_AXES, output, reference.output, reference.output_bound),
        _compare("lse", _LSE_AXES, lse, reference.lse, reference.lse_bound),
    ]


def assert_within_bound(output: torch.Tensor, lse: torch.Tensor, reference: Reference, context: str = "") -> float:
    """Raise AssertionError with a report unless both results are within bound; return the worst err/bound."""
    __tracebackhide__ = True
    mismatches = check_against_reference(output, lse, reference)
    failed = [m.message for m in mismatches if m.message]
    if failed:
        raise AssertionError("\n".join(([context] if context else []) + failed))
    return max(m.worst_ratio for m in mismatches)
