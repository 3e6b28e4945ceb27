"""Panel implementation: a split-KV Triton kernel with a Triton LSE merge.

Traits, each deliberately unlike the project's kernel:
- every sequence is cut at random token positions (a generator with a fixed seed, so one call
  gives the same splits every time; empty splits happen and must merge as nothing; with pages of
  several tokens a split starts and ends anywhere inside a page);
- stage 1, one program per split, all query heads at once (padded to a power of two, at least 16
  rows, the padding masked; K/V rows gathered per query head): online softmax in natural-log
  units (tl.exp), q.K and P.V as broadcast products reduced with tl.sum (no tl.dot), P kept in
  float32; it writes the split's normalised partial output and natural-log partial LSE;
- stage 2, one program per sequence: two passes over its splits (max, then weighted sum);
- all strides are read, the index tensors' included (no .contiguous() copies);
- validation raises RuntimeError for everything, in its own words.

It serves every definition of the family (``run.for_definition``): head counts, head dim and page
size are the definition's; token t of a sequence is slot t % page_size of page t // page_size,
and the slots of a last page past ``kv_last_page_len`` are never read.

Independent of kernel/, reference/ and properties/: only torch and triton.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

TOKENS_PER_STEP = 64
MOST_SPLITS = 6
SPLIT_SEED = 0x5D11
FEWEST_ROWS = 16
LOG2_OF_E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Shape:
    """One definition's constants."""

    n_q: int
    n_kv: int
    hd: int
    page: int

    @property
    def qpk(self) -> int:
        """Query heads per KV head."""
        return self.n_q // self.n_kv

    @property
    def rows(self) -> int:
        """Query heads padded to a power of two (tl.arange wants one)."""
        return max(FEWEST_ROWS, triton.next_power_of_2(self.n_q))

    @property
    def width(self) -> int:
        """The head dim padded to a power of two."""
        return triton.next_power_of_2(self.hd)


