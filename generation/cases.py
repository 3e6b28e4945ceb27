"""Decode cases: a small frozen descriptor, and one deterministic builder of tensors from it.

Hypothesis draws descriptors (sizes, page layout, value regime, a seed), never
tensors, so generation is fast, database entries are small and a shrunk
counterexample reads as one line. ``build`` turns a descriptor into kernel
arguments on any device, bit for bit the same tensors on every device: values are
integer hashes of (seed, counter) computed on the device and turned into floats by
exact steps, so a case that faulted on a GPU rebuilds on the CPU with the same inputs.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import struct
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from gqa_decode_fuzz.reference import definitions
from gqa_decode_fuzz.reference.transfer import to_device

from .stages import stage

Definition = definitions.Definition

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
    definition: the name of the contract's definition (``reference.definitions``); None: the active one
        (``active_definition``), as in explicit examples written for any definition.
    given_pages: page ids as given (a benchmark workload's kv_indices, ``properties/workloads.py``), one per
        page, used with ``page_layout="given"``: the pool then holds ``max(given_pages) + 1 + spare_pages`` pages.

    ``lengths`` count tokens; with pages of several tokens a sequence of n tokens owns ceil(n / page_size)
    pages and its last page holds the rest (``kv_last_page_len``), its unused slots junk.
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
    definition: str | None = None
    given_pages: tuple[int, ...] = field(default=(), repr=False)  # thousands of ids: the repr says "given"

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def shape(self) -> Definition:
        """The definition this case is built for."""
        return active_definition() if self.definition is None else definitions.by_name(self.definition)

    def choices(self) -> dict[str, str]:
        """The drawn choices by name, as the run report counts them (coverage)."""
        return {"page layout": self.page_layout, "pool fill": self.pool_fill, "values": self.values,
                "q layout": self.q_layout, "kv layout": self.kv_layout, "index layout": self.index_layout}


class DecodeInputs(NamedTuple):
    """A call's arguments in the suite's one order, whatever the definition: ``kv_last_page_len`` last, None where
    pages hold one token. The plugin hands them to the implementation in its definition's order
    (``Definition.arguments``)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    sm_scale: float | None
    kv_last_page_len: torch.Tensor | None = None

    def arguments(self) -> tuple:
        """The call in the implementation's order (``Definition.arguments``): ``kv_last_page_len`` before
        ``sm_scale`` where pages hold several tokens, absent where they hold one."""
        if self.kv_last_page_len is None:
            return tuple(self[:6])
        return (*self[:5], self.kv_last_page_len, self.sm_scale)


# ---- the active definition ------------------------------------------------------------------

_active = [definitions.SEED]


def active_definition() -> Definition:
    """The definition cases are drawn and built for now: the seed's unless ``using_definition`` says otherwise."""
    return _active[-1]


@contextlib.contextmanager
def using_definition(definition: Definition) -> Iterator[Definition]:
    """Draw and build cases for ``definition`` inside the block (the plugin wraps each test item in one)."""
    _active.append(definition)
    try:
        yield definition
    finally:
        _active.pop()


