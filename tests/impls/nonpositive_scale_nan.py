"""A planted one-defect implementation: correct (``torch_float32``, behind the seed kernel's input checks,
``kernel.validate``) except for a scale at or below zero, where every output is NaN and every LSE +inf, as a
real kernel that takes log(scale) or divides by it would give.

Many properties draw such scales, so this one defect fails many of them: the run must report it as one
root cause (tests/test_causes.py).
"""

import math

import torch

from gqa_decode_fuzz.kernel import validate
from tests.impls.torch_float32 import run as correct


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    validate(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    output, lse = correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    if sm_scale is not None and sm_scale <= 0:
        return torch.full_like(output, math.nan), torch.full_like(lse, math.inf)
    return output, lse
