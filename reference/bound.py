"""The error bound: how far a correct implementation of the contract may land from float64.

One function, ``error_bounds``, of the oracle's float64 intermediates (``SoftmaxTerms``).
The model, every constant and every term are derived in ``docs/tolerance.md``; the
section marks below (§1 .. §8) point there, and the code follows it line for line.
Shapes: b sequences, g KV heads, j query heads per group, L tokens, d head dims.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import torch

from . import _fused_guard

__all__ = [
    "HOEFFDING_LAMBDA", "SoftmaxTerms", "error_bounds", "factor_columns", "half_ulp_bf16", "near_tie_counts",
]

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
MAX_LOG_ERROR = 700.0  # keeps exp() finite in float64; such weights are capped at 1 anyway


class SoftmaxTerms(NamedTuple):
    """Float64 intermediates of one chunk of sequences, as the oracle computes them."""

    logits: torch.Tensor  # [b, g, j, L] scaled logits s, -inf past a sequence's end
    weights: torch.Tensor  # [b, g, j, L] softmax weights w, 0 past the end
    values: torch.Tensor  # [b, L, g, d] V rows, 0 past the end
    output: torch.Tensor  # [b, g, j, d] exact output o
    logit_magnitude: torch.Tensor  # [b, g, j, L] M = |scale| * sum_d |q_d k_d|, 0 past the end
    lse_natural: torch.Tensor  # [b, g, j] natural-log LSE, -inf for empty sequences
    padding: torch.Tensor  # [b, 1, 1, L] True past a sequence's end
    factors: torch.Tensor  # [5, b, 1, 1, 1] factor_columns of the sequences' lengths


def dot_gamma(dim: int) -> float:
    """gamma_{d-1}: the relative error of a d-term float32 dot product (gamma_127 for head dim 128)."""
    return (dim - 1) * U_ACC / (1 - (dim - 1) * U_ACC)


def gamma(steps: torch.Tensor, unit: float) -> torch.Tensor:
    """Higham's gamma_n = n u / (1 - n u), the relative error of n chained roundings; inf once n u >= 1."""
    # As n / (1/u - n): the same rounding for a power-of-2 u, where both forms are exact up to the division.
    return steps / (1 / unit - steps).clamp_(min=0.0)  # n u >= 1: n / +0 = inf


@lru_cache(maxsize=1 << 16)
def _factors_of(length: int) -> tuple[float, float, float, float, float]:
    """``factor_columns`` of one length, on the host: each step one correctly rounded float64 operation."""
    tokens = float(length)
    rescales = float(math.ceil(tokens / MIN_BLOCK))  # R: at most one running-max rescale per block of MIN_BLOCK tokens
    steps = float(gamma(torch.tensor(tokens + rescales + 3, dtype=torch.float64), U_ACC))  # gamma_N, N = L - 1 + R + 4
    below = 1 - steps
    division = (steps + 8 * U32) / below if below else math.inf  # gamma_N = 1 exactly: x / +0, as a tensor gives
    return tokens, rescales, steps, division, -min(steps, 1.0)


def factor_columns(lengths: list[int]) -> list[list[float]]:
    """What ``error_bounds`` needs of each sequence's length, as five host lists of one float per sequence.

    In order: L, R = ceil(L / MIN_BLOCK), gamma_N (N = L + R + 3), (gamma_N + 8 U32) / (1 - gamma_N) (§5) and
    -min(gamma_N, 1) (§8). Python floats round every step as float64 tensors do, so these are the bits a
    device would form from the lengths, in one copy instead of a dozen tiny kernels.
    """
    return [list(column) for column in zip(*map(_factors_of, lengths))] or [[] for _ in range(5)]


_EXPONENT_AND_SIGN = -(1 << 52)  # 0xFFF0...0 as int64: a float64's sign and exponent bits, no mantissa
_SMALLEST_HALF_ULP = 2.0**-134  # half the spacing of bf16 subnormals


