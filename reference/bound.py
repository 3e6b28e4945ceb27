"""Error bounds: how far a correct implementation of the contract may land from float64.

First version: a deterministic worst-case model of the precision the contract
allows (docs/tolerance.md). Pure functions of the oracle's float64 intermediates.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

U_FP32 = 2.0**-24  # unit roundoff of float32 (round to nearest)
U_BF16 = 2.0**-8  # unit roundoff of bfloat16 (8 significand bits)
HEAD_DIM = 128


class SoftmaxTerms(NamedTuple):
    """Float64 intermediates of one chunk; shapes use b sequences, g KV heads, j heads per group, L tokens."""

    logits: torch.Tensor  # [b, g, j, L] scaled logits, -inf past a sequence's end
    weights: torch.Tensor  # [b, g, j, L] softmax weights, 0 past the end
    values: torch.Tensor  # [b, L, g, d] V rows, 0 past the end
    output: torch.Tensor  # [b, g, j, d] exact output
    logit_magnitude: torch.Tensor  # [b, g, j, L] |scale| * sum_d |q_d k_d|
    lse_natural: torch.Tensor  # [b, g, j] natural-log LSE, -inf for empty sequences
    lengths: torch.Tensor  # [b] tokens per sequence


def logit_error(terms: SoftmaxTerms) -> torch.Tensor:
    """Per-token bound on the error of the float32 logit, as it enters exp ([b, g, j, L])."""
    finite = torch.where(terms.weights > 0, terms.logits, 0.0).abs()
    peak = finite.amax(dim=-1, keepdim=True)
    return U_FP32 * (HEAD_DIM * terms.logit_magnitude + 4.0 * (finite + peak) + 4.0)


def output_bound(terms: SoftmaxTerms) -> torch.Tensor:
    """Allowed |output - reference| per element ([b, g, j, d])."""
    w, v = terms.weights, terms.values
    abs_weighted_v = torch.einsum("bgjl,blgd->bgjd", w, v.abs())
    spread = torch.einsum("bgjl,blgd->bgjd", w * logit_error(terms), v.abs()) + terms.output.abs() * (
        w * logit_error(terms)
    ).sum(-1, keepdim=True)
    accumulation = (2.0 * terms.lengths + 8.0)[:, None, None, None] * U_FP32
    before_rounding = U_BF16 * abs_weighted_v + spread + accumulation * abs_weighted_v
    return U_BF16 * (terms.output.abs() + before_rounding) + before_rounding


def lse_bound(terms: SoftmaxTerms) -> torch.Tensor:
    """Allowed |lse - reference| per head, base 2 ([b, g, j]); 0 for empty sequences (exact -inf)."""
    weighted_logit_error = (terms.weights * logit_error(terms)).sum(-1)
    sum_error = (2.0 * terms.lengths + 8.0)[:, None, None] * U_FP32
    finite_lse = torch.where(torch.isfinite(terms.lse_natural), terms.lse_natural, 0.0).abs()
    bound = (weighted_logit_error + sum_error) / math.log(2.0) + 4.0 * U_FP32 * finite_lse / math.log(2.0)
    return torch.where(terms.lengths[:, None, None] > 0, bound, 0.0)
