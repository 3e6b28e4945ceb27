"""Decode cases: a small frozen descriptor, and one deterministic builder of tensors from it.

Hypothesis draws descriptors (sizes, page layout, value regime, a seed), never
tensors, so generation is fast, database entries are small and a shrunk
counterexample reads as one line. ``build`` turns a descriptor into kernel
arguments on any device, the same tensors each time on the same kind of device
(values are drawn there; case files carry tensors from one device to another).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import sibling

_contract = sibling("reference")
DEFAULT_SM_SCALE, HEAD_DIM = _contract.DEFAULT_SM_SCALE, _contract.HEAD_DIM
NUM_KV_HEADS, NUM_QO_HEADS = _contract.NUM_KV_HEADS, _contract.NUM_QO_HEADS

# "pool_end" puts every page in the top slots of the pool: with a huge pool, page ids pass 2**22.
PAGE_LAYOUTS = ("shuffled", "contiguous", "shared_prefix", "pool_end")
DEFAULT_PAGE_LAYOUTS = PAGE_LAYOUTS[:3]
POOL_FILLS = ("nan", "inf", "noise")
# How q and the K/V pool sit in memory (strides), and the index tensors' dtype and contiguity;
# the first of each is the plain layout. Padding and gaps hold junk (NaN, or an in-range page id).
Q_LAYOUTS = ("contiguous", "fused_qkv", "strided_dim", "heads_outer", "dim_outer")
KV_LAYOUTS = ("separate", "padded_dim", "combined", "planes", "heads_outer", "dim_outer", "mixed")
INDEX_LAYOUTS = ("int32", "int64", "int32_strided", "int64_strided")


@dataclass(frozen=True)
class DecodeCase:
    """Everything needed to rebuild one kernel call.

    lengths: tokens per sequence (the batch is ``len(lengths)``).
    page_layout: how page ids are assigned (``PAGE_LAYOUTS``).
    spare_pages: pool pages that no sequence references.
    pool_fill: what unreferenced pages hold (``POOL_FILLS``).
    scale: sm_scale passed to the kernel; None for its default.
    values: the value regime of q, K and V (``VALUE_REGIMES``).
    seed: seeds the generators behind every random choice.
    q_layout: how q sits in memory (``Q_LAYOUTS``), e.g. a slice of a fused QKV tensor.
    kv_layout: how the K and V pools sit in memory (``KV_LAYOUTS``), e.g. one combined buffer.
    index_layout: dtype and contiguity of kv_indptr and kv_indices (``INDEX_LAYOUTS``).
    """

    lengths: tuple[int, ...]
    page_layout: str = "shuffled"
    spare_pages: int = 0
    pool_fill: str = "nan"
    scale: float | None = None
    values: str = "normal"
    seed: int = 0
    q_layout: str = "contiguous"
    kv_layout: str = "separate"
    index_layout: str = "int32"

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
    if case.page_layout == "shared_prefix":
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
    if case.page_layout == "shuffled":
        return torch.randperm(pool, generator=gen)[:total], pool
    if case.page_layout == "contiguous":
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
    if case.page_layout == "pool_end":
        return pool - total + torch.randperm(total, generator=gen), pool
    raise ValueError(f"unknown page_layout={case.page_layout!r}; expected one of {PAGE_LAYOUTS}")


# ---- values ---------------------------------------------------------------------------------

Regime = Callable[[torch.Generator, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _normal(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=gen.device)


def _uniform(gen: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand((), generator=gen, device=gen.device))


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
    """Logits near -800 at the default scale (below a -5e4 sentinel from scale 8 up), still spread out."""
    direction = _normal(gen, HEAD_DIM)
    direction = direction / direction.norm()
    k = 30.0 * direction + 0.5 * _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM)
    q = -300.0 * direction + 0.5 * _normal(gen, batch, NUM_QO_HEADS, HEAD_DIM)
    return q, k, _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM)


def _regime_peaky(gen, batch, rows):
    """A few keys (about 1 in 50) carry most of the weight."""
    q, k, v = _regime_normal(gen, batch, rows)
    loud = torch.rand(rows, 1, 1, generator=gen, device=gen.device) < 0.02
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
        where = torch.rand(t.shape, generator=gen, device=gen.device) < 1e-3
        magnitude = 10.0 ** (3.0 * torch.rand(t.shape, generator=gen, device=gen.device))
        return torch.where(where, torch.sign(t) * magnitude, t)

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
DEFAULT_REGIMES = tuple(VALUE_REGIMES)


def _directions(gen: torch.Generator) -> torch.Tensor:
    """One random unit vector per KV head [4, 128]."""
    direction = _normal(gen, NUM_KV_HEADS, HEAD_DIM)
    return direction / direction.norm(dim=-1, keepdim=True)


def _along(direction: torch.Tensor, norm: float, noise: torch.Tensor) -> torch.Tensor:
    """``norm`` times each row's KV-head direction, plus ``noise`` [n, heads, 128] (query or KV heads)."""
    heads = noise.shape[1]
    return norm * direction.repeat_interleave(heads // NUM_KV_HEADS, dim=0) + noise


def _regime_huge_logits(gen, batch, rows):
    """Logits of magnitude 1e4 .. 1e6 at the default scale, either sign: one-hot softmax."""
    direction, norm = _directions(gen), 10.0 ** _uniform(gen, 2.5, 3.5)
    sign = torch.where(torch.rand(rows, NUM_KV_HEADS, 1, generator=gen, device=gen.device) < 0.5, -1.0, 1.0)
    q = _along(direction, norm, _normal(gen, batch, NUM_QO_HEADS, HEAD_DIM))
    k = sign * _along(direction, norm, _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM))
    return q, k, _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM)


