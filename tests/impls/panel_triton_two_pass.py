"""Panel implementation: a two-pass Triton kernel that walks each sequence from its last token to its first.

Traits, each deliberately unlike the project's kernel:
- one program per (sequence, KV head); its query heads (8 in the seed's definition, 5 in some)
  are padded to a power of two of at least 16 rows for tl.dot, the padding masked;
- two passes over the tokens: the first finds the exact maximum logit, the second sums
  exp2(s - max) and P.V, so nothing is ever rescaled;
- tokens are visited in reverse: blocks from the end of the sequence backward, and inside a
  block the rows are loaded last token first (the partial block sits at the sequence start);
  with pages of several tokens a block spans pages, and the kernel reads the sequence's
  length (pages and ``kv_last_page_len``) itself;
- logits are formed in log2 units with log2(e) folded into the scale: q.K (bf16 tl.dot) times
  float32(sm_scale) * log2(e);
- P is rounded to bf16 and multiplied with bf16 V by tl.dot; the normaliser sums unrounded P;
- validation raises TypeError / ValueError naming the argument (a control for the panel).

It serves every definition of the family (``run.for_definition``); every constant is the
definition's. Independent of kernel/, reference/ and properties/: only torch and triton. In
Triton's CPU interpreter the bf16 tl.dot needs the suite's compatibility layer (installed by its plugin).
"""

from __future__ import annotations

import math
import numbers
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

FEWEST_ROWS = 16  # tl.dot's smallest M
BACKWARD_BLOCK = 64
LOG2E = 1.4426950408889634
INDEX_DTYPES = (torch.int32, torch.int64)


class Heads(NamedTuple):
    """One definition's constants."""

    heads_q: int
    heads_kv: int
    width: int
    page_size: int


