"""The one comparison of a result with what it should be, and the one report of a mismatch.

Against the oracle, an element passes when ``|actual - expected| <= bound`` (NaN never,
infinities only exactly). Bit-for-bit equality is the same comparison at zero distance:
``bound=None`` compares raw bit patterns, so NaN equals the same NaN and -0 differs from 0.
Every property, the replay command and the benchmarks report through ``Mismatch``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import _fused_guard
from .oracle import Reference

__all__ = [
    "AXES", "Mismatch", "assert_within_bound", "check_against_reference", "compare", "compare_all", "error_ratio",
]

# Axis names of each result, for "worst at (seq=1, head=5, dim=77)"; other tensors get i, j, k, ...
AXES = {"output": ("seq", "head", "dim"), "lse": ("seq", "head")}
_GENERIC_AXES = ("i", "j", "k", "l", "m", "n")


@dataclass(frozen=True)
class Mismatch:
    """How one tensor compares: ``count`` of ``total`` elements off, and the worst one.

    ``bound`` is None for a bitwise comparison. ``problem`` describes a metadata
    mismatch (shape or dtype), in which case no element was compared.
    """

    name: str
    count: int = 0
    total: int = 0
    worst_ratio: float = 0.0  # max err / bound (inf where the bound is 0 and err > 0)
    worst_index: tuple[int, ...] = ()
    actual: float = 0.0
    expected: float = 0.0
    err: float = 0.0
    bound: float | None = None
    axes: tuple[str, ...] = ()
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem and self.count == 0

    @property
    def message(self) -> str:
        """'' when within bound, else one line: what, how many, and the worst element with its address."""
        if self.problem:
            return f"{self.name}: {self.problem}"
        if self.ok:
            return ""
        where = ", ".join(f"{axis}={i}" for axis, i in zip(self.axes, self.worst_index))
        share = f"{self.count} / {self.total} ({100.0 * self.count / self.total:.2g}%)"
        if self.bound is None:
            return (f"{self.name} differs bitwise in {share} elements; first at ({where}): "
                    f"got {self.actual!r}, expected {self.expected!r}")
        return (f"{self.name} not within bound: mismatched {share}; worst at ({where}): got {self.actual:.6g}, "
                f"expected {self.expected:.6g}, err {self.err:.3g}, bound {self.bound:.3g} ({self.worst_ratio:.3g}x)")


def error_ratio(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Element-wise |actual - expected| and err / bound: NaN counts as infinite error, equal infinities as 0, and
    an error against a NaN bound as infinitely over it (a NaN ratio compares false, so it would pass)."""
    actual = actual.double().to(expected.device)
    same_inf = torch.isinf(expected) & (actual == expected)
    # In place, with no scalar operand: on a GPU each torch.where(mask, 0.0, x) also launched a fill for its 0.0.
    err = (actual - expected).abs_().masked_fill_(same_inf, 0.0).nan_to_num_(nan=math.inf, posinf=math.inf)
    ratio = (err / bound).masked_fill_(err == 0, 0.0).nan_to_num_(nan=math.inf, posinf=math.inf)
    return err, ratio  # NaN never passes; no error is no error, whatever the bound


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    integer = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().contiguous().view(integer)


