"""Decode cases: a small frozen descriptor, and one deterministic builder of tensors from it.

Hypothesis draws descriptors (sizes, page layout, value regime, a seed), never
tensors, so generation is fast, database entries are small and a shrunk
counterexample reads as one line. ``build`` turns a descriptor into kernel
arguments on any device; values come from a CPU generator, so a case builds the
same tensors on CPU and GPU (unreferenced pool pages excepted: they hold junk that
must not matter).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 4, 128

PAGE_LAYOUTS = ("shuffled", "contiguous", "shared_prefix")
POOL_FILLS = ("nan", "inf", "noise")


@dataclass(frozen=True)
class DecodeCase:
    """Everything needed to rebuild one kernel call.

    lengths: tokens per sequence (the batch is ``len(lengths)``).
    layout: how page ids are assigned (``PAGE_LAYOUTS``).
    spare_pages: pool pages that no sequence references.
    pool_fill: what unreferenced pages hold (``POOL_FILLS``).
    scale: sm_scale passed to the kernel; None for its default.
    values: the value regime of q, K and V (``VALUE_REGIMES``).
    seed: seeds the CPU generator behind every random choice.
    """

    lengths: tuple[int, ...]
    layout: str = "shuffled"
    spare_pages: int = 0
    pool_fill: str = "nan"
    scale: float | None = None
    values: str = "normal"
    seed: int = 0

    @property
    def batch(self) -> int:
        return len(self.lengths)


class DecodeInputs(NamedTuple):
    """The arguments of ``run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)``."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    sm_scale: float | None


# ---- page ids -------------------------------------------------------------------------------


def _shared_prefix_tokens(lengths: tuple[int, ...], gen: torch.Generator) -> int:
    nonempty = [n for n in lengths if n > 0]
    if len(nonempty) < 2:
        return 0
    return int(torch.randint(1, min(nonempty) + 1, (1,), generator=gen))


def page_ids(case: DecodeCase, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """kv_indices (int64, CPU) for the case's layout, and the pool size."""
    lengths = case.lengths
    if case.layout == "shared_prefix":
        prefix = _shared_prefix_tokens(lengths, gen)
        distinct = prefix + sum(n - prefix for n in lengths if n > 0)
        pool = distinct + case.spare_pages
        slots = torch.randperm(pool, generator=gen)[:distinct]
        shared, rest = slots[:prefix], slots[prefix:]
        pieces, used = [], 0
        for n in lengths:
            if n == 0:
                continue
            own = n - prefix
            pieces += [shared, rest[used:used + own]]
            used += own
        return (torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)), pool
    total = sum(lengths)
    pool = total + case.spare_pages
    if case.layout == "shuffled":
        return torch.randperm(pool, generator=gen)[:total], pool
    if case.layout == "contiguous":
        # Each sequence owns one run of consecutive pages; runs are placed in random
        # order with the spare pages spread as gaps between them.
        order = torch.randperm(len(lengths), generator=gen).tolist()
        cuts = torch.sort(torch.randint(0, case.spare_pages + 1, (len(lengths),), generator=gen)).values.tolist()
        starts, cursor, previous_cut = [0] * len(lengths), 0, 0
        for b, cut in zip(order, cuts):
            cursor += cut - previous_cut
            previous_cut = cut
            starts[b] = cursor
            cursor += lengths[b]
        pieces = [torch.arange(s, s + n) for s, n in zip(starts, lengths)]
        return (torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)), pool
    raise ValueError(f"unknown layout={case.layout!r}; expected one of {PAGE_LAYOUTS}")


# ---- values ---------------------------------------------------------------------------------

Regime = Callable[[torch.Generator, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _normal(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen)


def _uniform(gen: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand((), generator=gen))


def _regime_normal(gen, batch, rows):
    return _normal(gen, batch, NUM_QO_HEADS, HEAD_DIM), _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM), _normal(
        gen, rows, NUM_KV_HEADS, HEAD_DIM)


def _regime_wide(gen, batch, rows):
    """Each tensor at its own magnitude, 1e-3 .. 1e3."""
    q, k, v = _regime_normal(gen, batch, rows)
    return tuple(t * 10.0 ** _uniform(gen, -3.0, 3.0) for t in (q, k, v))


def _regime_large_logits(gen, batch, rows):
    """Logits of magnitude 1e3 .. 1e4: softmax nearly one-hot."""
    q, k, v = _regime_normal(gen, batch, rows)
    return q * _uniform(gen, 10.0, 40.0), k * _uniform(gen, 10.0, 40.0), v


def _regime_very_negative(gen, batch, rows):
    """Every logit far below any finite mask sentinel (about -1e5), still spread out."""
    direction = _normal(gen, HEAD_DIM)
    direction = direction / direction.norm()
    k = 30.0 * direction + 0.5 * _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM)
    q = -300.0 * direction + 0.5 * _normal(gen, batch, NUM_QO_HEADS, HEAD_DIM)
    return q, k, _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM)


