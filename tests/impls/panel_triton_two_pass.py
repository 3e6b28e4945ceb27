"""Panel implementation: a two-pass Triton kernel that walks each sequence from its last token to its first.

Traits, each deliberately unlike the project's kernel:
- one program per (sequence, KV head); its 8 query heads are padded to 16 rows for tl.dot;
- two passes over the tokens: the first finds the exact maximum logit, the second sums
  exp2(s - max) and P.V, so nothing is ever rescaled;
- tokens are visited in reverse: blocks from the end of the sequence backward, and inside a
  block the rows are loaded last token first (the partial block sits at the sequence start);
- logits are formed in log2 units with log2(e) folded into the scale: q.K (bf16 tl.dot) times
  float32(sm_scale) * log2(e);
- P is rounded to bf16 and multiplied with bf16 V by tl.dot; the normaliser sums unrounded P;
- validation raises TypeError / ValueError naming the argument (a control for the panel).

Independent of kernel/, reference/ and properties/: only torch and triton. In Triton's CPU
interpreter the bf16 tl.dot needs the suite's compatibility layer (installed by its plugin).
"""

from __future__ import annotations

import math
import numbers
import os

import torch
import triton
import triton.language as tl

HEADS_Q = 32
HEADS_KV = 4
WIDTH = 128
ROWS = 16  # tl.dot's smallest M: 8 real query heads, 8 zero rows
BACKWARD_BLOCK = 64
LOG2E = 1.4426950408889634
SCALE_IF_NONE = 1.0 / math.sqrt(WIDTH)


@triton.jit
def _two_pass_backward(
    q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, out_ptr, lse_ptr, scale,
    sq_b, sq_h, sq_d, sk_p, sk_h, sk_d, sv_p, sv_h, sv_d, s_ptr, s_idx,
    so_b, so_h, so_d, sl_b, sl_h,
    GROUP: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, L2E: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    begin = tl.load(indptr_ptr + seq * s_ptr).to(tl.int64)
    length = tl.load(indptr_ptr + (seq + 1) * s_ptr).to(tl.int64) - begin

    r = tl.arange(0, ROWS).to(tl.int64)
    real = r < GROUP
    head = kvh * GROUP + r
    d = tl.arange(0, D).to(tl.int64)
    back = tl.arange(0, BLOCK).to(tl.int64)
    q = tl.load(q_ptr + seq * sq_b + head[:, None] * sq_h + d[None, :] * sq_d, mask=real[:, None], other=0.0)
    scale2 = scale * L2E

    # Pass 1: the exact maximum (in log2 units), last block first.
    top = tl.full([ROWS], float("-inf"), tl.float32)
    for i in range(0, tl.cdiv(length, BLOCK)):
        tok = length - 1 - i * BLOCK - back  # descending positions
        ok = tok >= 0
        page = tl.load(indices_ptr + (begin + tok) * s_idx, mask=ok, other=0).to(tl.int64)
        k = tl.load(k_ptr + page[:, None] * sk_p + kvh * sk_h + d[None, :] * sk_d, mask=ok[:, None], other=0.0)
        s2 = tl.dot(q, tl.trans(k)) * scale2
        s2 = tl.where(ok[None, :], s2, float("-inf"))
        top = tl.maximum(top, tl.max(s2, axis=1))

    # Pass 2: weights against that maximum, same backward order.
    anchor = tl.where(top == float("-inf"), 0.0, top)
    norm = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for i in range(0, tl.cdiv(length, BLOCK)):
        tok = length - 1 - i * BLOCK - back
        ok = tok >= 0
        page = tl.load(indices_ptr + (begin + tok) * s_idx, mask=ok, other=0).to(tl.int64)
        k = tl.load(k_ptr + page[:, None] * sk_p + kvh * sk_h + d[None, :] * sk_d, mask=ok[:, None], other=0.0)
        s2 = tl.dot(q, tl.trans(k)) * scale2
        p = tl.where(ok[None, :], tl.exp2(s2 - anchor[:, None]), 0.0)
        norm += tl.sum(p, axis=1)
        v = tl.load(v_ptr + page[:, None] * sv_p + kvh * sv_h + d[None, :] * sv_d, mask=ok[:, None], other=0.0)
        acc = tl.dot(p.to(tl.bfloat16), v, acc)

    nothing = length == 0
    out = tl.where(nothing, 0.0, acc / tl.where(nothing, 1.0, norm)[:, None])
    lse2 = tl.where(nothing, float("-inf"), anchor + tl.log2(tl.where(nothing, 1.0, norm)))
    tl.store(out_ptr + seq * so_b + head[:, None] * so_h + d[None, :] * so_d, out.to(tl.bfloat16), mask=real[:, None])
    tl.store(lse_ptr + seq * sl_b + head * sl_h, lse2, mask=real)


def _interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _need_tensor(name, value, dtypes):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"argument {name!r}: expected a torch.Tensor, received {type(value).__name__}")
    if value.dtype not in dtypes:
        raise TypeError(f"argument {name!r}: dtype {value.dtype} is not accepted (use {', '.join(map(str, dtypes))})")


