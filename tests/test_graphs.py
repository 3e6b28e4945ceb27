"""The graph cache's bookkeeping, with capture itself stood in for (CUDA graphs need a GPU: tests/test_oracle.py
holds the replays to the eager computation there)."""

import contextlib

import pytest
import torch

from gqa_decode_fuzz.reference import graphs


class _Capture:
    """Stands in for ``graphs.Captured``: records each capture; ``fail`` makes capturing raise."""

    made: list = []
    fail = False

    def __init__(self, function, inputs, pool, *, warm_up):
        if _Capture.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        _Capture.made.append(warm_up)
        self.inputs = inputs


@pytest.fixture
def cache(monkeypatch):
    monkeypatch.setattr(graphs, "Captured", _Capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 1))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    _Capture.made, _Capture.fail = [], False
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