def _unravel(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    coords = []
    for size in reversed(shape):
        coords.append(flat_index % size)
        flat_index //= size
    return tuple(reversed(coords))


def _metadata_problem(actual: torch.Tensor, expected: torch.Tensor, bitwise: bool) -> str:
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    if bitwise and actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    return ""


def compare(name: str, actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor | None = None,
            axes: tuple[str, ...] | None = None) -> Mismatch:
    """Compare ``actual`` with ``expected`` element-wise, within ``bound``, or bit for bit when it is None."""
    return compare_all([(name, actual, expected, bound)], axes)[0]


class _Pending(NamedTuple):
    """A comparison within bound whose verdict (off count, worst index, worst ratio) is still on the device."""

    slot: int
    name: str
    axes: tuple[str, ...]
    actual: torch.Tensor
    expected: torch.Tensor
    bound: torch.Tensor
    verdict: torch.Tensor


_FUSED_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _verdict(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """[elements over their bound, flat index of the worst, worst err/bound], float64, on the device: two Triton
    launches for CUDA tensors of one device (``_fused_compare``), else ``error_ratio`` and torch reductions."""
    if (actual.is_cuda and actual.device == expected.device == bound.device and actual.dtype in _FUSED_DTYPES
            and expected.dtype == bound.dtype == torch.float64 and bound.shape == expected.shape
            and _fused_guard.trusted("the comparison's verdict", actual.device, _verdict_agrees)):
        from . import _fused_compare  # Triton, imported on first use: the CPU never needs it

        return _fused_compare.verdict(actual, expected, bound)
    return _verdict_in_torch(actual, expected, bound)


def _verdict_in_torch(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    _, ratio = error_ratio(actual, expected, bound)
    flat = ratio.flatten()
    worst_ratio, at_worst = flat.max(dim=0)  # not flat[flat.argmax()]: a tensor index is read back
    return torch.stack([(flat > 1).sum().double(), at_worst.double(), worst_ratio])


def _verdict_agrees(device: torch.device) -> bool:
    """The fused verdict against the torch path's, bit for bit, on fixed comparisons over three of its blocks
    (``_fused_guard``): NaN and infinite results, equal infinities, no error against a zero or NaN bound; ties at
    err/bound exactly 1; bounds of -0 (err / -0 is -inf); each with a bfloat16 and a float32 result."""
    from . import _fused_compare

    generator = torch.Generator().manual_seed(0)
    expected = torch.randn(3000, generator=generator, dtype=torch.float64)
    near = expected + torch.randn(3000, generator=generator, dtype=torch.float64) * 1e-3
    bound = torch.rand(3000, generator=generator, dtype=torch.float64) + 0.5
    hostile = near.clone()
    hostile[[7, 8, 9, 10]] = torch.tensor([math.nan, math.inf, -math.inf, 5.0], dtype=torch.float64)
    hostile_expected = expected.clone()
    hostile_expected[8] = math.inf
    hostile[11] = hostile_expected[11] = 0.75  # no error in either dtype
    hostile_bound = bound.clone()
    hostile_bound[[10, 11]] = torch.tensor([math.nan, 0.0], dtype=torch.float64)
    tied, tied_expected = near.clone(), expected.clone()
    tied[1000:1400], tied_expected[1000:1400] = 2.0, 1.0
    tied_bound = bound.clone()
    tied_bound[1000:1400] = 1.0
    comparisons = [(hostile, hostile_expected, hostile_bound), (tied, tied_expected, tied_bound),
                   (near, expected, torch.full_like(bound, -0.0))]
    for actual, exact, allowed in comparisons:
        for dtype in (torch.bfloat16, torch.float32):
            rounded = actual.to(dtype)
            got = _fused_compare.verdict(rounded.to(device), exact.to(device), allowed.to(device)).cpu()
            if not torch.equal(got.view(torch.int64), _verdict_in_torch(rounded, exact, allowed).view(torch.int64)):
                return False
    return True


def compare_all(comparisons: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None]],
                axes: tuple[str, ...] | None = None) -> list[Mismatch]:
    """``compare`` for each (name, actual, expected, bound), the verdicts within bound read back at once.

    One read-back, not one per tensor: on a GPU shared by several processes each read-back waits for a
    turn on the device. Locating the worst element of a tensor that is off reads more, after the verdict.
    """
    found: list[Mismatch | None] = []
    pending: list[_Pending] = []
    for name, actual, expected, bound in comparisons:
        named_axes = axes or AXES.get(name, _GENERIC_AXES)
        problem = _metadata_problem(actual, expected, bound is None)
        if problem:
            found.append(Mismatch(name, worst_ratio=math.inf, axes=named_axes, problem=problem))
        elif bound is None:
            found.append(_bitwise(name, actual, expected, named_axes))
        elif not expected.numel():
            found.append(Mismatch(name, 0, 0, 0.0, axes=named_axes))
        else:
            verdict = _verdict(actual, expected, bound)
            pending.append(_Pending(len(found), name, named_axes, actual, expected, bound, verdict))
            found.append(None)
    verdicts = torch.cat([p.verdict for p in pending]).tolist() if pending else []
    for p, (count, worst, worst_ratio) in zip(pending, zip(*[iter(verdicts)] * 3)):
        # Only a comparison that is off reads its elements: the worst one's error and ratio.
        err, ratio = error_ratio(p.actual, p.expected, p.bound) if count else (None, None)
        found[p.slot] = _located(p.name, int(count), p.expected.numel(), int(worst), worst_ratio, p.axes,
                                 p.actual, p.expected, ratio, err, p.bound)
    return found


def _bitwise(name: str, actual: torch.Tensor, expected: torch.Tensor, axes: tuple[str, ...]) -> Mismatch:
    actual_cpu, expected_cpu = actual.detach().cpu(), expected.detach().cpu()
    off = _bits(actual_cpu) != _bits(expected_cpu)
    count = int(off.sum())
    worst = int(torch.nonzero(off.flatten())[0]) if count else 0
    return _located(name, count, off.numel(), worst, math.inf if count else 0.0, axes, actual_cpu, expected_cpu,
                    torch.where(off, math.inf, 0.0), None, None)


def _located(name: str, count: int, total: int, worst: int, worst_ratio: float, axes: tuple[str, ...],
             actual: torch.Tensor, expected: torch.Tensor, ratio: torch.Tensor | None, err: torch.Tensor | None,
             bound: torch.Tensor | None) -> Mismatch:
    """The Mismatch of a comparison whose verdict is known: the worst element's values only when one is off
    (``ratio`` is then given)."""
    if not count:
        return Mismatch(name, 0, total, worst_ratio, axes=axes)

    def at(tensor: torch.Tensor) -> float:
        return float(tensor.flatten()[worst])

    return Mismatch(
        name, count, total, at(ratio), _unravel(worst, expected.shape), at(actual), at(expected),
        err=at(err) if err is not None else math.inf, bound=at(bound) if bound is not None else None, axes=axes,
    )


def check_against_reference(output: torch.Tensor, lse: torch.Tensor | None, reference: Reference) -> list[Mismatch]:
    """Output (and lse, unless None: an implementation that returns none) against the oracle's answer and bound."""
    comparisons = [("output", output, reference.output, reference.output_bound)]
    if lse is not None:
        comparisons.append(("lse", lse, reference.lse, reference.lse_bound))
    return compare_all(comparisons)


def raise_if_any(mismatches: list[Mismatch], context: str = "") -> None:
    """AssertionError with every mismatch's message (after ``context``) when any element is off."""
    __tracebackhide__ = True
    failed = [m.message for m in mismatches if not m.ok]
    if failed:
        raise AssertionError("\n".join(([context] if context else []) + failed))


def assert_within_bound(output: torch.Tensor, lse: torch.Tensor | None, reference: Reference,
                        context: str = "") -> float:
    """Raise AssertionError with a report unless both results are within bound; return the worst err/bound."""
    __tracebackhide__ = True
    mismatches = check_against_reference(output, lse, reference)
    raise_if_any(mismatches, context)
    return max(m.worst_ratio for m in mismatches)
