"""The case builder: deterministic, device-independent values, and each value regime as its docstring says."""

import itertools
import math
import random

import pytest
import torch

from gqa_decode_fuzz.generation import cases
from gqa_decode_fuzz.generation.cases import (
    KV_LAYOUTS,
    POOL_FILLS,
    Q_LAYOUTS,
    VALUE_REGIMES,
    DecodeCase,
    build,
)
from gqa_decode_fuzz.reference.definitions import SEED
from tests.fused_kernels import fused_device


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the storage behind ``t`` (padding and gaps included), on the CPU."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).cpu()


def _same_bits(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
                and a.storage_offset() == b.storage_offset() and torch.equal(_storage_bytes(a), _storage_bytes(b)))
    return a == b


def _logits(inputs) -> torch.Tensor:
    """[tokens, 32] float64 logits at the default scale, one row per (sequence, token)."""
    rows = []
    for seq in range(inputs.q.shape[0]):
        pages = inputs.kv_indices[int(inputs.kv_indptr[seq]):int(inputs.kv_indptr[seq + 1])].long()
        keys = inputs.k_cache[pages, 0].double().repeat_interleave(SEED.group, dim=1)  # [n, 32, 128]
        rows.append(SEED.default_sm_scale * (keys * inputs.q[seq].double()).sum(-1))
    return torch.cat(rows)


def test_hash_matches_its_python_definition_including_wraparound():
    values = [0, 1, 2, 0xFFFF, 0x10000, 2**31 - 1, 2**31, 2**32 - 1, 123456789, 3_000_000_000]
    values += random.Random(0).sample(range(2**32), 200)
    tensor = torch.tensor([cases._signed32(v) for v in values], dtype=torch.int32)
    got = [h & 0xFFFFFFFF for h in cases._mix_(tensor).tolist()]
    assert got == [cases._mix_int(v) for v in values]


@pytest.mark.parametrize("values", VALUE_REGIMES)
def test_build_is_deterministic(values):
    case = DecodeCase(lengths=(37, 0, 90), spare_pages=20, pool_fill="noise", values=values, seed=11)
    first, second = build(case, observe=False), build(case, observe=False)
    assert all(_same_bits(a, b) for a, b in zip(first, second))


def test_cpu_chunking_does_not_change_values(monkeypatch):
    case = DecodeCase(lengths=(300, 211), spare_pages=300, pool_fill="noise", values="outliers", seed=5)
    whole = build(case, observe=False)
    monkeypatch.setattr(cases, "_CPU_CHUNK", 1000)  # many passes, with ragged ends
    assert all(_same_bits(a, b) for a, b in zip(whole, build(case, observe=False)))


def test_pool_fill_and_seed_change_only_what_they_should():
    case = DecodeCase(lengths=(50, 7), spare_pages=30, pool_fill="noise", seed=3)
    other_fill = build(DecodeCase(**{**case.__dict__, "pool_fill": "nan"}), observe=False)
    inputs = build(case, observe=False)
    pages = inputs.kv_indices.long()
    assert torch.equal(inputs.q, other_fill.q) and torch.equal(inputs.k_cache[pages], other_fill.k_cache[pages])
    other_seed = build(DecodeCase(**{**case.__dict__, "seed": 4}), observe=False)
    assert not torch.equal(inputs.q, other_seed.q)


@pytest.mark.parametrize("index_layout", ["int32", "int64_strided"])
def test_host_values_is_known_only_for_the_builders_unchanged_tensor(index_layout):
    """The oracle may skip reading kv_indptr back only while it holds exactly what the builder put there."""
    inputs = build(DecodeCase(lengths=(5, 0, 9), index_layout=index_layout), observe=False)
    indptr = inputs.kv_indptr
    assert cases.host_values(indptr) == [0, 5, 5, 14] == indptr.tolist()
    assert cases.host_values(indptr.clone()) is None  # equal values, another tensor: read it back
    (indptr._base if indptr._base is not None else indptr).add_(0)  # written in place (a view's base too)
    assert cases.host_values(indptr) is None
    remembered = len(cases._host_values)
    del inputs, indptr
    assert len(cases._host_values) == remembered - 1  # forgotten with the tensor


def test_normal_values_have_standard_moments():
    stream = cases._Stream(cases._key(1, 1), torch.device("cpu"), cases.definitions.SEED)
    q, k, v = VALUE_REGIMES["normal"](stream, 16, 4096)
    for t in (q, k, v):
        x = t.double().flatten()
        assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01
        kurtosis = float(((x - x.mean()) ** 4).mean() / x.var() ** 2)
        assert 2.6 < kurtosis < 2.8  # Irwin-Hall of four: 2.7 (normal: 3)
        assert float(x.abs().max()) <= math.sqrt(12) + 1e-3
    correlation = torch.corrcoef(torch.stack([k.flatten()[:-1], k.flatten()[1:]]).double())[0, 1]
    assert abs(float(correlation)) < 0.01  # neighbouring counters are independent


def test_junk_noise_has_standard_deviation_1e4():
    storage = torch.empty(300_000, dtype=torch.bfloat16)
    cases._fill_junk(storage, "noise", 9)
    x = storage.double()
    assert bool(torch.isfinite(x).all()) and abs(float(x.mean())) < 100 and abs(float(x.std()) - 1e4) < 200


def _regime_case(values: str, seed: int) -> DecodeCase:
    return DecodeCase(lengths=(200, 150, 120), values=values, seed=seed)


