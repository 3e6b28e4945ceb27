"""The bound's deviation term (``bound._logit_term``) as one Triton kernel, for CUDA tensors.

The torch path forms |v_l - o| for every (sequence, KV head, query head, token, dim) in float64, 32 KiB per token
slot at 32 query heads, writes it twice (the difference, its absolute value) and reads it twice (the weighted
sum, the maximum): most of the oracle's device time and of its graphs' memory. This kernel keeps each tile of it
in registers and walks only a sequence's own tokens, not its padding. Same float64 arithmetic, its sums in
another order; ``tests/test_bound.py`` holds it to the torch path, in Triton's interpreter on the CPU and on CUDA.
``bound`` uses it for CUDA tensors only (on the CPU the torch path is faster than the interpreter), once
``_fused_guard`` has checked it on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["deviation_term"]

# A tile is 8 query heads x 16 tokens x 32 dims of float64, and a program walks 64 tokens of one sequence: a long
# sequence is spread over many programs, whose partial sums and maxima torch then reduces in a fixed order (no
# atomics: the same bits every run). Fixed sizes (and unspecialised integers) keep one compiled kernel for every
# shape and definition: a new specialisation would compile inside a graph capture.
_BLOCK_J, _BLOCK_L, _BLOCK_D, _SPLIT = 8, 16, 32, 64
_SIZES = ["groups", "heads", "dim", "c_b", "c_g", "c_j", "c_l", "v_b", "v_g", "v_l", "v_d", "o_b", "o_g", "o_j",
          "o_d", "partial_split"]


@triton.jit(do_not_specialize=_SIZES)
def _deviation_kernel(coefficients, values, output, lengths, sums, maxima,
                      groups, heads, dim,
                      c_b, c_g, c_j, c_l, v_b, v_g, v_l, v_d, o_b, o_g, o_j, o_d, partial_split,
                      BLOCK_J: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr):
    """Over the tokens [s SPLIT, (s + 1) SPLIT) of the sequence's own (l < lengths[b]), for split s:
    sums[s, b, g, j, d] = sum_l a[b, g, j, l] |v[b, g, l, d] - o[b, g, j, d]| and maxima[s, ...] = max_l |v - o|
    (0 where the split holds no token). Both are contiguous [splits, b, g, j, d]."""
    pair = tl.program_id(0).to(tl.int64)
    seq, group = pair // groups, pair % groups
    d_blocks = tl.cdiv(dim, BLOCK_D)
    d = (tl.program_id(1) % d_blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = (tl.program_id(1) // d_blocks) * BLOCK_J + tl.arange(0, BLOCK_J)
    split = tl.program_id(2)
    head_dim = (j[:, None] < heads) & (d[None, :] < dim)
    o = tl.load(output + seq * o_b + group * o_g + j[:, None] * o_j + d[None, :] * o_d, mask=head_dim, other=0.0)
    end = tl.minimum(tl.load(lengths + seq), (split + 1) * SPLIT)
    weighted = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float64)
    largest = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float64)
    for start in range(split * SPLIT, end, BLOCK_L):
        token = start + tl.arange(0, BLOCK_L)
        inside = token < end
        v = tl.load(values + seq * v_b + group * v_g + token[:, None] * v_l + d[None, :] * v_d,
                    mask=inside[:, None] & (d[None, :] < dim), other=0.0)  # [L, D]
        a = tl.load(coefficients + seq * c_b + group * c_g + j[:, None] * c_j + token[None, :] * c_l,
                    mask=(j[:, None] < heads) & inside[None, :], other=0.0)  # [J, L]
        deviation = tl.where(inside[None, :, None], tl.abs(v[None, :, :] - o[:, None, :]), 0.0)  # [J, L, D]
        weighted += tl.sum(a[:, :, None] * deviation, axis=1)
        largest = tl.maximum(largest, tl.max(deviation, axis=1))
    at = split * partial_split + ((seq * groups + group) * heads + j[:, None]) * dim + d[None, :]
    tl.store(sums + at, weighted, mask=head_dim)
    tl.store(maxima + at, largest, mask=head_dim)


def deviation_term(coefficients: torch.Tensor, by_group: torch.Tensor, output: torch.Tensor,
                   lengths: torch.Tensor) -> torch.Tensor:
    """``bound._logit_term`` for CUDA tensors: ``coefficients`` a [b, g, j, L], ``by_group`` V [b, g, L, d],
    ``output`` [b, g, j, d] (all float64), ``lengths`` each sequence's tokens ([b], any dtype holding whole
    numbers). Returns [b, g, j, d] float64. No host synchronisation: capturable in a CUDA graph."""
    count, groups, heads, slots = coefficients.shape
    dim = by_group.shape[-1]
    tokens = lengths.reshape(count).to(torch.int32)  # a fresh tensor: aligned like every other pointer here
    splits = max(1, triton.cdiv(slots, _SPLIT))
    shape = (splits, count, groups, heads, dim)
    sums = torch.empty(shape, dtype=torch.float64, device=coefficients.device)
    maxima = torch.empty(shape, dtype=torch.float64, device=coefficients.device)
    if sums.numel():
        grid = (count * groups, triton.cdiv(dim, _BLOCK_D) * triton.cdiv(heads, _BLOCK_J), splits)
        _deviation_kernel[grid](coefficients, by_group, output, tokens, sums, maxima, groups, heads, dim,
                                *coefficients.stride(), *by_group.stride(), *output.stride(), sums[0].numel(),
                                BLOCK_J=_BLOCK_J, BLOCK_L=_BLOCK_L, BLOCK_D=_BLOCK_D, SPLIT=_SPLIT)
    # A NaN deviation makes its split's sum NaN (a >= 0 is finite) while the hardware's max may drop it:
    # torch.minimum keeps the NaN, as the torch path's does.
    return torch.minimum(sums.sum(dim=0), maxima.amax(dim=0))