def _regime_beyond_sentinel(gen, batch, rows):
    """Every logit about -1e4 .. -1e6 at the default scale: below the -5e4 mask sentinel kernels have used."""
    direction = _directions(gen)
    q = _along(direction, -_uniform(gen, 300.0, 3000.0), _normal(gen, batch, NUM_QO_HEADS, HEAD_DIM))
    k = _along(direction, _uniform(gen, 300.0, 3000.0), _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM))
    return q, k, _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM)


def _regime_dominant_token(gen, batch, rows):
    """About one key per sequence lies along its queries, 10 .. 1e4 logits (default scale) above the rest."""
    direction = _directions(gen)
    q = _along(direction, 10.0, _normal(gen, batch, NUM_QO_HEADS, HEAD_DIM))
    loud = torch.rand(rows, 1, 1, generator=gen, device=gen.device) < batch / max(rows, 1)
    gap = 10.0 ** _uniform(gen, 1.0, 4.0) / (10.0 * DEFAULT_SM_SCALE)
    k = torch.where(loud, gap * direction, _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM))
    return q, k, _normal(gen, rows, NUM_KV_HEADS, HEAD_DIM)


def _regime_exact_ties(gen, batch, rows):
    """A third of the keys are one loud key, bit for bit: tied top logits, output the mean of their V."""
    q, k, v = _regime_normal(gen, batch, rows)
    tied = torch.rand(rows, 1, 1, generator=gen, device=gen.device) < 1.0 / 3.0
    return q, torch.where(tied, 4.0 * _normal(gen, 1, NUM_KV_HEADS, HEAD_DIM), k), v


VALUE_REGIMES.update({
    "huge_logits": _regime_huge_logits,
    "beyond_sentinel": _regime_beyond_sentinel,
    "dominant_token": _regime_dominant_token,
    "exact_ties": _regime_exact_ties,
})
HOSTILE_REGIMES = tuple(name for name in VALUE_REGIMES if name not in ("normal", "offset_values", "outliers"))


# ---- memory layouts -------------------------------------------------------------------------