@pytest.mark.parametrize("seed", range(4))
def test_regime_statistics_match_their_docstrings(seed):
    def built(values):
        return build(_regime_case(values, seed), observe=False)

    def rows(inputs, which="k_cache"):
        return getattr(inputs, which)[torch.unique(inputs.kv_indices.long()), 0].double()

    wide = built("wide")
    for t in (wide.q.double(), rows(wide), rows(wide, "v_cache")):
        assert 1e-3 * 0.5 < float(t.std()) < 1e3 * 2

    logits = _logits(built("large_logits")).abs()  # typical logits 1e2 .. 1.6e3: q and k scaled by 10 .. 40 each
    assert 50 < float(logits.median()) < 2e4 and float(logits.max()) > 500

    very_negative = _logits(built("very_negative"))
    assert -1000 < float(very_negative.mean()) < -600 and float(very_negative.std()) > 1

    k = rows(built("peaky"))
    loud = k.abs().amax(dim=(1, 2)) > 3.47 + 1e-2  # only a loud key can pass Irwin-Hall's maximum
    assert float(loud.double().mean()) < 0.08

    assert torch.unique(rows(built("constant_keys")), dim=0).shape[0] == 1

    outliers = built("outliers")
    spikes = torch.cat([outliers.q.double().flatten(), rows(outliers).flatten(), rows(outliers, "v_cache").flatten()])
    share = float((spikes.abs() > 3.47 + 1e-2).double().mean())
    assert 2e-4 < share < 3e-3 and float(spikes.abs().max()) < 1.01e3

    offset = rows(built("offset_values"), "v_cache")
    assert abs(float(offset.mean()) - 100) < 0.1 and float(offset.std()) < 0.2

    huge = _logits(built("huge_logits")).abs()
    assert float(huge.min()) > 1e3 and 1e4 < float(huge.median()) < 1e6 * 1.5

    beyond = _logits(built("beyond_sentinel"))
    assert float(beyond.max()) < -5e4 / 10 and -1.5e6 < float(beyond.min()) and float(beyond.median()) < -5e3

    dominant = built("dominant_token")
    assert float(_logits(dominant).max()) > 5
    assert torch.unique(rows(built("exact_ties")), dim=0).shape[0] < 0.9 * 470


def _descriptors():
    """Every regime, KV layout, q layout and pool fill, in varied sizes and seeds."""
    rng = random.Random(2024)
    combos = itertools.product(VALUE_REGIMES, KV_LAYOUTS, POOL_FILLS)
    for number, (values, kv_layout, pool_fill) in enumerate(combos):
        lengths = tuple(rng.choice([0, 1, rng.randint(2, 64), rng.randint(100, 700)]) for _ in range(rng.randint(1, 6)))
        yield DecodeCase(
            lengths=lengths, spare_pages=rng.randint(0, 400), pool_fill=pool_fill, values=values,
            seed=rng.randint(0, 2**32 - 1), kv_layout=kv_layout, q_layout=Q_LAYOUTS[number % len(Q_LAYOUTS)],
            page_layout=("shuffled", "contiguous", "shared_prefix", "pool_end")[number % 4],
            index_layout=("int32", "int64", "int32_strided", "int64_strided")[number % 4],
            scale=None if number % 3 else 0.5,
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_build_bit_identical_inputs():
    mismatched = []
    for case in _descriptors():
        on_cpu, on_cuda = build(case, "cpu", observe=False), build(case, "cuda", observe=False)
        for name, a, b in zip(on_cpu._fields, on_cpu, on_cuda):
            if not _same_bits(a, b):
                mismatched.append(f"{name} of {case}")
    assert not mismatched, f"{len(mismatched)} tensors differ, first: {mismatched[:3]}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_noise_fill_matches_cpu_across_chunks(monkeypatch):
    monkeypatch.setattr(cases, "_DEVICE_CHUNK", 100_003)  # ragged GPU passes against the CPU's
    on_cpu = torch.empty(1_000_000, dtype=torch.bfloat16)
    on_cuda = torch.empty(1_000_000, dtype=torch.bfloat16, device="cuda")
    cases._fill_junk(on_cpu, "noise", 77)
    cases._fill_junk(on_cuda, "noise", 77)
    assert torch.equal(_storage_bytes(on_cpu), _storage_bytes(on_cuda))


# (key, first counter, elements): ragged against the kernels' blocks, and counters that wrap past 2**32.
_FUSED_DRAWS = [(cases._key(3, 1), 0, 1), (cases._key(5, 1), 17, 1025), (2**32 - 700, 100, 3000),
                (cases._key(7, 2), 2**31 - 5, 2048)]


@pytest.mark.parametrize("key, start, count", _FUSED_DRAWS)
def test_fused_draws_give_the_torch_paths_bits(key, start, count):
    from gqa_decode_fuzz.generation import _fused_hashes

    device = fused_device()
    stream = cases._Stream(key, torch.device("cpu"), cases.definitions.SEED)
    stream.used = start
    expected = stream.normal(count)  # the CPU's torch path, counters start .. start + 2 count
    got = torch.empty(count, dtype=torch.float32, device=device)
    _fused_hashes.normals(got, cases._signed32(key + start), cases._NORMAL_SCALE)
    assert torch.equal(got.cpu().view(torch.int32), expected.view(torch.int32))

    got_hashes = torch.empty(count, dtype=torch.int32, device=device)
    _fused_hashes.hashes(got_hashes, cases._signed32(key + start))
    assert torch.equal(got_hashes.cpu(), cases._hashes(key, start, count, torch.device("cpu")))

    noise_key = (key + start) & 0xFFFFFFFF  # the noise fill's counters start at 0
    expected_noise = torch.empty(count, dtype=torch.bfloat16)
    cases._fill_noise(expected_noise, noise_key)
    got_noise = torch.empty(count, dtype=torch.bfloat16, device=device)
    _fused_hashes.fill_noise(got_noise, cases._signed32(noise_key), cases._NOISE_SCALE)
    assert torch.equal(got_noise.cpu().view(torch.int16), expected_noise.view(torch.int16))