@triton.jit
def _partial_kernel(
    q_ptr, k_ptr, v_ptr, indices_ptr, split_seq_ptr, split_first_ptr, split_lo_ptr, split_hi_ptr,
    part_o_ptr, part_lse_ptr, scale,
    sq_b, sq_h, sq_d, sk_p, sk_s, sk_h, sk_d, sv_p, sv_s, sv_h, sv_d, s_idx,
    N_Q: tl.constexpr, GROUP: tl.constexpr, DIM: tl.constexpr, WIDTH: tl.constexpr, STEP: tl.constexpr,
    HEADS: tl.constexpr, PAGE: tl.constexpr,
):
    split = tl.program_id(0).to(tl.int64)
    seq = tl.load(split_seq_ptr + split).to(tl.int64)
    first = tl.load(split_first_ptr + split).to(tl.int64)  # the sequence's first entry in kv_indices
    lo = tl.load(split_lo_ptr + split).to(tl.int64)  # token positions within the sequence
    hi = tl.load(split_hi_ptr + split).to(tl.int64)

    rows = tl.arange(0, HEADS).to(tl.int64)
    real = rows < N_Q
    kvh = tl.where(real, rows // GROUP, 0)  # every query head gathers its KV head's row: [HEADS, STEP, WIDTH] tiles
    dims = tl.arange(0, WIDTH).to(tl.int64)
    inside = dims < DIM
    q = tl.load(q_ptr + seq * sq_b + rows[:, None] * sq_h + dims[None, :] * sq_d,
                mask=real[:, None] & inside[None, :], other=0.0).to(tl.float32)

    run_max = tl.full([HEADS], float("-inf"), tl.float32)
    run_sum = tl.zeros([HEADS], tl.float32)
    run_acc = tl.zeros([HEADS, WIDTH], tl.float32)
    steps = tl.arange(0, STEP).to(tl.int64)
    for start in range(lo, hi, STEP):
        tok = start + steps
        ok = tok < hi
        page = tl.load(indices_ptr + (first + tok // PAGE) * s_idx, mask=ok, other=0).to(tl.int64)
        slot = tok % PAGE
        ok3 = ok[None, :, None] & inside[None, None, :]
        row = (page * sk_p + slot * sk_s)[None, :, None]
        k = tl.load(k_ptr + row + kvh[:, None, None] * sk_h + dims[None, None, :] * sk_d,
                    mask=ok3, other=0.0).to(tl.float32)
        logit = tl.sum(q[:, None, :] * k, axis=2) * scale  # [HEADS, STEP]
        logit = tl.where(ok[None, :], logit, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(logit, axis=1))
        shrink = tl.exp(run_max - new_max)
        shrink = tl.where(run_max == float("-inf"), 0.0, shrink)
        p = tl.exp(logit - new_max[:, None])
        p = tl.where(ok[None, :], p, 0.0)
        row = (page * sv_p + slot * sv_s)[None, :, None]
        v = tl.load(v_ptr + row + kvh[:, None, None] * sv_h + dims[None, None, :] * sv_d,
                    mask=ok3, other=0.0).to(tl.float32)
        run_sum = run_sum * shrink + tl.sum(p, axis=1)
        run_acc = run_acc * shrink[:, None] + tl.sum(p[:, :, None] * v, axis=1)
        run_max = new_max

    empty = hi == lo
    denom = tl.where(empty, 1.0, run_sum)
    part = tl.where(empty, 0.0, run_acc / denom[:, None])
    part_lse = tl.where(empty, float("-inf"), run_max + tl.log(denom))
    base = split * HEADS + rows
    tl.store(part_o_ptr + base[:, None] * WIDTH + dims[None, :], part)
    tl.store(part_lse_ptr + base, part_lse)


@triton.jit
def _merge_kernel(
    part_o_ptr, part_lse_ptr, seq_split_ptr, out_ptr, lse_ptr,
    so_b, so_h, so_d, sl_b, sl_h, inv_ln2,
    N_Q: tl.constexpr, HEADS: tl.constexpr, DIM: tl.constexpr, WIDTH: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    first = tl.load(seq_split_ptr + seq).to(tl.int64)
    last = tl.load(seq_split_ptr + seq + 1).to(tl.int64)
    heads = tl.arange(0, HEADS).to(tl.int64)
    dims = tl.arange(0, WIDTH).to(tl.int64)
    real = heads < N_Q

    top = tl.full([HEADS], float("-inf"), tl.float32)
    for s in range(first, last):
        top = tl.maximum(top, tl.load(part_lse_ptr + s * HEADS + heads))
    anchor = tl.where(top == float("-inf"), 0.0, top)

    weight_sum = tl.zeros([HEADS], tl.float32)
    mix = tl.zeros([HEADS, WIDTH], tl.float32)
    for s in range(first, last):
        w = tl.exp(tl.load(part_lse_ptr + s * HEADS + heads) - anchor)  # 0 for an empty split
        mix += w[:, None] * tl.load(part_o_ptr + (s * HEADS + heads)[:, None] * WIDTH + dims[None, :])
        weight_sum += w

    none = last == first
    weight_sum = tl.where(none, 1.0, weight_sum)
    result = tl.where(none, 0.0, mix / weight_sum[:, None])
    lse2 = tl.where(none, float("-inf"), (anchor + tl.log(weight_sum)) * inv_ln2)
    tl.store(out_ptr + seq * so_b + heads[:, None] * so_h + dims[None, :] * so_d, result.to(tl.bfloat16),
             mask=real[:, None] & (dims < DIM)[None, :])
    tl.store(lse_ptr + seq * sl_b + heads * sl_h, lse2, mask=real)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def _refuse(message: str):
    raise RuntimeError(f"gqa split-kv decode refused the call: {message}")


def _validate_tensors(shape: Shape, named: dict) -> None:
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            _refuse(f"{name} is a {type(t).__name__}, not a tensor")
    for name in ("q", "k_cache", "v_cache"):
        if named[name].dtype is not torch.bfloat16:
            _refuse(f"{name} holds {named[name].dtype}; only bfloat16 is computed")
    for name in ("kv_indptr", "kv_indices", "kv_last_page_len"):
        if name in named and named[name].dtype not in (torch.int32, torch.int64):
            _refuse(f"{name} holds {named[name].dtype}; page indices are int32 or int64")
    q, k_cache, v_cache = named["q"], named["k_cache"], named["v_cache"]
    if q.dim() != 3 or q.shape[1] != shape.n_q or q.shape[2] != shape.hd:
        _refuse(f"q is {tuple(q.shape)}; expected (batch, {shape.n_q}, {shape.hd})")
    if k_cache.dim() != 4 or tuple(k_cache.shape[1:]) != (shape.page, shape.n_kv, shape.hd):
        _refuse(f"k_cache is {tuple(k_cache.shape)}; expected (pages, {shape.page}, {shape.n_kv}, {shape.hd})")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        _refuse(f"v_cache is {tuple(v_cache.shape)} but k_cache is {tuple(k_cache.shape)}")
    if named["kv_indptr"].dim() != 1 or named["kv_indptr"].shape[0] != q.shape[0] + 1:
        _refuse(f"kv_indptr is {tuple(named['kv_indptr'].shape)}; expected ({q.shape[0] + 1},)")
    if named["kv_indices"].dim() != 1:
        _refuse(f"kv_indices is {tuple(named['kv_indices'].shape)}; expected one dimension")
    if "kv_last_page_len" in named and tuple(named["kv_last_page_len"].shape) != (q.shape[0],):
        _refuse(f"kv_last_page_len is {tuple(named['kv_last_page_len'].shape)}; expected ({q.shape[0]},)")
    devices = {t.device for t in named.values()}
    if len(devices) != 1:
        _refuse(f"inputs are spread over {sorted(str(d) for d in devices)}")
    device = q.device
    if not (device.type == "cuda" or (device.type == "cpu" and _interpreting())):
        _refuse(f"cannot launch on {device} (CUDA, or CPU under TRITON_INTERPRET=1)")


def _validate_scale(shape: Shape, sm_scale) -> float:
    if sm_scale is None:
        return shape.hd**-0.5
    if isinstance(sm_scale, torch.Tensor) and sm_scale.numel() == 1:
        sm_scale = sm_scale.item()
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        _refuse(f"sm_scale of type {type(sm_scale).__name__} is not a real number")
    scale = float(sm_scale)
    if not math.isfinite(scale) or not math.isfinite(float(torch.tensor(scale, dtype=torch.float32))):
        _refuse(f"sm_scale {scale} is not a finite float32")
    return scale


def _validate_pages(shape: Shape, k_cache, kv_indptr, kv_indices, kv_last_page_len) -> tuple[list[int], list[int]]:
    """kv_indptr as a list, and the tokens of each sequence."""
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
    pages = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    if kv_last_page_len is None:
        return bounds, pages
    tokens = []
    for seq, (count, last) in enumerate(zip(pages, kv_last_page_len.tolist())):
        if count and not 1 <= last <= shape.page:
            _refuse(f"kv_last_page_len[{seq}] = {last}; a last page holds 1 to {shape.page} tokens")
        tokens.append((count - 1) * shape.page + last if count else 0)
    return bounds, tokens


def _random_splits(bounds: list[int], tokens: list[int]) -> tuple[list[int], ...]:
    """Per split: its sequence, the sequence's first kv_indices entry, its first and end token (within the
    sequence); per sequence: its range of splits."""
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    owner, first, lo, hi, seq_split = [], [], [], [], [0]
    for seq, count in enumerate(tokens):
        if count:
            pieces = int(torch.randint(1, MOST_SPLITS + 1, (1,), generator=gen))
            cuts = sorted(torch.randint(0, count + 1, (pieces - 1,), generator=gen).tolist())
            edges = [0, *cuts, count]  # repeated cuts give empty splits
            for a, b in zip(edges[:-1], edges[1:]):
                owner.append(seq)
                first.append(bounds[seq])
                lo.append(a)
                hi.append(b)
        seq_split.append(len(owner))
    return owner, first, lo, hi, seq_split


def _decode(shape: Shape, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "kv_indptr": kv_indptr, "kv_indices": kv_indices}
    if shape.page > 1:
        named["kv_last_page_len"] = kv_last_page_len
    _validate_tensors(shape, named)
    scale = _validate_scale(shape, sm_scale)
    bounds, tokens = _validate_pages(shape, k_cache, kv_indptr, kv_indices, kv_last_page_len)
    device = q.device
    batch = q.shape[0]
    output = torch.empty((batch, shape.n_q, shape.hd), dtype=torch.bfloat16, device=device)
    lse = torch.empty((batch, shape.n_q), dtype=torch.float32, device=device)
    if batch == 0:
        return output, lse

    owner, first, lo, hi, seq_split = _random_splits(bounds, tokens)
    as_index = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
    splits = len(owner)
    part_o = torch.empty((max(splits, 1), shape.rows, shape.width), dtype=torch.float32, device=device)
    part_lse = torch.empty((max(splits, 1), shape.rows), dtype=torch.float32, device=device)
    if splits:
        _partial_kernel[(splits,)](
            q, k_cache, v_cache, kv_indices, as_index(owner), as_index(first), as_index(lo), as_index(hi),
            part_o, part_lse, scale,
            q.stride(0), q.stride(1), q.stride(2),
            *k_cache.stride(), *v_cache.stride(),
            kv_indices.stride(0) if kv_indices.numel() else 1,
            N_Q=shape.n_q, GROUP=shape.qpk, DIM=shape.hd, WIDTH=shape.width, STEP=TOKENS_PER_STEP,
            HEADS=shape.rows, PAGE=shape.page,
        )
    _merge_kernel[(batch,)](
        part_o, part_lse, as_index(seq_split), output, lse,
        output.stride(0), output.stride(1), output.stride(2), lse.stride(0), lse.stride(1), LOG2_OF_E,
        N_Q=shape.n_q, HEADS=shape.rows, DIM=shape.hd, WIDTH=shape.width,
    )
    return output, lse


def launcher(shape: Shape):
    """The entry point for ``shape``, taking its definition's arguments in order."""
    if min(shape.n_q, shape.n_kv, shape.hd, shape.page) < 1 or shape.n_q % shape.n_kv:
        raise ValueError(f"gqa split-kv decode cannot serve {shape}")
    if shape.page == 1:
        def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale=None):
            return _decode(shape, q, k_cache, v_cache, kv_indptr, kv_indices, None, sm_scale)
        return run

    def run_paged(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale=None):
        return _decode(shape, q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale)
    return run_paged


run = launcher(Shape(n_q=32, n_kv=4, hd=128, page=1))  # the seed's definition
run.for_definition = lambda d: launcher(Shape(d.num_qo_heads, d.num_kv_heads, d.head_dim, d.page_size))
