"""The graph cache's bookkeeping, with capture itself stood in for (CUDA graphs need a GPU: tests/test_oracle.py
holds the replays to the eager computation there)."""

import contextlib
import types

import pytest
import torch

from gqa_decode_fuzz.reference import graphs

GIB = 1 << 30
TOTAL = 128 * GIB  # the stand-in device's memory: POOL_SHARE of it is 4 GiB


class _Capture:
    """Stands in for ``graphs.Captured``: records each capture and adds ``size`` bytes to torch's reserve;
    ``fail`` makes capturing raise."""

    made: list = []
    fail = False
    size = 0
    reserved = 0
    emptied = 0
    free = TOTAL  # the driver's count of free memory

    def __init__(self, function, inputs, pool, *, warm_up):
        if _Capture.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        _Capture.made.append(warm_up)
        _Capture.reserved += _Capture.size
        self.inputs = inputs


@pytest.fixture
def cache(monkeypatch):
    monkeypatch.setattr(graphs, "Captured", _Capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 1))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: _Capture.reserved)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=TOTAL))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: setattr(_Capture, "emptied", _Capture.emptied + 1))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (_Capture.free, TOTAL))
    _Capture.made, _Capture.fail, _Capture.size, _Capture.reserved, _Capture.emptied = [], False, 0, 0, 0
    _Capture.free = TOTAL
    return graphs.GraphCache(lambda inputs: inputs)


def test_one_capture_per_key_and_one_warm_up_per_device(cache):
    gpu = torch.device("cuda", 0)
    first = cache.get(gpu, (4, 48), lambda: ("buffers",))
    assert cache.get(gpu, (4, 48), lambda: ("other",)) is first and first.inputs == ("buffers",)
    cache.get(gpu, (1, 16), tuple)
    cache.get(torch.device("cuda", 1), (1, 16), tuple)
    assert _Capture.made == [True, False, True] and len(cache) == 3


def test_a_failed_capture_falls_back_to_eager_once_with_a_warning(cache):
    gpu = torch.device("cuda", 0)
    _Capture.fail = True
    with pytest.warns(RuntimeWarning, match="capturing \\(4, 48\\) on cuda:0 failed, computed eagerly"):
        assert cache.get(gpu, (4, 48), tuple) is None
    _Capture.fail = False
    assert cache.get(gpu, (4, 48), tuple) is None  # remembered: no second attempt, no second warning
    assert cache.get(gpu, (1, 16), tuple) is not None and _Capture.made == [True]  # the first good one warms up


def test_a_fault_that_killed_the_context_is_raised_not_hidden(cache, monkeypatch):
    _Capture.fail = True

    def dead_context(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", dead_context)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        cache.get(torch.device("cuda", 0), (4, 48), tuple)


def test_graphs_are_for_cuda_and_can_be_turned_off(monkeypatch):
    assert not graphs.graphs_enabled(torch.device("cpu"))
    assert graphs.graphs_enabled(torch.device("cuda", 0))
    monkeypatch.setenv(graphs.ENABLED_ENV, "0")
    assert not graphs.graphs_enabled(torch.device("cuda", 0))


def test_captures_that_hold_their_share_of_the_device_are_forgotten_before_the_next(cache):
    gpu, other = torch.device("cuda", 0), torch.device("cuda", 1)
    _Capture.size = GIB
    first = cache.get(gpu, (1, 16), tuple)
    for slots in (32, 48, 64):  # four captures of 1 GiB: POOL_SHARE of TOTAL
        cache.get(gpu, (1, slots), tuple)
    cache.get(other, (1, 16), tuple)
    assert len(cache) == 5 and _Capture.emptied == 0
    cache.get(gpu, (2, 16), tuple)  # the fifth on cuda:0: its four earlier ones go first, cuda:1's stay
    assert len(cache) == 2 and _Capture.emptied == 1
    assert cache.get(gpu, (1, 16), tuple) is not first  # captured again at need
    assert _Capture.made == [True, False, False, False, True, False, False]  # no second warm-up


def test_every_cache_forgets_its_captures_when_the_gpu_runs_short(cache, monkeypatch):
    from gqa_decode_fuzz.engine import devices

    gpu = torch.device("cuda", 0)
    cache.get(gpu, (1, 16), tuple)
    _Capture.free = TOTAL // 2
    assert not devices.release_cache_if_short(gpu) and len(cache) == 1  # half free: kept
    _Capture.free = TOTAL // 8
    assert devices.release_cache_if_short(gpu) and len(cache) == 1  # short: torch's cache emptied, graphs kept
    assert devices.release_cache_if_short(gpu, wanted=True) and len(cache) == 0  # another process waits
    cache.get(gpu, (1, 16), tuple)
    _Capture.free = TOTAL // 16
    assert devices.release_cache_if_short(gpu) and len(cache) == 0  # nearly full
    _Capture.free = TOTAL // 2
    cache.get(gpu, (1, 16), tuple)
    graphs.release_all()
    assert len(cache) == 0
    cache.get(gpu, (1, 16), tuple)
    assert _Capture.made == [True, False, False, False]  # forgotten, not cold: one warm-up in all


def test_no_capture_starts_on_a_nearly_full_device_and_the_key_is_captured_once_there_is_room(cache):
    """A capture that ran out of memory mid-way aborted a worker (an H100 over the decode family): the work is
    computed eagerly while the device is nearly full, and captured at a later use."""
    gpu = torch.device("cuda", 0)
    _Capture.free = int(graphs.CAPTURE_ABOVE_FREE * TOTAL) - 1
    assert cache.get(gpu, (4, 48), tuple) is None and _Capture.made == [] and len(cache) == 0
    _Capture.free = TOTAL // 2
    assert cache.get(gpu, (4, 48), tuple) is not None and _Capture.made == [True]