PoolViews = tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]  # K view, V view, storages


def _kv_pool(layout: str, size: int, device: torch.device) -> PoolViews:
    """Uninitialised K and V pools [size, 1, 4, 128] laid out as ``layout``, and the storages behind them."""
    empty = lambda *shape: torch.empty(shape, dtype=torch.bfloat16, device=device)  # noqa: E731
    if layout == "separate":
        k, v = empty(size, 1, NUM_KV_HEADS, HEAD_DIM), empty(size, 1, NUM_KV_HEADS, HEAD_DIM)
        return k, v, (k, v)
    if layout == "padded_dim":  # K's head dim padded to 192 (junk in the padding), V plain
        k, v = empty(size, 1, NUM_KV_HEADS, 192), empty(size, 1, NUM_KV_HEADS, HEAD_DIM)
        return k[..., :HEAD_DIM], v, (k, v)
    if layout == "combined":  # one buffer, K and V of a page side by side: [P, 2, 1, 4, 128]
        kv = empty(size, 2, 1, NUM_KV_HEADS, HEAD_DIM)
        return kv[:, 0], kv[:, 1], (kv,)
    if layout == "planes":  # one buffer, a K plane then a V plane: [2, P, 1, 4, 128]
        kv = empty(2, size, 1, NUM_KV_HEADS, HEAD_DIM)
        return kv[0], kv[1], (kv,)
    if layout == "heads_outer":  # [4, P, 1, 128] storage: the head stride is P * 128
        k, v = empty(NUM_KV_HEADS, size, 1, HEAD_DIM), empty(NUM_KV_HEADS, size, 1, HEAD_DIM)
        return k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3), (k, v)
    if layout == "dim_outer":  # [128, P, 1, 4] storage: the last dimension's stride is P * 4
        k, v = empty(HEAD_DIM, size, 1, NUM_KV_HEADS), empty(HEAD_DIM, size, 1, NUM_KV_HEADS)
        return k.permute(1, 2, 3, 0), v.permute(1, 2, 3, 0), (k, v)
    if layout == "mixed":  # K plain, V heads-outer
        k, v = empty(size, 1, NUM_KV_HEADS, HEAD_DIM), empty(NUM_KV_HEADS, size, 1, HEAD_DIM)
        return k, v.permute(1, 2, 0, 3), (k, v)
    raise ValueError(f"unknown kv_layout={layout!r}; expected one of {KV_LAYOUTS}")


def _place_q(q: torch.Tensor, layout: str) -> torch.Tensor:
    """q [B, 32, 128] as a view with ``layout``'s strides; storage outside the view holds NaN."""
    batch = q.shape[0]
    if layout == "contiguous":
        return q.contiguous()
    if layout == "fused_qkv":  # q heads, then 4 K and 4 V heads of the same token: batch stride 40 * 128
        qkv = torch.full((batch, NUM_QO_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM), math.nan, dtype=q.dtype, device=q.device)
        qkv[:, :NUM_QO_HEADS] = q
        return qkv[:, :NUM_QO_HEADS]
    if layout == "strided_dim":  # every other element of a [B, 32, 256] buffer: last-dimension stride 2
        wide = torch.full((batch, NUM_QO_HEADS, 2 * HEAD_DIM), math.nan, dtype=q.dtype, device=q.device)
        wide[..., ::2] = q
        return wide[..., ::2]
    if layout == "heads_outer":  # [32, B, 128] storage
        return q.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "dim_outer":  # [B, 128, 32] storage: last-dimension stride 32, dense
        return q.transpose(1, 2).contiguous().transpose(1, 2)
    raise ValueError(f"unknown q_layout={layout!r}; expected one of {Q_LAYOUTS}")