@triton.jit
def _two_pass_backward(
    q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, last_ptr, out_ptr, lse_ptr, scale,
    sq_b, sq_h, sq_d, sk_p, sk_s, sk_h, sk_d, sv_p, sv_s, sv_h, sv_d, s_ptr, s_idx, s_last,
    so_b, so_h, so_d, sl_b, sl_h,
    GROUP: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr,
    PAGE: tl.constexpr, L2E: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    begin = tl.load(indptr_ptr + seq * s_ptr).to(tl.int64)
    pages = tl.load(indptr_ptr + (seq + 1) * s_ptr).to(tl.int64) - begin
    if PAGE == 1:
        length = pages
    else:
        last = tl.load(last_ptr + seq * s_last).to(tl.int64)
        length = tl.where(pages > 0, (pages - 1) * PAGE + last, 0)

    r = tl.arange(0, ROWS).to(tl.int64)
    real = r < GROUP
    head = kvh * GROUP + r
    d = tl.arange(0, DP).to(tl.int64)
    dok = d < D
    q = tl.load(q_ptr + seq * sq_b + head[:, None] * sq_h + d[None, :] * sq_d, mask=real[:, None] & dok[None, :],
                other=0.0)
    scale2 = scale * L2E
    back = tl.arange(0, BLOCK).to(tl.int64)

    # Pass 1: the exact maximum (in log2 units), last block first.
    top = tl.full([ROWS], float("-inf"), tl.float32)
    for i in range(0, tl.cdiv(length, BLOCK)):
        tok = length - 1 - i * BLOCK - back  # descending positions
        ok = tok >= 0
        at = tl.where(ok, tok, 0)
        page = tl.load(indices_ptr + (begin + at // PAGE) * s_idx, mask=ok, other=0).to(tl.int64)
        row = page * sk_p + (at % PAGE) * sk_s
        k = tl.load(k_ptr + row[:, None] + kvh * sk_h + d[None, :] * sk_d, mask=ok[:, None] & dok[None, :], other=0.0)
        s2 = tl.dot(q, tl.trans(k)) * scale2
        s2 = tl.where(ok[None, :], s2, float("-inf"))
        top = tl.maximum(top, tl.max(s2, axis=1))

    # Pass 2: weights against that maximum, same backward order.
    anchor = tl.where(top == float("-inf"), 0.0, top)
    norm = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, DP], tl.float32)
    for i in range(0, tl.cdiv(length, BLOCK)):
        tok = length - 1 - i * BLOCK - back
        ok = tok >= 0
        at = tl.where(ok, tok, 0)
        page = tl.load(indices_ptr + (begin + at // PAGE) * s_idx, mask=ok, other=0).to(tl.int64)
        k = tl.load(k_ptr + (page * sk_p + (at % PAGE) * sk_s)[:, None] + kvh * sk_h + d[None, :] * sk_d,
                    mask=ok[:, None] & dok[None, :], other=0.0)
        s2 = tl.dot(q, tl.trans(k)) * scale2
        p = tl.where(ok[None, :], tl.exp2(s2 - anchor[:, None]), 0.0)
        norm += tl.sum(p, axis=1)
        v = tl.load(v_ptr + (page * sv_p + (at % PAGE) * sv_s)[:, None] + kvh * sv_h + d[None, :] * sv_d,
                    mask=ok[:, None] & dok[None, :], other=0.0)
        acc = tl.dot(p.to(tl.bfloat16), v, acc)

    nothing = length == 0
    out = tl.where(nothing, 0.0, acc / tl.where(nothing, 1.0, norm)[:, None])
    lse2 = tl.where(nothing, float("-inf"), anchor + tl.log2(tl.where(nothing, 1.0, norm)))
    tl.store(out_ptr + seq * so_b + head[:, None] * so_h + d[None, :] * so_d, out.to(tl.bfloat16),
             mask=real[:, None] & dok[None, :])
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


def _check_arguments(geo: Heads, tensors: dict) -> None:
    """Types, dtypes, shapes and devices of the tensor arguments (``kv_last_page_len`` only with pages > 1)."""
    for name, value in tensors.items():
        _need_tensor(name, value, (torch.bfloat16,) if name in ("q", "k_cache", "v_cache") else INDEX_DTYPES)
    q, k_cache = tensors["q"], tensors["k_cache"]
    _need_shape("q", q, (None, geo.heads_q, geo.width))
    _need_shape("k_cache", k_cache, (None, geo.page_size, geo.heads_kv, geo.width))
    _need_shape("v_cache", tensors["v_cache"], (k_cache.shape[0], geo.page_size, geo.heads_kv, geo.width))
    _need_shape("kv_indptr", tensors["kv_indptr"], (q.shape[0] + 1,))
    _need_shape("kv_indices", tensors["kv_indices"], (None,))
    if "kv_last_page_len" in tensors:
        _need_shape("kv_last_page_len", tensors["kv_last_page_len"], (q.shape[0],))
    device = q.device
    for name, value in tensors.items():
        if value.device != device:
            raise ValueError(f"argument {name!r} is on {value.device}, q on {device}")
    if device.type != "cuda" and not (device.type == "cpu" and _interpreter_on()):
        raise ValueError(f"argument 'q' is on {device}: launch needs CUDA (or CPU with TRITON_INTERPRET=1)")


def _check_scale(geo: Heads, sm_scale) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(geo.width)
    if isinstance(sm_scale, torch.Tensor) and sm_scale.numel() == 1:
        sm_scale = sm_scale.item()
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"argument 'sm_scale': a real number or None, received {type(sm_scale).__name__}")
    scale = float(sm_scale)
    if not (math.isfinite(scale) and abs(scale) <= 3.4028234663852886e38):
        raise ValueError(f"argument 'sm_scale': {scale} is not a finite float32")
    return scale


def _check_pages(geo: Heads, k_cache, kv_indptr, kv_indices, kv_last_page_len) -> None:
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
    if kv_last_page_len is None:
        return
    lasts = kv_last_page_len.to("cpu", torch.int64)
    owned = (ends[1:] > ends[:-1]) & ((lasts < 1) | (lasts > geo.page_size))
    if bool(owned.any()):
        seq = int(owned.nonzero()[0])
        raise ValueError(f"argument 'kv_last_page_len': entry {seq} is {int(lasts[seq])}, "
                         f"a last page holds 1..{geo.page_size} tokens")


def _decode(geo: Heads, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "kv_indptr": kv_indptr, "kv_indices": kv_indices}
    if geo.page_size > 1:
        tensors["kv_last_page_len"] = kv_last_page_len
    _check_arguments(geo, tensors)
    scale = _check_scale(geo, sm_scale)
    _check_pages(geo, k_cache, kv_indptr, kv_indices, kv_last_page_len)

    batch = q.shape[0]
    out = torch.empty((batch, geo.heads_q, geo.width), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((batch, geo.heads_q), dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, lse
    group = geo.heads_q // geo.heads_kv
    last = kv_indptr if kv_last_page_len is None else kv_last_page_len  # never read with pages of one token
    _two_pass_backward[(batch, geo.heads_kv)](
        q, k_cache, v_cache, kv_indptr, kv_indices, last, out, lse, scale,
        q.stride(0), q.stride(1), q.stride(2), *k_cache.stride(), *v_cache.stride(),
        kv_indptr.stride(0), kv_indices.stride(0) if kv_indices.numel() else 1, last.stride(0),
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        GROUP=group, ROWS=max(FEWEST_ROWS, triton.next_power_of_2(group)), D=geo.width,
        DP=triton.next_power_of_2(geo.width), BLOCK=BACKWARD_BLOCK, PAGE=geo.page_size, L2E=LOG2E,
    )
    return out, lse


def entry_for(geo: Heads):
    """The entry point for ``geo``, taking its definition's arguments in order."""
    if min(geo) < 1 or geo.heads_q % geo.heads_kv:
        raise ValueError(f"argument 'definition': cannot serve {geo}")
    if geo.page_size == 1:
        def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
            return _decode(geo, q, k_cache, v_cache, kv_indptr, kv_indices, None, sm_scale)
        return run

    def run_paged(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None):
        return _decode(geo, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale)
    return run_paged


run = entry_for(Heads(heads_q=32, heads_kv=4, width=128, page_size=1))  # the seed's definition
run.for_definition = lambda d: entry_for(Heads(d.num_qo_heads, d.num_kv_heads, d.head_dim, d.page_size))