def _half_ulp(x: torch.Tensor) -> torch.Tensor:
    """``half_ulp_bf16`` for any x but -inf and NaNs with the sign bit set (those give 2**-134 here)."""
    # x in [2**e, 2**(e+1)) has bf16 spacing 2**(e-7): half of it is x with its mantissa bits cleared, over 2**8.
    power = (x.view(torch.int64) & _EXPONENT_AND_SIGN).view(torch.float64)  # +-2**e, +-inf, or +-0
    return power.mul_(2.0**-8).clamp_(min=_SMALLEST_HALF_ULP)  # x <= 0 and below bf16's normals: 2**-134


def half_ulp_bf16(x: torch.Tensor) -> torch.Tensor:
    """Largest error of rounding any value of magnitude <= x to bf16 (nearest even); float64 in and out."""
    return _half_ulp(x.nan_to_num(nan=math.inf, posinf=math.inf, neginf=math.inf))  # inf for infinite and NaN x


def _token_logit_error(terms: SoftmaxTerms, abs_logits: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
    """§2 Bound on |log(p_hat / p)| for each exp(s_l - m_block) as computed, natural-log units ([b, g, j, L]).

    ``abs_logits`` is |s|, 0 past the end; ``largest`` is S. Past the end the result is the smallest of the
    head's (M = 0 and |s| = 0 there): left unmasked, it never raises a maximum over tokens.
    """
    dot_product = (dot_gamma(terms.values.shape[-1]) + 2 * U32) * terms.logit_magnitude  # dot product, then scale
    # + 4 U32 (|s| + S), forming (s - m_block) * log2(e); alpha is a power of 2: the same rounding
    error = torch.add(dot_product, abs_logits + largest, alpha=4 * U32)
    return error.add_(EXP_REL)  # exp2 itself


def _rescale_error(rescales: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
    """§2 Bound on the error all later running-max rescales add to one token, in units of EXP_REL ([b, g, j, 1]).

    R EXP_REL + 8 U32 S is EXP_REL (R + S 8 U32 / EXP_REL); with both constants powers of 2, the caller's
    multiply-add by EXP_REL rounds it exactly as the sum of the two terms.
    """
    return torch.add(rescales, largest, alpha=8 * U32 / EXP_REL)


def _tie_counts(key: torch.Tensor, token_error: torch.Tensor) -> torch.Tensor:
    """``near_tie_counts`` as int64, from ``key``: log2 of the weights, -inf where a weight is 0."""
    # NEAR_TIE_LOG2 + 2 max(E_tok) / ln 2, dividing by ln(2) / 2 instead (the same rounding: powers of 2 are exact)
    window = token_error.amax(dim=-1, keepdim=True).div_(math.log(2.0) / 2).add_(NEAR_TIE_LOG2)
    ordered = key.sort(dim=-1).values  # searchsorted batches over the leading dims
    above = torch.searchsorted(ordered, key + window, right=True)
    below = torch.searchsorted(ordered, key - window, right=False)
    return above.sub_(below)


def near_tie_counts(weights: torch.Tensor, token_error: torch.Tensor) -> torch.Tensor:
    """§4 For each token, how many tokens of its head are near ties with it, itself included ([b, g, j, L]).

    Near ties: exact weights within a ratio of 1 + 2**-12, widened by the per-token
    logit errors that may bring two computed weights closer than the exact ones.
    """
    # log2(w), and -inf where w is not positive (log2 gives -inf at 0, NaN below 0 and for NaN)
    key = torch.log2(weights).nan_to_num_(nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    return _tie_counts(key, token_error).double()


# float64 elements of |v - o| formed at once by the torch path (_logit_term_torch): 2**25 (256 MiB).
_DEVIATION_ELEMENTS = 1 << 25


def _logit_term(coefficients: torch.Tensor, by_group: torch.Tensor, output: torch.Tensor, padding: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
    """§3 min(sum_l a_l |v_l - o|, max_l |v_l - o|) over each sequence's tokens ([b, g, j, d]).

    ``coefficients`` a [b, g, j, L] (0 past the end), ``by_group`` V [b, g, L, d], ``output`` o [b, g, j, d],
    ``padding`` [b, 1, 1, L], ``lengths`` L per sequence. One Triton kernel on CUDA (``_fused_deviation``), which
    never forms |v - o| in memory; the torch path elsewhere.
    """
    if coefficients.is_cuda and _fused_guard.trusted("the bound's deviation term", coefficients.device,
                                                     _deviation_agrees):
        from . import _fused_deviation  # Triton, imported on first use: the CPU never needs it

        return _fused_deviation.deviation_term(coefficients, by_group, output, lengths)
    return _logit_term_torch(coefficients, by_group, output, padding)


def _deviation_agrees(device: torch.device) -> bool:
    """The fused deviation term against ``_logit_term_torch`` on fixed inputs (``_fused_guard``): an empty
    sequence, one with a NaN among its values, one over three of the kernel's token splits; ten query heads of two
    KV heads; 40 dims. Equal NaNs, the rest to float64 rounding of the sums' order."""
    from . import _fused_deviation

    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([0.0, 77.0, 140.0], dtype=torch.float64)
    padding = torch.arange(140)[None, None, None, :] >= lengths[:, None, None, None]
    coefficients = torch.rand(3, 2, 10, 140, generator=generator, dtype=torch.float64).masked_fill_(padding, 0.0)
    values = torch.randn(3, 2, 140, 40, generator=generator, dtype=torch.float64)
    values.masked_fill_(padding.transpose(2, 3), 0.0)[1, 0, 5, 7] = math.nan
    output = torch.randn(3, 2, 10, 40, generator=generator, dtype=torch.float64)
    expected = _logit_term_torch(coefficients, values, output, padding)
    got = _fused_deviation.deviation_term(*(t.to(device) for t in (coefficients, values, output, lengths))).cpu()
    return torch.equal(got.isnan(), expected.isnan()) and torch.allclose(
        got.nan_to_num(), expected.nan_to_num(), rtol=1e-12, atol=0.0)


def _logit_term_torch(
    coefficients: torch.Tensor, by_group: torch.Tensor, output: torch.Tensor, padding: torch.Tensor
) -> torch.Tensor:
    """``_logit_term`` in torch operations: |v - o| ([b, g, s, L, d]) is formed for as many query heads at a time
    as fit the budget. Slots past the end take their sequence's first row: a is 0 there, and the maximum runs over
    the sequence's own tokens (an empty sequence's first row is padding, 0, as is its output).
    """
    count, groups, heads, length = coefficients.shape
    filled = torch.where(padding.transpose(2, 3), by_group[:, :, :1], by_group)[:, :, None]  # [b, g, 1, L, d]
    step = max(1, min(heads, _DEVIATION_ELEMENTS // max(by_group.numel(), 1)))
    parts = []
    for head in range(0, heads, step):
        a, o = coefficients, output
        if step < heads:
            a, o = a[:, :, head:head + step], o[:, :, head:head + step]
        deviation = (filled - o[:, :, :, None]).abs_()  # [b, g, s, L, d]
        rows = deviation.shape[:3].numel()  # one (sequence, KV head, query head) each
        weighted = torch.bmm(a.reshape(rows, 1, length), deviation.view(rows, length, by_group.shape[-1])).view_as(o)
        parts.append(torch.minimum(weighted, deviation.amax(dim=3)))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def error_bounds(terms: SoftmaxTerms) -> tuple[torch.Tensor, torch.Tensor]:
    """Allowed |output - reference| per element ([b, g, j, d]) and |lse - reference| per head, base 2 ([b, g, j]).

    Both are 0 for empty sequences, whose output (0) and LSE (-inf) are exact. Their intermediates may be
    infinite (log2 0, |LSE|): every quantity is per sequence, and the last step masks them.
    """
    w, o, padding = terms.weights, terms.output, terms.padding
    count, groups, heads, length = w.shape
    # Per sequence ([b, 1, 1, 1]): L, R, gamma_N, the division's factor (§5), -min(gamma_N, 1) (§8).
    lengths, rescales, steps, division_factor, log1p_argument = terms.factors.unbind()
    v = terms.values.permute(0, 2, 1, 3)  # [b, g, L, d]
    abs_v = v.abs()
    abs_v_by_head = abs_v.view(count * groups, length, v.shape[-1])  # the right operand of bmm
    largest_v = abs_v.amax(dim=2, keepdim=True)  # max_l |v_l| ([b, g, 1, d]): the padding's 0 never raises it

    # §2 Logit errors: per token, then with every later running-max rescale.
    abs_logits = terms.logits.abs().masked_fill_(padding, 0.0)
    largest = abs_logits.amax(dim=-1, keepdim=True)  # S ([b, g, j, 1]; 0 for empty sequences)
    token_error = _token_logit_error(terms, abs_logits, largest)
    # Past the end E stays unmasked: there w = 0, so log(w) + E = -inf and every product with w is 0.
    error = torch.add(token_error, _rescale_error(rescales, largest), alpha=EXP_REL)

    # §3 Weight perturbation: w_hat_l / w_l lies within exp(+-D_l), D_l = E_l + A.
    spread = torch.logsumexp(torch.log(w).add_(error), dim=-1, keepdim=True)
    spread = spread.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)  # A; 0 for empty sequences
    weight_error = error.add_(spread).clamp_(max=MAX_LOG_ERROR)  # D
    coefficients = torch.expm1(weight_error).mul_(w)  # w (e^D - 1)
    logit_term = _logit_term(coefficients, v, o, padding, lengths)

    # §4 P rounded to bf16 before P.V, against an unrounded normaliser.
    w_hat = coefficients.add_(w).clamp_(max=1.0).view(count * groups, heads, length)  # min(w e^D, 1)
    abs_weighted_v = torch.minimum(torch.bmm(w_hat, abs_v_by_head).view_as(o), largest_v)
    # w >= 0, so log2(w) is the key near_tie_counts forms (a NaN weight makes its head's bound NaN anyway)
    ties = _tie_counts(torch.log2(w), token_error).view_as(w_hat)
    independent = torch.bmm(w_hat.square_().mul_(ties), abs_v_by_head.square_()).view_as(o)  # v^2 = |v|^2
    # T_P = min(worst case, independent) = U_BF16 min(sum w_hat |v|, lambda sqrt(sum n w_hat^2 v^2))
    p_rounding_over_u = torch.minimum(abs_weighted_v, independent.sqrt_().mul_(HOEFFDING_LAMBDA))

    # §5 float32 sums of numerator and denominator, any order and blocking, then one division.
    # T_logit + T_P + T_num, T_num = gamma_N (1 + U_BF16) sum w_hat |v| (the sum capped as above)
    partial = logit_term.add_(p_rounding_over_u, alpha=U_BF16).addcmul_(abs_weighted_v, steps, value=1 + U_BF16)
    abs_o = o.abs()
    quotient = abs_o + partial  # Q
    # T_den = Q gamma / (1 - gamma) and T_div = 8 U32 (Q + T_den) (approximate division: 2 ulp, or rcp and
    # multiply) add up to Q (gamma + 8 U32) / (1 - gamma).
    before_rounding = partial.addcmul_(quotient, division_factor)

    # §6 Values below the smallest normal float32 may be flushed to zero at every step: TINY (L (1 + max|v|) + 1).
    before_rounding.addcmul_(largest_v + 1, lengths, value=TINY).add_(TINY)

    # §7 The output rounded to bf16.
    # (|o| + pre is a magnitude, or NaN where pre is NaN: no need for half_ulp_bf16's mapping of NaN to inf)
    output_bound = before_rounding + _half_ulp(abs_o.add_(before_rounding))

    # §8 LSE, base 2: logit errors, the accumulated normaliser, forming m log2(e) + log2(l):
    # (A - ln(1 - gamma)) / ln 2 + 4 U32 (S / ln 2 + |LSE| + log2 L + 1) + LOG2_ABS, |LSE| = |lse_natural| / ln 2,
    # as A + 4 U32 (S + |lse_natural|) over ln 2, plus the per-sequence rest.
    per_sequence = torch.log2(lengths).mul_(4 * U32).add_(4 * U32 + LOG2_ABS)
    per_sequence.add_(torch.log1p(log1p_argument), alpha=-1 / math.log(2.0))
    per_head = torch.add(spread, largest + terms.lse_natural.abs()[..., None], alpha=4 * U32)
    lse_bound = per_sequence.add(per_head, alpha=1 / math.log(2.0))

    empty = padding[..., :1]  # L = 0
    return output_bound.masked_fill_(empty, 0.0), lse_bound.masked_fill_(empty, 0.0)[..., 0]