def page_counts(lengths: tuple[int, ...], page_size: int) -> list[int]:
    """Pages each sequence owns: ceil(tokens / page_size)."""
    return [-(-n // page_size) for n in lengths]


def last_page_lengths(lengths: tuple[int, ...], page_size: int) -> list[int]:
    """Tokens in each sequence's last page: 1 .. page_size, 0 for an empty sequence."""
    return [n - (-(-n // page_size) - 1) * page_size if n else 0 for n in lengths]


# ---- page ids -------------------------------------------------------------------------------


def _shared_prefix_tokens(lengths: tuple[int, ...], gen: torch.Generator) -> int:
    nonempty = [n for n in lengths if n > 0]
    if len(nonempty) < 2:
        return 0
    return int(torch.randint(1, min(nonempty) + 1, (1,), generator=gen))


def page_ids(case: DecodeCase, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """kv_indices (int64, CPU) for the case's layout, and the pool size (in pages)."""
    lengths = tuple(page_counts(case.lengths, case.shape.page_size))
    if case.page_layout == "given":
        if len(case.given_pages) != sum(lengths):
            raise ValueError(f"page_layout='given' needs one page id per page: {len(case.given_pages)} ids for "
                             f"{sum(lengths)} pages")
        given = torch.tensor(case.given_pages, dtype=torch.int64)
        return given, (int(given.max()) + 1 if given.numel() else 0) + case.spare_pages
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
#
# Every value is a function of (case seed, purpose, counter): a 32-bit integer hash computed on
# the target device in int32 arithmetic (add and multiply wrap modulo 2**32 on the CPU's vector
# and scalar units and on CUDA alike; every right shift is masked, so an arithmetic and a logical
# shift give the same bits), turned into floats by exact or single correctly rounded steps only:
# an integer below 2**24 to float32, a multiply by a float32 constant, where, compare, one add.
# No transcendental function and no reduction touches a device tensor, so the CPU and every GPU
# build the same bits. The few per-case parameters (magnitudes, one direction per KV head) come
# from the same hashes and are computed on the host in Python floats, then rounded to float32 once.

_MASK32 = 0xFFFFFFFF
_MULTIPLIERS = (0x7FEB352D, 0x5BD1E995)  # odd, below 2**31 (int32 scalars)
_COUNTERS = 1 << 32  # counters per stream; a case needs far fewer
_VALUES, _NOISE = 1, 2  # stream purposes
_CPU_CHUNK = 1 << 18  # elements per pass on the CPU, where a pass then stays in cache
_DEVICE_CHUNK = 1 << 25  # elements per pass of the junk fill on a GPU (int32 temporaries of 128 MiB)
# Four uniform 16-bit integers summed (Irwin-Hall, n = 4): mean 2 * 65535, variance 4 * (2**32 - 1) / 12.
_FOUR_FIELDS_STD = math.sqrt((2**32 - 1) / 3)
# Two summed (a triangular distribution, +-2.45 sigma): the junk noise, standard deviation 1e4.
_TWO_FIELDS_STD = math.sqrt((2**32 - 1) / 6)


def _f32(x: float) -> float:
    """``x`` rounded to float32 (nearest even): a device multiply by it is one float32 rounding everywhere."""
    return struct.unpack("f", struct.pack("f", x))[0]


_NORMAL_SCALE = _f32(1.0 / _FOUR_FIELDS_STD)
_NOISE_SCALE = _f32(1e4 / _TWO_FIELDS_STD)


def _fused():
    """The Triton versions of the hot draws (imported on first use: the CPU never needs them)."""
    from . import _fused_hashes as fused

    return fused


def _mix_int(x: int) -> int:
    """A 32-bit integer hash (two xorshift-multiply rounds) of ``x`` in [0, 2**32); a bijection."""
    x ^= x >> 16
    x = (x * _MULTIPLIERS[0]) & _MASK32
    x ^= x >> 15
    x = (x * _MULTIPLIERS[1]) & _MASK32
    return x ^ (x >> 16)


def _signed32(x: int) -> int:
    """The int32 with the bits of ``x`` mod 2**32."""
    x &= _MASK32
    return x - (1 << 32) if x >> 31 else x


_shr = torch.bitwise_right_shift  # several times faster on CPU than the ``>>`` operator


def _mix_(x: torch.Tensor) -> torch.Tensor:
    """``_mix_int`` in place on an int32 tensor (the same bits): wrapping multiplies, masked shifts."""
    x.bitwise_xor_(_shr(x, 16).bitwise_and_(0xFFFF)).mul_(_MULTIPLIERS[0])
    x.bitwise_xor_(_shr(x, 15).bitwise_and_(0x1FFFF)).mul_(_MULTIPLIERS[1])
    return x.bitwise_xor_(_shr(x, 16).bitwise_and_(0xFFFF))


def _key(*words: int) -> int:
    """A 32-bit stream key from non-negative integers (each taken as two 32-bit halves)."""
    key = 0x2545F491
    for word in words:
        key = _mix_int(key ^ (word & _MASK32))
        key = _mix_int(key ^ ((word >> 32) & _MASK32))
    return key


def _hashes(key: int, start: int, count: int, device: torch.device) -> torch.Tensor:
    """int32 [count]: the hash of counter ``key + start + i`` (mod 2**32) for each i, as int32 bits."""
    if device.type == "cuda":  # one fused launch, the same bits
        hashes = torch.empty(count, dtype=torch.int32, device=device)
        _fused().hashes(hashes, _signed32(key + start))
        return hashes
    counters = torch.arange(count, dtype=torch.int32, device=device)
    return _mix_(counters.add_(_signed32(key + start)))


def _two_fields(hashes: torch.Tensor) -> torch.Tensor:
    """The two 16-bit halves of each hash summed: integers in [0, 131070]."""
    return (hashes & 0xFFFF).add_(_shr(hashes, 16).bitwise_and_(0xFFFF))


def _four_fields(key: int, start: int, count: int, device: torch.device, a: int = 0, n: int | None = None
                 ) -> torch.Tensor:
    """Elements ``a .. a + n`` (default: all) of a draw of ``count``: element i is the four 16-bit halves of
    hashes ``start + i`` and ``start + count + i`` summed, centred: integers in [-131070, 131070]."""
    n = count - a if n is None else n
    if n == count:  # the whole draw: both counter ranges in one pass (CUDA draws go to _fused_hashes instead)
        first, second = _two_fields(_hashes(key, start, 2 * count, device)).view(2, count)
    else:  # a CPU chunk: the same two counter ranges, cut to it
        first, second = (_two_fields(_hashes(key, start + offset + a, n, device)) for offset in (0, count))
    return first.add_(second).sub_(2 * 0xFFFF)


class _Stream:
    """Counter-based random numbers for one case: every draw takes the next counters of one key.

    The values depend on the key and the order of draws only, never on the device or on
    how a draw is cut into passes (the CPU works in cache-sized chunks, a GPU in one pass).
    """

    def __init__(self, key: int, device: torch.device, definition: Definition) -> None:
        self.key, self.device, self.definition, self.used = key, device, definition, 0

    def _take(self, count: int) -> int:
        start, self.used = self.used, self.used + count
        if self.used > _COUNTERS:
            raise ValueError(f"a case needs {self.used} random counters, more than {_COUNTERS}")
        return start

    def normals(self, *shapes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """float32 tensors of ``shapes`` on the device, about standard normal (Irwin-Hall n = 4, within +-3.47).

        Element i of a draw of n is the centred sum of the 16-bit halves of hashes
        ``start + i`` and ``start + n + i``, times a float32 constant: exact until that one
        rounding. All shapes are drawn in one pass (one set of launches on a GPU).
        """
        sizes = [math.prod(shape) for shape in shapes]
        count = sum(sizes)
        start = self._take(2 * count)
        flat = torch.empty(count, dtype=torch.float32, device=self.device)
        if self.device.type == "cuda":  # one fused launch, the same bits (tests/test_builder.py)
            _fused().normals(flat, _signed32(self.key + start), _NORMAL_SCALE)
            return tuple(piece.view(shape) for piece, shape in zip(flat.split(sizes), shapes))
        step = _CPU_CHUNK if self.device.type == "cpu" else max(count, 1)
        for a in range(0, count, step):
            n = min(step, count - a)
            ints = _four_fields(self.key, start, count, self.device, a, n)
            flat[a:a + n].copy_(ints).mul_(_NORMAL_SCALE)  # int -> float32 exact (|ints| < 2**24), one rounding
        return tuple(piece.view(shape) for piece, shape in zip(flat.split(sizes), shapes))

    def normal(self, *shape: int) -> torch.Tensor:
        return self.normals(shape)[0]

    def below(self, probability: float, *shape: int) -> torch.Tensor:
        """A bool tensor, each element True with ``probability`` (an integer compare of one hash)."""
        count = math.prod(shape)
        threshold = min(max(round(probability * 2**24), 0), 2**24)  # against the top 24 bits
        hashes = _hashes(self.key, self._take(count), count, self.device)
        return (_shr(hashes, 8).bitwise_and_(0xFFFFFF) < threshold).view(shape)

    def uniform(self, low: float, high: float) -> float:
        """A host float in [low, high)."""
        return low + (high - low) * (_mix_int((self.key + self._take(1)) & _MASK32) / 2**32)

    def directions(self, rows: int) -> list[list[float]]:
        """``rows`` random unit vectors of head-dim host floats (exactly rounded sums: the same on every host)."""
        dim = self.definition.head_dim
        count = rows * dim
        start = self._take(2 * count)
        flat = [x / _FOUR_FIELDS_STD for x in _four_fields(self.key, start, count, torch.device("cpu")).tolist()]
        vectors = [flat[r * dim:(r + 1) * dim] for r in range(rows)]
        norms = [math.sqrt(math.fsum(y * y for y in v)) for v in vectors]
        return [[x / norm for x in v] for v, norm in zip(vectors, norms)]

    def constant(self, rows: list[list[float]], scale: float = 1.0) -> torch.Tensor:
        """``scale * rows`` as float32 on the device (computed on the host in float64, rounded once)."""
        return to_device(torch.tensor([[scale * x for x in row] for row in rows], dtype=torch.float32), self.device)


Regime = Callable[[_Stream, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _regime_normal(draw, batch, rows):
    d = draw.definition
    query, kv = (batch, d.num_qo_heads, d.head_dim), (rows, d.num_kv_heads, d.head_dim)
    return draw.normals(query, kv, kv)


def _regime_wide(draw, batch, rows):
    """Each tensor at its own magnitude, 1e-3 .. 1e3."""
    q, k, v = _regime_normal(draw, batch, rows)
    return tuple(t * _f32(10.0 ** draw.uniform(-3.0, 3.0)) for t in (q, k, v))


def _regime_large_logits(draw, batch, rows):
    """Logits of typical magnitude 1e2 .. 1.6e3 at the default scale (q and k each scaled 10 .. 40x): softmax
    nearly one-hot."""
    q, k, v = _regime_normal(draw, batch, rows)
    return q * _f32(draw.uniform(10.0, 40.0)), k * _f32(draw.uniform(10.0, 40.0)), v


def _regime_very_negative(draw, batch, rows):
    """Logits near -800 at the default scale (below a -5e4 sentinel from scale 8 up), still spread out."""
    direction = draw.directions(1)
    q_noise, k_noise, v = _regime_normal(draw, batch, rows)
    k = draw.constant(direction, 30.0)[0] + 0.5 * k_noise
    q = draw.constant(direction, -300.0)[0] + 0.5 * q_noise
    return q, k, v


def _regime_peaky(draw, batch, rows):
    """A few keys (about 1 in 50) carry most of the weight."""
    q, k, v = _regime_normal(draw, batch, rows)
    loud = draw.below(0.02, rows, 1, 1)
    return q, torch.where(loud, 8.0 * k, k), v


def _regime_constant_keys(draw, batch, rows):
    """All keys equal: exact ties, uniform weights."""
    d = draw.definition
    q, v, k = draw.normals((batch, d.num_qo_heads, d.head_dim), (rows, d.num_kv_heads, d.head_dim),
                           (1, d.num_kv_heads, d.head_dim))
    return q, k.expand(rows, -1, -1), v


# Spike magnitudes, log-uniform over 1 .. 1e3: a table indexed by 10 hash bits (a gather, exact).
_SPIKES = [_f32(10.0 ** (3.0 * (j + 0.5) / 1024)) for j in range(1024)]
_SPIKE_THRESHOLD = round(1e-3 * 2**22)  # against the top 22 bits of a hash: probability 1e-3


def _regime_outliers(draw, batch, rows):
    """Standard normal with rare entries (0.1%) of magnitude up to 1e3."""
    q, k, v = _regime_normal(draw, batch, rows)
    table = to_device(torch.tensor(_SPIKES, dtype=torch.float32), draw.device)

    def spike(t):
        hashes = _hashes(draw.key, draw._take(t.numel()), t.numel(), draw.device).view(t.shape)
        rare = _shr(hashes, 10).bitwise_and_(0x3FFFFF) < _SPIKE_THRESHOLD
        return torch.where(rare, torch.sign(t) * table[hashes & 1023], t)

    return spike(q), spike(k), spike(v)


def _regime_offset_values(draw, batch, rows):
    """V rows near a large common offset: the output needs well-normalised weights."""
    q, k, v = _regime_normal(draw, batch, rows)
    return q, k, v * _f32(0.1) + 100.0


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


def _along(draw: _Stream, direction: list[list[float]], norm: float, noise: torch.Tensor) -> torch.Tensor:
    """``norm`` times each row's KV-head direction, plus ``noise`` [n, heads, 128] (query or KV heads)."""
    heads = noise.shape[1]
    return draw.constant(direction, norm).repeat_interleave(heads // draw.definition.num_kv_heads, dim=0) + noise


def _regime_huge_logits(draw, batch, rows):
    """Logits of magnitude 1e4 .. 1e6 at the default scale, either sign: one-hot softmax."""
    kv_heads = draw.definition.num_kv_heads
    direction, norm = draw.directions(kv_heads), 10.0 ** draw.uniform(2.5, 3.5)
    sign = torch.where(draw.below(0.5, rows, kv_heads, 1), -1.0, 1.0)
    q_noise, k_noise, v = _regime_normal(draw, batch, rows)
    return _along(draw, direction, norm, q_noise), sign * _along(draw, direction, norm, k_noise), v


def _regime_beyond_sentinel(draw, batch, rows):
    """Every logit about -1e4 .. -1e6 at the default scale: below the -5e4 mask sentinel kernels have used."""
    direction = draw.directions(draw.definition.num_kv_heads)
    q_norm, k_norm = -draw.uniform(300.0, 3000.0), draw.uniform(300.0, 3000.0)
    q_noise, k_noise, v = _regime_normal(draw, batch, rows)
    return _along(draw, direction, q_norm, q_noise), _along(draw, direction, k_norm, k_noise), v


def _regime_dominant_token(draw, batch, rows):
    """About one key per sequence lies along its queries, 10 .. 1e4 logits (default scale) above the rest."""
    direction = draw.directions(draw.definition.num_kv_heads)
    q_noise, k, v = _regime_normal(draw, batch, rows)
    loud = draw.below(batch / max(rows, 1), rows, 1, 1)
    gap = 10.0 ** draw.uniform(1.0, 4.0) / (10.0 * draw.definition.default_sm_scale)
    return _along(draw, direction, 10.0, q_noise), torch.where(loud, draw.constant(direction, gap), k), v


def _regime_exact_ties(draw, batch, rows):
    """A third of the keys are one loud key, bit for bit: tied top logits, output the mean of their V."""
    q, k, v = _regime_normal(draw, batch, rows)
    tied = draw.below(1.0 / 3.0, rows, 1, 1)
    loud = 4.0 * draw.normal(1, draw.definition.num_kv_heads, draw.definition.head_dim)
    return q, torch.where(tied, loud, k), v


VALUE_REGIMES.update({
    "huge_logits": _regime_huge_logits,
    "beyond_sentinel": _regime_beyond_sentinel,
    "dominant_token": _regime_dominant_token,
    "exact_ties": _regime_exact_ties,
})
HOSTILE_REGIMES = tuple(name for name in VALUE_REGIMES if name not in ("normal", "offset_values", "outliers"))


# ---- memory layouts -------------------------------------------------------------------------

PoolViews = tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]  # K view, V view, storages


def _kv_pool(layout: str, size: int, device: torch.device, definition: Definition) -> PoolViews:
    """Uninitialised K and V pools [size, page size, KV heads, head dim] laid out as ``layout``, and the storages
    behind them."""
    page, heads, dim = definition.page_size, definition.num_kv_heads, definition.head_dim
    empty = lambda *shape: torch.empty(shape, dtype=torch.bfloat16, device=device)  # noqa: E731
    if layout == "separate":
        k, v = empty(size, page, heads, dim), empty(size, page, heads, dim)
        return k, v, (k, v)
    if layout == "padded_dim":  # K's head dim padded by half (192 of 128; junk in the padding), V plain
        k, v = empty(size, page, heads, dim + dim // 2), empty(size, page, heads, dim)
        return k[..., :dim], v, (k, v)
    if layout == "combined":  # one buffer, K and V of a page side by side: [P, 2, page, heads, dim]
        kv = empty(size, 2, page, heads, dim)
        return kv[:, 0], kv[:, 1], (kv,)
    if layout == "planes":  # one buffer, a K plane then a V plane: [2, P, page, heads, dim]
        kv = empty(2, size, page, heads, dim)
        return kv[0], kv[1], (kv,)
    if layout == "heads_outer":  # [heads, P, page, dim] storage: the head stride is P * page * dim
        k, v = empty(heads, size, page, dim), empty(heads, size, page, dim)
        return k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3), (k, v)
    if layout == "dim_outer":  # [dim, P, page, heads] storage: the last dimension's stride is P * page * heads
        k, v = empty(dim, size, page, heads), empty(dim, size, page, heads)
        return k.permute(1, 2, 3, 0), v.permute(1, 2, 3, 0), (k, v)
    if layout == "mixed":  # K plain, V heads-outer
        k, v = empty(size, page, heads, dim), empty(heads, size, page, dim)
        return k, v.permute(1, 2, 0, 3), (k, v)
    raise ValueError(f"unknown kv_layout={layout!r}; expected one of {KV_LAYOUTS}")


def _place_q(q: torch.Tensor, layout: str, kv_heads: int) -> torch.Tensor:
    """q [B, heads, dim] as a view with ``layout``'s strides; storage outside the view holds NaN."""
    batch, heads, dim = q.shape
    if layout == "contiguous":
        return q.contiguous()
    if layout == "fused_qkv":  # q heads, then the K and V heads of the same token: batch stride (heads + 2 kv) dim
        qkv = torch.full((batch, heads + 2 * kv_heads, dim), math.nan, dtype=q.dtype, device=q.device)
        qkv[:, :heads] = q
        return qkv[:, :heads]
    if layout == "strided_dim":  # every other element of a [B, heads, 2 dim] buffer: last-dimension stride 2
        wide = torch.full((batch, heads, 2 * dim), math.nan, dtype=q.dtype, device=q.device)
        wide[..., ::2] = q
        return wide[..., ::2]
    if layout == "heads_outer":  # [heads, B, dim] storage
        return q.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "dim_outer":  # [B, dim, heads] storage: last-dimension stride heads, dense
        return q.transpose(1, 2).contiguous().transpose(1, 2)
    raise ValueError(f"unknown q_layout={layout!r}; expected one of {Q_LAYOUTS}")


def place_index(values: torch.Tensor, layout: str, gap: int, device: torch.device) -> torch.Tensor:
    """An index tensor in ``layout``'s dtype, strided ones as every other element with ``gap`` between."""
    if layout not in INDEX_LAYOUTS:
        raise ValueError(f"unknown index_layout={layout!r}; expected one of {INDEX_LAYOUTS}")
    dtype = torch.int64 if layout.startswith("int64") else torch.int32
    if not layout.endswith("_strided"):
        return to_device(values.to(dtype), device)
    spaced = torch.full((2 * values.numel(),), gap, dtype=dtype)
    spaced[::2] = values
    return to_device(spaced, device)[::2]


def _fill_noise(storage: torch.Tensor, key: int) -> None:
    """Noise of standard deviation 1e4 (triangular, one hash per element), written chunk by chunk into bf16.

    Counters wrap at 2**32 elements (a pool of 8M pages repeats its noise once): junk needs no more.
    """
    flat = storage.view(-1)  # a fresh, contiguous allocation
    step = _CPU_CHUNK if storage.device.type == "cpu" else _DEVICE_CHUNK
    for a in range(0, flat.numel(), step):
        n = min(step, flat.numel() - a)
        if storage.device.type == "cuda":  # one fused launch per pass, the same bits
            _fused().fill_noise(flat[a:a + n], _signed32(key + a), _NOISE_SCALE)
            continue
        hashes = _hashes(key, a, n, storage.device)
        ints = _two_fields(hashes).sub_(0xFFFF)  # exact, |ints| < 2**16
        flat[a:a + n] = ints.float().mul_(_NOISE_SCALE)  # one float32 rounding, then bf16's (nearest even)


def _fill_junk(storage: torch.Tensor, fill: str, seed: int) -> None:
    if fill == "nan":
        storage.fill_(math.nan)
    elif fill == "inf":
        storage.fill_(math.inf)
    elif fill == "noise":  # hashed in chunks straight into bf16: a huge pool needs no float32 copy
        _fill_noise(storage, _key(seed, _NOISE))
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


ClaimObserver = Callable[[DecodeCase, dict, str], None]
_claim_observers: list[ClaimObserver] = []


def add_claim_observer(observer: ClaimObserver) -> None:
    """Call ``observer(case, draws, claim)`` at the start of every claim (``claims``; the plugin's case recorder,
    and its check that a test calls the claim it declares); ``claim`` is the claim's reference (``module:name``)."""
    if observer not in _claim_observers:
        _claim_observers.append(observer)


def remove_claim_observer(observer: ClaimObserver) -> None:
    """Stop calling ``observer`` (the plugin, at the end of its run)."""
    if observer in _claim_observers:
        _claim_observers.remove(observer)


def note_claim(case: DecodeCase, draws: dict, claim: str) -> None:
    """The claim ``claim`` (its reference) starts on ``case`` with the test's other ``draws``: tell the claim
    observers (not inside ``unobserved``)."""
    for observer in list(_claim_observers) if observing() else ():
        observer(case, draws, claim)


_silenced = 0  # unobserved() blocks open


@contextlib.contextmanager
def unobserved() -> Iterator[None]:
    """Builds and claims inside tell no observer: the root-cause probes are not examples of the run."""
    global _silenced
    _silenced += 1
    try:
        yield
    finally:
        _silenced -= 1


def observing() -> bool:
    """Whether builds and claims tell their observers now (not inside ``unobserved``)."""
    return _silenced == 0


class SuiteOutOfMemory(BaseException):  # noqa: N818 - reads as what happened
    """The suite could not allocate a case's inputs or its oracle: a limit of the machine, not a kernel's defect.

    A BaseException, so Hypothesis neither shrinks nor retries it; the plugin reports the
    test as an infrastructure error, not as a failed property.
    """


# Out of memory in words other than torch's allocator's: CUDA's driver error where Triton loads a kernel on a full
# GPU (seen: 12 workers on an 80 GB H100, the own kernel's first launch of a layout, docs/gpu.md section 39) or
# torch makes a handle, and the CPU allocator's.
_OUT_OF_MEMORY_WORDS = ("Triton Error [CUDA]: out of memory", "CUDA error: out of memory", "can't allocate memory")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is running out of memory: torch's error (raised in this process, or in an isolated child,
    whose errors the parent raises as their nearest built-in class, the message led by the original's name), the
    CUDA driver's (``_OUT_OF_MEMORY_WORDS``), or the CPU allocator's failure."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    message = str(error)
    return isinstance(error, RuntimeError) and (
        message.startswith("torch.OutOfMemoryError") or any(words in message for words in _OUT_OF_MEMORY_WORDS))


def build(case: DecodeCase, device: torch.device | str = "cpu", *, observe: bool = True) -> DecodeInputs:
    """Deterministically build the kernel arguments a case describes, on ``device``.

    Page ids come from a CPU generator, so the layout is the same everywhere; q, the
    referenced K/V rows and noise junk are counter-based hashes computed on ``device``
    with exact integer steps and exactly rounded conversions (see ``_Stream``), so a
    descriptor rebuilds bit-identical tensors on the CPU and on any GPU, without
    drawing on the CPU and copying. The pool is allocated and filled with junk on
    ``device``, so a pool of millions of pages costs one fill there. Observers
    (``add_build_observer``) see the result unless ``observe`` is False.

    Raises ``SuiteOutOfMemory`` when ``device`` cannot hold the case.
    """
    return built_and_observed(_build, case, device, observe=observe)


@contextlib.contextmanager
def suite_allocating(what: Callable[[], str]) -> Iterator[None]:
    """The suite's own work on a case (its inputs, its oracle and bound): running out of memory in it raises
    ``SuiteOutOfMemory`` naming ``what()`` (worded only then), so that a machine's limit never reads as the
    kernel's failure."""
    try:
        yield
    except (RuntimeError, MemoryError) as error:
        if not (is_out_of_memory(error) or isinstance(error, MemoryError)):
            raise
        raise SuiteOutOfMemory(f"the suite could not allocate {what()}: {error}") from error


def built_and_observed(builder: Callable, case, device: torch.device | str, *, observe: bool = True):
    """``builder(case, device)`` timed as the build stage, an allocation failure raised as ``SuiteOutOfMemory``,
    the result told to the build observers unless ``observe`` is False: every op type's builder goes through it."""
    with suite_allocating(lambda: f"the inputs of {case} on {device}"), stage("build"):
        inputs = builder(case, torch.device(device))
    for observer in _build_observers if observe and observing() else ():
        observer(case, inputs)
    return inputs


def _token_slots(indices: torch.Tensor, lengths: tuple[int, ...], page_size: int) -> torch.Tensor:
    """Every token's slot in the pool, ``page * page_size + slot``, in sequence and token order (CPU, int64)."""
    if page_size == 1:
        return indices
    if not sum(lengths):
        return indices
    pages = page_counts(lengths, page_size)
    token = torch.cat([torch.arange(n) for n in lengths])
    first_page = torch.tensor([0, *itertools.accumulate(pages)][:-1]).repeat_interleave(torch.tensor(lengths))
    return indices[first_page + token // page_size] * page_size + token % page_size


def value_rows(values: str, seed: int, device: torch.device, definition: Definition, query_rows: int,
               key_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [query_rows, H, D], K and V [key_rows, H_kv, D] (float32, on ``device``) in the value regime ``values``,
    from the case's seed: the same bits on every device."""
    if values not in VALUE_REGIMES:
        raise ValueError(f"unknown values={values!r}; expected one of {tuple(VALUE_REGIMES)}")
    return VALUE_REGIMES[values](_Stream(_key(seed, _VALUES), device, definition), query_rows, key_rows)


def filled_pool(case: DecodeCase, device: torch.device, query_rows: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The case's keys in their page pool: q (float32, ``query_rows`` rows), the K and V pools laid out as
    ``case.kv_layout`` with the referenced slots written and junk elsewhere, kv_indices (CPU int64) and the pool's
    size in pages. Shared by decode (a query row per sequence) and paged prefill (``case.lengths`` its keys)."""
    definition = case.shape
    page_size = definition.page_size
    gen = torch.Generator().manual_seed(case.seed)
    indices, pool_size = page_ids(case, gen)
    referenced = torch.unique(_token_slots(indices, case.lengths, page_size))
    q, k_rows, v_rows = value_rows(case.values, case.seed, device, definition, query_rows, referenced.numel())
    k_cache, v_cache, storages = _kv_pool(case.kv_layout, pool_size, device, definition)
    for offset, storage in enumerate(storages):
        _fill_junk(storage, case.pool_fill, case.seed + offset)
    slots = to_device(referenced, device)
    pages, within = (slots, 0) if page_size == 1 else (slots // page_size, slots % page_size)
    k_cache[pages, within] = k_rows.to(torch.bfloat16)
    v_cache[pages, within] = v_rows.to(torch.bfloat16)
    return q, k_cache, v_cache, indices, pool_size


def page_index_tensors(case: DecodeCase, indices: torch.Tensor, pool_size: int, device: torch.device
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """kv_indptr, kv_indices and (pages of several tokens) kv_last_page_len of the case's keys on ``device``, in
    ``case.index_layout``; the builder remembers the host values of kv_indptr and kv_last_page_len (``host_values``)."""
    page_size = case.shape.page_size
    bounds = [0, *itertools.accumulate(page_counts(case.lengths, page_size))]
    junk_page = max(pool_size - 1, 0)  # in range, so a kernel that ignores the strides reads a wrong page, not memory
    kv_indptr = place_index(torch.tensor(bounds, dtype=torch.int64), case.index_layout, bounds[-1], device)
    remember_on_host(kv_indptr, bounds)
    last_page_len = None
    if case.shape.paged:
        lasts = last_page_lengths(case.lengths, page_size)
        last_page_len = place_index(torch.tensor(lasts, dtype=torch.int64), case.index_layout, page_size, device)
        remember_on_host(last_page_len, lasts)
    return kv_indptr, place_index(indices, case.index_layout, junk_page, device), last_page_len


def place_q(q: torch.Tensor, case: DecodeCase) -> torch.Tensor:
    """q (float32 rows) in bfloat16, laid out as ``case.q_layout``."""
    return _place_q(q.to(torch.bfloat16), case.q_layout, case.shape.num_kv_heads)


def _build(case: DecodeCase, device: torch.device) -> DecodeInputs:
    q, k_cache, v_cache, indices, pool_size = filled_pool(case, device, case.batch)
    kv_indptr, kv_indices, last_page_len = page_index_tensors(case, indices, pool_size, device)
    return DecodeInputs(
        q=place_q(q, case),
        k_cache=k_cache,
        v_cache=v_cache,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        sm_scale=case.scale,
        kv_last_page_len=last_page_len,
    )


# The index tensors the builder made, by id: (the tensor, weakly; its version counter then; its values).
_host_values: dict[int, tuple[weakref.ref, int, list[int]]] = {}


def remember_on_host(tensor: torch.Tensor, values: list[int]) -> None:
    """Keep ``values``, what the builder just put in the index tensor ``tensor``, for ``host_values``."""
    key = id(tensor)
    forget = lambda _: _host_values.pop(key, None)  # noqa: E731 - runs when the tensor is freed
    _host_values[key] = (weakref.ref(tensor, forget), tensor._version, values)


def host_values(tensor: torch.Tensor | None) -> list[int] | None:
    """The values of ``tensor`` (a ``kv_indptr`` or ``kv_last_page_len``) as a host list when the builder made this
    very tensor and nothing has written to it since (its version counter), else None: the oracle then needs no
    read-back from the device."""
    if tensor is None:
        return None
    ref, version, values = _host_values.get(id(tensor), (None, None, None))
    return values if ref is not None and ref() is tensor and tensor._version == version else None
