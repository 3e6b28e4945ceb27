"""Panel implementation: a split-KV Triton kernel with a Triton LSE merge.

Traits, each deliberately unlike the project's kernel:
- every sequence is cut at random split points (a generator with a fixed seed, so one call
  gives the same splits every time; empty splits happen and must merge as nothing);
- stage 1, one program per split, all 32 heads (K/V rows gathered per query head): online softmax
  in natural-log units (tl.exp),
  q.K and P.V as broadcast products reduced with tl.sum (no tl.dot), P kept in float32;
  it writes the split's normalised partial output and natural-log partial LSE;
- stage 2, one program per sequence: two passes over its splits (max, then weighted sum);
- all strides are read, the index tensors' included (no .contiguous() copies);
- validation raises RuntimeError for everything, in its own words.

Independent of kernel/, reference/ and properties/: only torch and triton.
"""

from __future__ import annotations

import math
import numbers
import os

import torch
import triton
import triton.language as tl

N_Q = 32
N_KV = 4
HD = 128
QPK = N_Q // N_KV  # query heads per KV head
TOKENS_PER_STEP = 64
MOST_SPLITS = 6
SPLIT_SEED = 0x5D11
DEFAULT_SCALE = HD**-0.5
LOG2_OF_E = 1.0 / math.log(2.0)


@triton.jit
def _partial_kernel(
    q_ptr, k_ptr, v_ptr, indices_ptr, split_seq_ptr, split_lo_ptr, split_hi_ptr,
    part_o_ptr, part_lse_ptr, scale,
    sq_b, sq_h, sq_d, sk_p, sk_h, sk_d, sv_p, sv_h, sv_d, s_idx,
    GROUP: tl.constexpr, DIM: tl.constexpr, STEP: tl.constexpr, HEADS: tl.constexpr,
):
    split = tl.program_id(0).to(tl.int64)
    seq = tl.load(split_seq_ptr + split).to(tl.int64)
    lo = tl.load(split_lo_ptr + split).to(tl.int64)
    hi = tl.load(split_hi_ptr + split).to(tl.int64)

    rows = tl.arange(0, HEADS).to(tl.int64)
    kvh = rows // GROUP  # every query head gathers its KV head's row: [HEADS, STEP, DIM] tiles
    dims = tl.arange(0, DIM).to(tl.int64)
    q = tl.load(q_ptr + seq * sq_b + rows[:, None] * sq_h + dims[None, :] * sq_d).to(tl.float32)

    run_max = tl.full([HEADS], float("-inf"), tl.float32)
    run_sum = tl.zeros([HEADS], tl.float32)
    run_acc = tl.zeros([HEADS, DIM], tl.float32)
    steps = tl.arange(0, STEP).to(tl.int64)
    for start in range(lo, hi, STEP):
        tok = start + steps
        ok = tok < hi
        page = tl.load(indices_ptr + tok * s_idx, mask=ok, other=0).to(tl.int64)
        ok3 = ok[None, :, None]
        k = tl.load(k_ptr + page[None, :, None] * sk_p + kvh[:, None, None] * sk_h + dims[None, None, :] * sk_d,
                    mask=ok3, other=0.0).to(tl.float32)
        logit = tl.sum(q[:, None, :] * k, axis=2) * scale  # [HEADS, STEP]
        logit = tl.where(ok[None, :], logit, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(logit, axis=1))
        shrink = tl.exp(run_max - new_max)
        shrink = tl.where(run_max == float("-inf"), 0.0, shrink)
        p = tl.exp(logit - new_max[:, None])
        p = tl.where(ok[None, :], p, 0.0)
        v = tl.load(v_ptr + page[None, :, None] * sv_p + kvh[:, None, None] * sv_h + dims[None, None, :] * sv_d,
                    mask=ok3, other=0.0).to(tl.float32)
        run_sum = run_sum * shrink + tl.sum(p, axis=1)
        run_acc = run_acc * shrink[:, None] + tl.sum(p[:, :, None] * v, axis=1)
        run_max = new_max

    empty = hi == lo
    denom = tl.where(empty, 1.0, run_sum)
    part = tl.where(empty, 0.0, run_acc / denom[:, None])
    part_lse = tl.where(empty, float("-inf"), run_max + tl.log(denom))
    base = split * HEADS + rows
    tl.store(part_o_ptr + base[:, None] * DIM + dims[None, :], part)
    tl.store(part_lse_ptr + base, part_lse)


