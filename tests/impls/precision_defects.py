"""Precision defects of the kind magic tolerances (1e-2 .. 3e-2) let through, in plain torch.

Every function has the contract of ``kernel.run``. They share one blockwise float32
core written the way a flash-decoding kernel works (online softmax with a running
max, exp2 with a log2(e) prescale, P rounded to bf16 before P.V, float32
accumulators rescaled per block, one division, output rounded to bf16), so each
differs from ``correct`` by exactly one defect. The error bound must pass
``correct`` and the property suite must catch every other function here.
"""

from __future__ import annotations

import math

import torch

NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK = 32, 4, 128, 128
DEFAULT_SCALE = 1.0 / math.sqrt(HEAD_DIM)
LOG2E = 1.4426950408889634


def _decode_one(q, keys, values, scale, *, block=BLOCK, bf16_accumulator=False, exp_clamp=None):
    """One sequence: q [32, 128] float32, keys/values [L, 4, 128] float32 -> (output [32, 128], lse2 [32])."""
    group = NUM_QO_HEADS // NUM_KV_HEADS
    q = q.view(NUM_KV_HEADS, group, HEAD_DIM)
    running_max = torch.full((NUM_KV_HEADS, group), -math.inf)
    total = torch.zeros(NUM_KV_HEADS, group)
    acc = torch.zeros(NUM_KV_HEADS, group, HEAD_DIM)
    for start in range(0, keys.shape[0], block):
        k, v = keys[start:start + block], values[start:start + block]
        logits = torch.einsum("gjd,lgd->gjl", q, k) * scale
        if exp_clamp is None:
            new_max = torch.maximum(running_max, logits.amax(-1))
            alpha = torch.exp2((running_max - new_max) * LOG2E)
            p = torch.exp2((logits - new_max[..., None]) * LOG2E)
        else:  # no running max: exp of the clamped logit itself, as "overflow-safe" kernels do
            new_max, alpha = torch.zeros_like(running_max), torch.ones_like(running_max)
            p = torch.exp(logits.clamp(-exp_clamp, exp_clamp))
        total = total * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.einsum("gjl,lgd->gjd", p.bfloat16().float(), v)
        if bf16_accumulator:
            acc = acc.bfloat16().float()
        running_max = new_max
    output = (acc / total[..., None]).reshape(NUM_QO_HEADS, HEAD_DIM)
    lse2 = (running_max * LOG2E + torch.log2(total)).reshape(NUM_QO_HEADS)
    return output, lse2


def _blockwise(q, k_cache, v_cache, kv_indptr, kv_indices, scale, *, drop_last=False, **defect):
    batch = q.shape[0]
    output = torch.zeros(batch, NUM_QO_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.full((batch, NUM_QO_HEADS), -math.inf, dtype=torch.float32, device=q.device)
    scale = torch.tensor(scale, dtype=torch.float32)
    bounds = kv_indptr.tolist()
    for seq in range(batch):
        pages = kv_indices[bounds[seq]:bounds[seq + 1]].long().cpu()
        if drop_last:
            pages = pages[:-1]
        if pages.numel() == 0:
            continue
        keys = k_cache[pages.to(k_cache.device), 0].float().cpu()
        values = v_cache[pages.to(v_cache.device), 0].float().cpu()
        out, lse2 = _decode_one(q[seq].float().cpu(), keys, values, scale, **defect)
        output[seq], lse[seq] = out.bfloat16(), lse2
    return output, lse


def _scale(sm_scale) -> float:
    return DEFAULT_SCALE if sm_scale is None else float(sm_scale)


def correct(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """The shared core with no defect: must pass the whole property suite."""
    return _blockwise(q, k_cache, v_cache, kv_indptr, kv_indices, _scale(sm_scale))


def correct_in_blocks_of_16(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """Correct, with the smallest blocks the bound allows: the most rescales and accumulation steps."""
    return _blockwise(q, k_cache, v_cache, kv_indptr, kv_indices, _scale(sm_scale), block=16)


def drop_last_token(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """Off by one: every sequence loses its last token (an empty result for one-token sequences)."""
    return _blockwise(q, k_cache, v_cache, kv_indptr, kv_indices, _scale(sm_scale), drop_last=True)


def bf16_accumulator(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """The output accumulator is kept in bf16 between blocks (rounded once per 128 tokens)."""
    return _blockwise(q, k_cache, v_cache, kv_indptr, kv_indices, _scale(sm_scale), bf16_accumulator=True)


def clamped_exp(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """No running max; exp arguments clamped to [-80, 80] so float32 exp cannot overflow."""
    return _blockwise(q, k_cache, v_cache, kv_indptr, kv_indices, _scale(sm_scale), exp_clamp=80.0)


def default_scale_only(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    """sm_scale is ignored: the default 1/sqrt(128) is hard-coded."""
    return _blockwise(q, k_cache, v_cache, kv_indptr, kv_indices, DEFAULT_SCALE)