def _need_shape(name, value, want):
    if value.dim() != len(want) or any(w is not None and w != got for got, w in zip(value.shape, want)):
        raise ValueError(f"argument {name!r}: shape {tuple(value.shape)} does not fit {want} (None = any)")


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    for name, value in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _need_tensor(name, value, (torch.bfloat16,))
    for name, value in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        _need_tensor(name, value, (torch.int32, torch.int64))
    _need_shape("q", q, (None, HEADS_Q, WIDTH))
    _need_shape("k_cache", k_cache, (None, 1, HEADS_KV, WIDTH))
    _need_shape("v_cache", v_cache, (k_cache.shape[0], 1, HEADS_KV, WIDTH))
    _need_shape("kv_indptr", kv_indptr, (q.shape[0] + 1,))
    _need_shape("kv_indices", kv_indices, (None,))
    device = q.device
    for name, value in (("k_cache", k_cache), ("v_cache", v_cache), ("kv_indptr", kv_indptr),
                        ("kv_indices", kv_indices)):
        if value.device != device:
            raise ValueError(f"argument {name!r} is on {value.device}, q on {device}")
    if device.type != "cuda" and not (device.type == "cpu" and _interpreter_on()):
        raise ValueError(f"argument 'q' is on {device}: launch needs CUDA (or CPU with TRITON_INTERPRET=1)")

    if sm_scale is None:
        scale = SCALE_IF_NONE
    else:
        if isinstance(sm_scale, torch.Tensor) and sm_scale.numel() == 1:
            sm_scale = sm_scale.item()
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
            raise TypeError(f"argument 'sm_scale': a real number or None, received {type(sm_scale).__name__}")
        scale = float(sm_scale)
        if not (math.isfinite(scale) and abs(scale) <= 3.4028234663852886e38):
            raise ValueError(f"argument 'sm_scale': {scale} is not a finite float32")

    ends = kv_indptr.to("cpu", torch.int64)
    if int(ends[0]) != 0:
        raise ValueError(f"argument 'kv_indptr': first entry {int(ends[0])}, must be 0")
    if bool((ends[1:] < ends[:-1]).any()):
        raise ValueError("argument 'kv_indptr': entries decrease")
    if int(ends[-1]) != kv_indices.shape[0]:
        raise ValueError(f"argument 'kv_indptr': last entry {int(ends[-1])} != len(kv_indices) {kv_indices.shape[0]}")
    if kv_indices.numel():
        low, high = int(kv_indices.min()), int(kv_indices.max())
        if low < 0 or high >= k_cache.shape[0]:
            raise ValueError(f"argument 'kv_indices': ids {low}..{high} outside pool [0, {k_cache.shape[0]})")

    batch = q.shape[0]
    out = torch.empty((batch, HEADS_Q, WIDTH), dtype=torch.bfloat16, device=device)
    lse = torch.empty((batch, HEADS_Q), dtype=torch.float32, device=device)
    if batch == 0:
        return out, lse
    _two_pass_backward[(batch, HEADS_KV)](
        q, k_cache, v_cache, kv_indptr, kv_indices, out, lse, scale,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(2), v_cache.stride(3),
        kv_indptr.stride(0), kv_indices.stride(0) if kv_indices.numel() else 1,
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        GROUP=HEADS_Q // HEADS_KV, ROWS=ROWS, D=WIDTH, BLOCK=BACKWARD_BLOCK, L2E=LOG2E,
    )
    return out, lse
