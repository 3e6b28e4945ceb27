"""The error bound: how far a correct implementation of the contract may land from float64.

One function, ``error_bounds``, of the oracle's float64 intermediates (``SoftmaxTerms``).
The model, every constant and every term are derived in ``docs/tolerance.md``; the
section marks below (§1 .. §8) point there, and the code follows it line for line.
Shapes: b sequences, g KV heads, j query heads per group, L tokens, d head dims.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["HOEFFDING_LAMBDA", "SoftmaxTerms", "error_bounds", "half_ulp_bf16", "near_tie_counts"]

HEAD_DIM = 128

# §1 The precision the contract allows, and how sure the statistical term is.
U32 = 2.0**-24  # float32 unit roundoff, round to nearest
U_ACC = 2.0**-23  # one float32 accumulation step, round-toward-zero allowed (tensor-core adders truncate)
U_BF16 = 2.0**-8  # bfloat16 unit roundoff: 8 significand bits, round to nearest even
EXP_REL = 2.0**-21  # relative error of one float32 exp / exp2 (4 ulp)
LOG2_ABS = 2.0**-21  # absolute error of one float32 log / log2
MIN_BLOCK = 16  # tokens per block at least, so at most ceil(L / 16) running-max rescales
TINY = 2.0**-126  # smallest normal float32; anything smaller may be flushed to zero
NEAR_TIE_LOG2 = math.log2(1.0 + 2.0**-12)  # weights closer than this round alike
FALSE_ALARM_PER_ELEMENT = 1e-12
HOEFFDING_LAMBDA = math.sqrt(2.0 * math.log(2.0 / FALSE_ALARM_PER_ELEMENT))  # 7.43
DOT_GAMMA = (HEAD_DIM - 1) * U_ACC / (1 - (HEAD_DIM - 1) * U_ACC)  # gamma_127: a 128-term float32 dot product
MAX_LOG_ERROR = 700.0  # keeps exp() finite in float64; such weights are capped at 1 anyway


class SoftmaxTerms(NamedTuple):
    """Float64 intermediates of one chunk of sequences, as the oracle computes them."""

    logits: torch.Tensor  # [b, g, j, L] scaled logits s, -inf past a sequence's end
    weights: torch.Tensor  # [b, g, j, L] softmax weights w, 0 past the end
    values: torch.Tensor  # [b, L, g, d] V rows, 0 past the end
    output: torch.Tensor  # [b, g, j, d] exact output o
    logit_magnitude: torch.Tensor  # [b, g, j, L] M = |scale| * sum_d |q_d k_d|, 0 past the end
    lse_natural: torch.Tensor  # [b, g, j] natural-log LSE, -inf for empty sequences
    lengths: torch.Tensor  # [b] tokens per sequence, int64


def gamma(steps: torch.Tensor, unit: float) -> torch.Tensor:
    """Higham's gamma_n = n u / (1 - n u), the relative error of n chained roundings; inf once n u >= 1."""
    product = steps * unit
    return torch.where(product < 1, product / (1 - product).clamp(min=1e-300), math.inf)


def half_ulp_bf16(x: torch.Tensor) -> torch.Tensor:
    """Largest error of rounding any value of magnitude <= x to bf16 (nearest even); float64 in and out."""
    _, exponent = torch.frexp(x)  # x = mantissa * 2**exponent, mantissa in [0.5, 1)
    exponent = torch.where(x > 0, exponent, -125).clamp(min=-125)  # bf16 subnormals are 2**-133 apart
    return torch.where(torch.isfinite(x), torch.ldexp(torch.ones_like(x), exponent - 9), math.inf)


def _token_mask(terms: SoftmaxTerms) -> torch.Tensor:
    """[b, 1, 1, L]: the tokens each sequence owns."""
    token = torch.arange(terms.logits.shape[-1], device=terms.logits.device)
    return (token < terms.lengths[:, None])[:, None, None, :]


def _rescales(terms: SoftmaxTerms) -> torch.Tensor:
    """[b]: running-max rescales after a token's own exp, at most one per block of MIN_BLOCK tokens."""
    return torch.div(terms.lengths + MIN_BLOCK - 1, MIN_BLOCK, rounding_mode="floor").double()


def _largest_logit(terms: SoftmaxTerms, valid: torch.Tensor) -> torch.Tensor:
    """[b, g, j, 1]: S = max_l |s_l| over each sequence's tokens (0 for empty sequences)."""
    return torch.where(valid, terms.logits.abs(), 0.0).amax(dim=-1, keepdim=True)