def _place_index(values: torch.Tensor, layout: str, gap: int, device: torch.device) -> torch.Tensor:
    """An index tensor in ``layout``'s dtype, strided ones as every other element with ``gap`` between."""
    if layout not in INDEX_LAYOUTS:
        raise ValueError(f"unknown index_layout={layout!r}; expected one of {INDEX_LAYOUTS}")
    dtype = torch.int64 if layout.startswith("int64") else torch.int32
    if not layout.endswith("_strided"):
        return values.to(dtype).to(device)
    spaced = torch.full((2 * values.numel(),), gap, dtype=dtype)
    spaced[::2] = values
    return spaced.to(device)[::2]


def _fill_junk(storage: torch.Tensor, fill: str, seed: int) -> None:
    if fill == "nan":
        storage.fill_(math.nan)
    elif fill == "inf":
        storage.fill_(math.inf)
    elif fill == "noise":  # in place, in bf16: a huge pool needs no float32 copy
        storage.normal_(0.0, 1e4, generator=torch.Generator(device=storage.device).manual_seed(seed))
    else:
        raise ValueError(f"unknown pool_fill={fill!r}; expected one of {POOL_FILLS}")


# ---- the builder ----------------------------------------------------------------------------


BuildObserver = Callable[[DecodeCase, DecodeInputs], None]
_build_observers: list[BuildObserver] = []


def add_build_observer(observer: BuildObserver) -> None:
    """Call ``observer(case, inputs)`` after every ``build`` (the plugin's case recorder and run report)."""
    if observer not in _build_observers:
        _build_observers.append(observer)


def remove_build_observer(observer: BuildObserver) -> None:
    """Stop calling ``observer`` (the plugin, at the end of its run)."""
    if observer in _build_observers:
        _build_observers.remove(observer)


def build(case: DecodeCase, device: torch.device | str = "cpu", *, observe: bool = True) -> DecodeInputs:
    """Deterministically build the kernel arguments a case describes, on ``device``.

    Page ids come from a CPU generator, so the layout is the same everywhere; q and
    the referenced K/V rows are drawn by a generator on ``device`` (drawing them on
    the CPU and copying cost most of a GPU example's time), so a descriptor rebuilds
    bit-identical tensors on the same kind of device; case files carry the tensors
    themselves across devices. The pool is allocated and filled with junk on
    ``device``, so a pool of millions of pages costs one fill there. Observers
    (``add_build_observer``) see the result unless ``observe`` is False.
    """
    if case.values not in VALUE_REGIMES:
        raise ValueError(f"unknown values={case.values!r}; expected one of {tuple(VALUE_REGIMES)}")
    device = torch.device(device)
    gen = torch.Generator().manual_seed(case.seed)
    indices, pool_size = page_ids(case, gen)
    referenced = torch.unique(indices)
    values_gen = torch.Generator(device=device).manual_seed(case.seed)
    q, k_rows, v_rows = VALUE_REGIMES[case.values](values_gen, case.batch, referenced.numel())
    k_cache, v_cache, storages = _kv_pool(case.kv_layout, pool_size, device)
    for offset, storage in enumerate(storages):
        _fill_junk(storage, case.pool_fill, case.seed + offset)
    slots = referenced.to(device)
    k_cache[slots, 0] = k_rows.to(torch.bfloat16)
    v_cache[slots, 0] = v_rows.to(torch.bfloat16)
    indptr = torch.tensor([0, *torch.tensor(case.lengths, dtype=torch.int64).cumsum(0).tolist()])
    junk_page = max(pool_size - 1, 0)  # in range, so a kernel that ignores the strides reads a wrong page, not memory
    inputs = DecodeInputs(
        q=_place_q(q.to(torch.bfloat16), case.q_layout),
        k_cache=k_cache,
        v_cache=v_cache,
        kv_indptr=_place_index(indptr, case.index_layout, int(indptr[-1]), device),
        kv_indices=_place_index(indices, case.index_layout, junk_page, device),
        sm_scale=case.scale,
    )
    for observer in _build_observers if observe else ():
        observer(case, inputs)
    return inputs