def _regime_peaky(gen, batch, rows):
    """A few keys (about 1 in 50) carry most of the weight."""
    q, k, v = _regime_normal(gen, batch, rows)
    loud = torch.rand(rows, 1, 1, generator=gen) < 0.02
    return q, torch.where(loud, 8.0 * k, k), v


def _regime_constant_keys(gen, batch, rows):
    """All keys equal: exact ties, uniform weights."""
    q, _, v = _regime_normal(gen, batch, rows)
    k = _normal(gen, 1, NUM_KV_HEADS, HEAD_DIM).expand(rows, -1, -1)
    return q, k, v


def _regime_outliers(gen, batch, rows):
    """Standard normal with rare entries (0.1%) of magnitude up to 1e3."""
    q, k, v = _regime_normal(gen, batch, rows)

    def spike(t):
        where = torch.rand(t.shape, generator=gen) < 1e-3
        return torch.where(where, torch.sign(t) * 10.0 ** (3.0 * torch.rand(t.shape, generator=gen)), t)

    return spike(q), spike(k), spike(v)


def _regime_offset_values(gen, batch, rows):
    """V rows near a large common offset: the output needs well-normalised weights."""
    q, k, v = _regime_normal(gen, batch, rows)
    return q, k, 100.0 + 0.1 * v


VALUE_REGIMES: dict[str, Regime] = {
    "normal": _regime_normal,
    "wide": _regime_wide,
    "large_logits": _regime_large_logits,
    "very_negative": _regime_very_negative,
    "peaky": _regime_peaky,
    "constant_keys": _regime_constant_keys,
    "outliers": _regime_outliers,
    "offset_values": _regime_offset_values,
}


# ---- the builder ----------------------------------------------------------------------------


def _pool(size: int, fill: str, seed: int, device: torch.device) -> torch.Tensor:
    shape = (size, 1, NUM_KV_HEADS, HEAD_DIM)
    if fill == "nan":
        return torch.full(shape, math.nan, dtype=torch.bfloat16, device=device)
    if fill == "inf":
        return torch.full(shape, math.inf, dtype=torch.bfloat16, device=device)
    if fill == "noise":
        gen = torch.Generator(device=device).manual_seed(seed)
        return (torch.randn(shape, generator=gen, device=device) * 1e4).to(torch.bfloat16)
    raise ValueError(f"unknown pool_fill={fill!r}; expected one of {POOL_FILLS}")


def build(case: DecodeCase, device: torch.device | str = "cpu") -> DecodeInputs:
    """Deterministically build the kernel arguments a case describes, on ``device``."""
    if case.values not in VALUE_REGIMES:
        raise ValueError(f"unknown values={case.values!r}; expected one of {tuple(VALUE_REGIMES)}")
    device = torch.device(device)
    gen = torch.Generator().manual_seed(case.seed)
    indices, pool_size = page_ids(case, gen)
    referenced = torch.unique(indices)
    q, k_rows, v_rows = VALUE_REGIMES[case.values](gen, case.batch, referenced.numel())
    k_cache = _pool(pool_size, case.pool_fill, case.seed, device)
    v_cache = _pool(pool_size, case.pool_fill, case.seed + 1, device)
    slots = referenced.to(device)
    k_cache[slots, 0] = k_rows.to(torch.bfloat16).to(device)
    v_cache[slots, 0] = v_rows.to(torch.bfloat16).to(device)
    indptr = torch.tensor([0, *torch.tensor(case.lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    return DecodeInputs(
        q=q.to(torch.bfloat16).to(device),
        k_cache=k_cache,
        v_cache=v_cache,
        kv_indptr=indptr.to(device),
        kv_indices=indices.to(torch.int32).to(device),
        sm_scale=case.scale,
    )
