"""The comparison's verdict in two Triton launches, for CUDA tensors: ``compare.error_ratio`` element by element,
then how many ratios pass 1, the largest and the first place it occurs.

In torch the verdict of one comparison is a launch per step (the error, its masks and mappings, the ratio, the
maximum, the count, the stack), each a turn on a GPU that workers share (counts: docs/performance.md). Here one
launch forms the ratios of a block of elements and reduces them to a partial verdict, and one more reduces the
partials in order (no atomics: the same verdict every run). The element steps are ``error_ratio``'s, in float64;
``tests/test_compare.py`` holds the verdict to the torch path's, in Triton's interpreter on the CPU and on CUDA,
and ``_fused_guard`` checks it on each device before its first use there. ``compare`` uses it for CUDA tensors
only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["verdict"]

_BLOCK = 1024  # elements a program reduces
_PARTIALS_BLOCK = 1024  # partial verdicts the last program reduces at a step


@triton.jit
def _largest_double():
    """The largest finite float64, where nan_to_num maps -inf (from its bits: a float literal would be float32)."""
    return tl.full([], 0x7FEFFFFFFFFFFFFF, tl.int64).to(tl.float64, bitcast=True)


@triton.jit
def _ratio(actual, expected, bound):
    """``compare.error_ratio``'s ratio: NaN counts as infinite error, equal infinities as 0, an error against a
    NaN bound as infinitely over it, no error as no error."""
    err = tl.abs(actual - expected)
    err = tl.where(actual == expected, 0.0, err)  # equal infinities (inf - inf is NaN); equal finite ones give 0
    err = tl.where(err != err, float("inf"), err)
    ratio = tl.where(err == 0.0, 0.0, err / bound)  # float64: IEEE division
    ratio = tl.where(ratio != ratio, float("inf"), ratio)
    return tl.where(ratio == -float("inf"), -_largest_double(), ratio)


@triton.jit
def _partial_kernel(actual, expected, bound, counts, largest, first, elements, BLOCK: tl.constexpr):
    """Per block of elements: how many ratios pass 1, the largest ratio, and the first element holding it."""
    program = tl.program_id(0)
    offsets = program.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < elements
    ratio = _ratio(tl.load(actual + offsets, mask=inside, other=0.0).to(tl.float64),
                   tl.load(expected + offsets, mask=inside, other=0.0),
                   tl.load(bound + offsets, mask=inside, other=1.0))
    ratio = tl.where(inside, ratio, -float("inf"))  # below every ratio (the smallest is -_largest_double())
    best = tl.max(ratio, axis=0)
    tl.store(counts + program, tl.sum((ratio > 1.0).to(tl.int64), axis=0))
    tl.store(largest + program, best)
    tl.store(first + program, tl.min(tl.where(ratio == best, offsets, elements), axis=0))


@triton.jit
def _verdict_kernel(counts, largest, first, verdict, partials, elements, BLOCK: tl.constexpr):
    """verdict = [count, first index of the largest ratio, the largest ratio] over every partial, as float64."""
    total = tl.zeros([], dtype=tl.int64)
    best = tl.full([], -float("inf"), dtype=tl.float64)
    where = tl.full([], elements, dtype=tl.int64)
    for start in range(0, partials, BLOCK):
        index = start + tl.arange(0, BLOCK)
        inside = index < partials
        block_largest = tl.load(largest + index, mask=inside, other=-float("inf"))
        block_best = tl.max(block_largest, axis=0)
        block_where = tl.min(tl.where(block_largest == block_best, tl.load(first + index, mask=inside,
                                                                           other=elements), elements), axis=0)
        total += tl.sum(tl.load(counts + index, mask=inside, other=0), axis=0)
        where = tl.where(block_best > best, block_where,
                         tl.where(block_best == best, tl.minimum(where, block_where), where))
        best = tl.maximum(best, block_best)
    tl.store(verdict, total.to(tl.float64))
    tl.store(verdict + 1, where.to(tl.float64))
    tl.store(verdict + 2, best)


def verdict(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, *, block: int = _BLOCK,
            partials_block: int = _PARTIALS_BLOCK) -> torch.Tensor:
    """[elements over their bound, flat index of the worst, worst err/bound] as float64 on ``expected``'s device,
    not read back: ``compare``'s verdict of ``actual`` (any float dtype) against float64 ``expected`` and
    ``bound`` of its shape, all on one CUDA device (or the CPU under Triton's interpreter), at least one element.
    ``block`` and ``partials_block`` (powers of 2) size the two launches' steps."""
    actual, expected, bound = (t.contiguous().view(-1) for t in (actual, expected, bound))
    elements = expected.numel()
    programs = triton.cdiv(elements, block)
    device = expected.device
    counts = torch.empty(programs, dtype=torch.int64, device=device)
    largest = torch.empty(programs, dtype=torch.float64, device=device)
    first = torch.empty(programs, dtype=torch.int64, device=device)
    _partial_kernel[(programs,)](actual, expected, bound, counts, largest, first, elements, BLOCK=block)
    result = torch.empty(3, dtype=torch.float64, device=device)
    _verdict_kernel[(1,)](counts, largest, first, result, programs, elements, BLOCK=partials_block)
    return result