@triton.jit
def _merge_kernel(
    part_o_ptr, part_lse_ptr, seq_split_ptr, out_ptr, lse_ptr,
    so_b, so_h, so_d, sl_b, sl_h, inv_ln2,
    HEADS: tl.constexpr, DIM: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    first = tl.load(seq_split_ptr + seq).to(tl.int64)
    last = tl.load(seq_split_ptr + seq + 1).to(tl.int64)
    heads = tl.arange(0, HEADS).to(tl.int64)
    dims = tl.arange(0, DIM).to(tl.int64)

    top = tl.full([HEADS], float("-inf"), tl.float32)
    for s in range(first, last):
        top = tl.maximum(top, tl.load(part_lse_ptr + s * HEADS + heads))
    anchor = tl.where(top == float("-inf"), 0.0, top)

    weight_sum = tl.zeros([HEADS], tl.float32)
    mix = tl.zeros([HEADS, DIM], tl.float32)
    for s in range(first, last):
        w = tl.exp(tl.load(part_lse_ptr + s * HEADS + heads) - anchor)  # 0 for an empty split
        mix += w[:, None] * tl.load(part_o_ptr + (s * HEADS + heads)[:, None] * DIM + dims[None, :])
        weight_sum += w

    none = last == first
    result = tl.where(none, 0.0, mix / tl.where(none, 1.0, weight_sum)[:, None])
    lse2 = tl.where(none, float("-inf"), (anchor + tl.log(weight_sum)) * inv_ln2)
    tl.store(out_ptr + seq * so_b + heads[:, None] * so_h + dims[None, :] * so_d, result.to(tl.bfloat16))
    tl.store(lse_ptr + seq * sl_b + heads * sl_h, lse2)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def _refuse(message: str):
    raise RuntimeError(f"gqa split-kv decode refused the call: {message}")


def _validate(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale) -> tuple[float, list[int]]:
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "kv_indptr": kv_indptr, "kv_indices": kv_indices}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            _refuse(f"{name} is a {type(t).__name__}, not a tensor")
    for name in ("q", "k_cache", "v_cache"):
        if named[name].dtype is not torch.bfloat16:
            _refuse(f"{name} holds {named[name].dtype}; only bfloat16 is computed")
    for name in ("kv_indptr", "kv_indices"):
        if named[name].dtype not in (torch.int32, torch.int64):
            _refuse(f"{name} holds {named[name].dtype}; page indices are int32 or int64")
    if q.dim() != 3 or q.shape[1] != N_Q or q.shape[2] != HD:
        _refuse(f"q is {tuple(q.shape)}; expected (batch, {N_Q}, {HD})")
    if k_cache.dim() != 4 or tuple(k_cache.shape[1:]) != (1, N_KV, HD):
        _refuse(f"k_cache is {tuple(k_cache.shape)}; expected (pages, 1, {N_KV}, {HD})")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        _refuse(f"v_cache is {tuple(v_cache.shape)} but k_cache is {tuple(k_cache.shape)}")
    if kv_indptr.dim() != 1 or kv_indptr.shape[0] != q.shape[0] + 1:
        _refuse(f"kv_indptr is {tuple(kv_indptr.shape)}; expected ({q.shape[0] + 1},)")
    if kv_indices.dim() != 1:
        _refuse(f"kv_indices is {tuple(kv_indices.shape)}; expected one dimension")
    devices = {t.device for t in named.values()}
    if len(devices) != 1:
        _refuse(f"inputs are spread over {sorted(str(d) for d in devices)}")
    device = q.device
    if not (device.type == "cuda" or (device.type == "cpu" and _interpreting())):
        _refuse(f"cannot launch on {device} (CUDA, or CPU under TRITON_INTERPRET=1)")

    if sm_scale is None:
        scale = DEFAULT_SCALE
    else:
        if isinstance(sm_scale, torch.Tensor) and sm_scale.numel() == 1:
            sm_scale = sm_scale.item()
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
            _refuse(f"sm_scale of type {type(sm_scale).__name__} is not a real number")
        scale = float(sm_scale)
        if not math.isfinite(scale) or not math.isfinite(float(torch.tensor(scale, dtype=torch.float32))):
            _refuse(f"sm_scale {scale} is not a finite float32")

    bounds = kv_indptr.tolist()
    if bounds[0] != 0:
        _refuse(f"kv_indptr begins at {bounds[0]}, not 0")
    if any(b > a for a, b in zip(bounds[1:], bounds[:-1])):
        _refuse("kv_indptr decreases somewhere")
    if bounds[-1] != kv_indices.shape[0]:
        _refuse(f"kv_indptr ends at {bounds[-1]} but kv_indices has {kv_indices.shape[0]} entries")
    if kv_indices.numel():
        low, high = int(kv_indices.min()), int(kv_indices.max())
        if low < 0 or high >= k_cache.shape[0]:
            _refuse(f"kv_indices span [{low}, {high}], outside the {k_cache.shape[0]} pages of the pool")
    return scale, bounds


