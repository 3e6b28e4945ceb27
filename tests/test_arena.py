"""The isolated child's input buffers (``engine/arena.py``): what the child sees is what the parent passed, writes
come back, and calls too large for a buffer, or a child that dies, go the ways they went before."""

from __future__ import annotations

import pytest
import torch

from gqa_decode_fuzz.engine import arena
from gqa_decode_fuzz.engine.arena import ALIGN, Arenas, ArenaSlot, resolved
from gqa_decode_fuzz.engine.isolated_impl import Child, Launch
from gqa_decode_fuzz.engine.isolation import ImplementationCrashed
from gqa_decode_fuzz.generation.cases import DecodeCase, build
from tests.impls.torch_float32 import run as torch_float32
from tests.pytest_runs import ROOT

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _odd_inputs(device: str) -> tuple[tuple, dict]:
    """Views that share a storage, start inside it, skip elements, hold nothing, and sit in a dict."""
    base = torch.arange(64, dtype=torch.float32, device=device)
    shared = base[3:35].view(4, 8)
    strided = base[::5]
    other = torch.arange(10, dtype=torch.int16, device=device)
    return (shared, strided, torch.empty(0, device=device)), {"other": other, "plain": 7, "nested": [other[2:]]}


@pytest.mark.parametrize("device", DEVICES)
def test_the_child_sees_each_view_as_passed_and_shared_storages_stay_shared(device):
    arenas = Arenas()
    args, kwargs = _odd_inputs(device)
    packed_args, packed_kwargs = arenas.pack(args, kwargs)
    assert all(isinstance(slot, ArenaSlot) for slot in (*packed_args, packed_kwargs["other"]))
    assert packed_kwargs["plain"] == 7
    seen_args, seen_kwargs = resolved(packed_args, arenas.buffers), resolved(packed_kwargs, arenas.buffers)
    for seen, original in zip((*seen_args, seen_kwargs["other"], seen_kwargs["nested"][0]),
                              (*args, kwargs["other"], kwargs["nested"][0]), strict=True):
        assert torch.equal(seen, original)
        assert (seen.shape, seen.stride(), seen.dtype) == (original.shape, original.stride(), original.dtype)
        assert seen.data_ptr() % ALIGN == (original.data_ptr() - original.untyped_storage().data_ptr()) % ALIGN
    assert seen_args[0].untyped_storage().data_ptr() == seen_args[1].untyped_storage().data_ptr()
    seen_args[1][1] = 1000.0  # base[5], which the shared view also holds
    assert seen_args[0][0, 2] == 1000.0
    assert not seen_args[0].requires_grad
    leaf = torch.ones(3, device=device, requires_grad=True)
    assert resolved(arenas.pack((leaf,), {})[0], arenas.buffers)[0].requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_writes_into_the_buffer_reach_the_originals_only_at_copy_back(device):
    arenas = Arenas()
    args, kwargs = _odd_inputs(device)
    seen = resolved(arenas.pack(args, kwargs)[0], arenas.buffers)
    seen[0].fill_(-1.0)
    assert args[0][0, 0] == 3.0
    arenas.copy_back()
    assert torch.equal(args[0], torch.full((4, 8), -1.0, device=device)) and args[1][0] == 0.0


def test_a_call_over_the_limit_or_with_a_tensor_no_view_describes_goes_the_per_call_way():
    arenas = Arenas(limit_bytes=4096)
    assert arenas.pack((torch.zeros(2048),), {}) is None  # 8 KiB
    assert arenas.pack((torch.zeros(4).to_sparse(),), {}) is None
    assert arenas.pack((torch.zeros(4, dtype=torch.complex64).conj(),), {}) is None  # a bit no view carries
    assert arenas.pack((torch.zeros(1024),), {}) is not None and arenas.unsent()


def test_a_buffer_is_sent_once_and_again_only_when_it_grows(monkeypatch):
    monkeypatch.setattr(arena, "FIRST_BYTES", 1024)
    arenas = Arenas()
    arenas.pack((torch.zeros(16),), {})
    first = arenas.unsent()["cpu"]
    arenas.pack((torch.zeros(200),), {})
    assert arenas.unsent() == {}
    arenas.pack((torch.zeros(300),), {})  # 1,200 bytes: doubled
    grown = arenas.unsent()["cpu"]
    assert grown.numel() == 2048 and grown.data_ptr() != first.data_ptr() and grown.is_shared()


@pytest.mark.parametrize("device", DEVICES)
def test_a_child_answers_through_the_buffers_and_a_grown_one_reaches_it(monkeypatch, device):
    monkeypatch.setattr(arena, "FIRST_BYTES", 4096)
    child = Child(Launch("tests/impls/torch_float32.py:run", ROOT, device))
    try:
        for lengths in ((3,), (40, 1, 7)):  # the second's pool does not fit the first buffer
            inputs = build(DecodeCase(lengths=lengths), device, observe=False)
            arguments = inputs.arguments()
            output, lse = child.call(None, arguments, {}, [])
            expected_output, expected_lse = torch_float32(*arguments)
            assert torch.equal(output, expected_output) and torch.equal(lse, expected_lse)
        assert [buffer.numel() > 4096 for buffer in child.arenas.buffers.values()] == [True]
    finally:
        child.stop()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC: on a GPU only")
def test_a_child_that_dies_leaves_no_buffer_allocated():
    """The child holds the buffers for its life; one that dies never lets go, so the parent releases them."""
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    child = Child(Launch("tests/impls/process_faults.py:exits", ROOT, "cuda"))
    faulting = build(DecodeCase(lengths=(3, 3)), "cuda", observe=False)
    with pytest.raises(ImplementationCrashed, match="exit status 3"):
        child.call(None, faulting.arguments(), {}, [])
    del faulting, child
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() - before < 2**20, torch.cuda.memory_summary(abbreviated=True)