def _token_logit_error(terms: SoftmaxTerms, valid: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
    """§2 Bound on |log(p_hat / p)| for each exp(s_l - m_block) as computed, natural-log units ([b, g, j, L]).

    ``largest`` is ``_largest_logit(terms, valid)``.
    """
    logits = torch.where(valid, terms.logits, 0.0)
    error = (
        (DOT_GAMMA + 2 * U32) * terms.logit_magnitude  # dot product, then the scale
        + 4 * U32 * (logits.abs() + largest)  # forming (s - m_block) * log2(e)
        + EXP_REL  # exp2 itself
    )
    return torch.where(valid, error, 0.0)


def _rescale_error(rescales: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
    """§2 Bound on the error all later running-max rescales add to one token, natural-log units ([b, g, j, 1])."""
    return EXP_REL * rescales[:, None, None, None] + 8 * U32 * largest


def near_tie_counts(weights: torch.Tensor, token_error: torch.Tensor) -> torch.Tensor:
    """§4 For each token, how many tokens of its head are near ties with it, itself included ([b, g, j, L]).

    Near ties: exact weights within a ratio of 1 + 2**-12, widened by the per-token
    logit errors that may bring two computed weights closer than the exact ones.
    """
    key = torch.where(weights > 0, weights.log2(), -math.inf)
    window = NEAR_TIE_LOG2 + 2.0 * token_error.amax(dim=-1, keepdim=True) / math.log(2.0)
    ordered = key.sort(dim=-1).values.flatten(0, 2).contiguous()
    above = torch.searchsorted(ordered, (key + window).flatten(0, 2).contiguous(), right=True)
    below = torch.searchsorted(ordered, (key - window).flatten(0, 2).contiguous(), right=False)
    return (above - below).reshape(key.shape).double()


def _value_extremes(terms: SoftmaxTerms, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest and smallest V entry over each sequence's tokens, [b, g, 1, d] each (0 for empty sequences)."""
    valid = valid[:, 0, 0, :, None, None]  # [b, L, 1, 1]
    high = torch.where(valid, terms.values, -math.inf).amax(1)[:, :, None, :]
    low = torch.where(valid, terms.values, math.inf).amin(1)[:, :, None, :]
    empty = (terms.lengths == 0)[:, None, None, None]
    return torch.where(empty, 0.0, high), torch.where(empty, 0.0, low)


# float64 elements of |v - o| formed at once in _weighted_deviation: 2**25 (256 MiB).
_DEVIATION_ELEMENTS = 1 << 25


def _weighted_deviation(coefficients: torch.Tensor, by_group: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """sum_l a[b,g,j,l] |v[b,g,l,d] - o[b,g,j,d]| ([b, g, j, d]), as many query heads at a time as fit the budget."""
    heads = output.shape[2]
    step = max(1, min(heads, _DEVIATION_ELEMENTS // max(by_group.numel(), 1)))
    parts = []
    for head in range(0, heads, step):
        deviation = (by_group[:, :, None] - output[:, :, head:head + step, None, :]).abs_()  # [b, g, s, L, d]
        parts.append(torch.matmul(coefficients[:, :, head:head + step, None, :], deviation)[..., 0, :])
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def error_bounds(terms: SoftmaxTerms) -> tuple[torch.Tensor, torch.Tensor]:
    """Allowed |output - reference| per element ([b, g, j, d]) and |lse - reference| per head, base 2 ([b, g, j]).

    Both are 0 for empty sequences, whose output (0) and LSE (-inf) are exact.
    """
    valid = _token_mask(terms)
    nonempty = terms.lengths > 0
    w, v, o = terms.weights, terms.values, terms.output
    v_by_group = v.permute(0, 2, 1, 3)  # [b, g, L, d]: the right operand of batched matmuls
    largest, rescales = _largest_logit(terms, valid), _rescales(terms)

    # §2 Logit errors: per token, then with every later running-max rescale.
    token_error = _token_logit_error(terms, valid, largest)
    error = torch.where(valid, token_error + _rescale_error(rescales, largest), 0.0)

    # §3 Weight perturbation: w_hat_l / w_l lies within exp(+-D_l), D_l = E_l + A.
    spread = torch.logsumexp(torch.where(w > 0, w.log() + error, -math.inf), dim=-1, keepdim=True)
    spread = torch.where(torch.isfinite(spread), spread, 0.0)  # A; 0 for empty sequences
    weight_error = (error + spread).clamp(max=MAX_LOG_ERROR)  # D
    high, low = _value_extremes(terms, valid)
    logit_term = torch.minimum(
        _weighted_deviation(w * torch.expm1(weight_error), v_by_group, o), torch.maximum(high - o, o - low)
    )

    # §4 P rounded to bf16 before P.V, against an unrounded normaliser.
    w_hat = torch.minimum(w * weight_error.exp(), torch.ones_like(w))
    largest_v = torch.maximum(high.abs(), low.abs())
    abs_weighted_v = torch.minimum(torch.matmul(w_hat, v_by_group.abs()), largest_v)
    worst_case = U_BF16 * abs_weighted_v
    ties = near_tie_counts(w, token_error)
    independent = HOEFFDING_LAMBDA * U_BF16 * torch.matmul(ties * w_hat**2, v_by_group**2).sqrt()
    p_rounding_term = torch.minimum(worst_case, independent)

    # §5 float32 sums of numerator and denominator, any order and blocking, then one division.
    steps = gamma(terms.lengths.double() - 1 + rescales + 4, U_ACC)[:, None, None, None]
    numerator_term = steps * (1 + U_BF16) * abs_weighted_v
    quotient = o.abs() + logit_term + p_rounding_term + numerator_term
    denominator_term = quotient * steps / (1 - steps)
    division_term = 8 * U32 * (quotient + denominator_term)  # approximate division: 2 ulp, or rcp + mul

    # §6 Values below the smallest normal float32 may be flushed to zero at every step.
    flushed = TINY * (terms.lengths[:, None, None, None] * (1 + largest_v) + 1)

    # §7 The output rounded to bf16.
    before_rounding = logit_term + p_rounding_term + numerator_term + denominator_term + division_term + flushed
    output_bound = before_rounding + half_ulp_bf16(o.abs() + before_rounding)

    # §8 LSE, base 2: logit errors, the accumulated normaliser, forming m log2(e) + log2(l).
    natural = spread[..., 0] - torch.log1p(-steps[..., 0].clamp(max=1.0))
    peak = largest[..., 0]
    log2_sum = torch.log2(terms.lengths.clamp(min=1).double())[:, None, None] + 1
    forming = 4 * U32 * (peak / math.log(2.0) + terms.lse_natural.abs() / math.log(2.0) + log2_sum) + LOG2_ABS
    lse_bound = natural / math.log(2.0) + forming

    return (
        torch.where(nonempty[:, None, None, None], output_bound, 0.0),
        torch.where(nonempty[:, None, None], lse_bound, 0.0),
    )