def _random_splits(bounds: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per split: its sequence, first and end token (absolute positions in kv_indices); per sequence: split range."""
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    owner, lo, hi, seq_split = [], [], [], [0]
    for seq, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end > start:
            pieces = int(torch.randint(1, MOST_SPLITS + 1, (1,), generator=gen))
            cuts = sorted(torch.randint(start, end + 1, (pieces - 1,), generator=gen).tolist())
            edges = [start, *cuts, end]  # repeated cuts give empty splits
            for a, b in zip(edges[:-1], edges[1:]):
                owner.append(seq)
                lo.append(a)
                hi.append(b)
        seq_split.append(len(owner))
    return owner, lo, hi, seq_split


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
    scale, bounds = _validate(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    device = q.device
    batch = q.shape[0]
    output = torch.empty((batch, N_Q, HD), dtype=torch.bfloat16, device=device)
    lse = torch.empty((batch, N_Q), dtype=torch.float32, device=device)
    if batch == 0:
        return output, lse

    owner, lo, hi, seq_split = _random_splits(bounds)
    as_index = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
    splits = len(owner)
    part_o = torch.empty((max(splits, 1), N_Q, HD), dtype=torch.float32, device=device)
    part_lse = torch.empty((max(splits, 1), N_Q), dtype=torch.float32, device=device)
    if splits:
        _partial_kernel[(splits,)](
            q, k_cache, v_cache, kv_indices, as_index(owner), as_index(lo), as_index(hi),
            part_o, part_lse, scale,
            q.stride(0), q.stride(1), q.stride(2),
            k_cache.stride(0), k_cache.stride(2), k_cache.stride(3),
            v_cache.stride(0), v_cache.stride(2), v_cache.stride(3),
            kv_indices.stride(0) if kv_indices.numel() else 1,
            GROUP=QPK, DIM=HD, STEP=TOKENS_PER_STEP, HEADS=N_Q,
        )
    _merge_kernel[(batch,)](
        part_o, part_lse, as_index(seq_split), output, lse,
        output.stride(0), output.stride(1), output.stride(2), lse.stride(0), lse.stride(1), LOG2_OF_E,
        HEADS=N_Q, DIM=HD,
    )
    return output, lse
