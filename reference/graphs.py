"""Fixed-shape functions replayed as CUDA graphs: one launch where there were a hundred.

The oracle and its bound are about a hundred small float64 kernels per example. Alone on
a GPU their cost is the host's dispatch (docs/gpu.md section 17); where several processes share a GPU
by time-slicing, every launch is also a turn on the device. A CUDA graph replays all of
them with one launch. A graph runs on the buffers it was captured with, so each input
shape gets its own graph and its own input buffers, which the caller fills before every
replay; the outputs are the graph's too, overwritten by its next replay.

``GQA_DECODE_ORACLE_GRAPHS=0`` runs everything eagerly instead (same code, same answers
for the same shapes): for a GPU or driver where capture fails, and for measuring.

The captures' memory stays theirs until they are forgotten, and a run over many definitions meets many
shapes: twelve workers over the decode family filled a 140 GB H200 with them (one worker held 25 GiB).
So a cache forgets its captures on a device once they have taken ``POOL_SHARE`` of its memory, and every
cache forgets its captures when the GPU is nearly full (``release_all``, which ``engine.devices`` calls).
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import torch

__all__ = ["CAPTURE_ABOVE_FREE", "ENABLED_ENV", "POOL_SHARE", "Captured", "GraphCache", "graphs_enabled", "release_all"]

ENABLED_ENV = "GQA_DECODE_ORACLE_GRAPHS"
POOL_SHARE = 1 / 32  # of a device's memory, that one process's captures may take there before they are forgotten
# Free memory (the driver's count, a share of the device's) below which no capture starts: one that runs out of memory
# mid-way aborts the whole process (an H100's worker, sweeping the decode family: docs/gpu.md section 45). The share
# below which engine.devices forgets every capture (RELEASE_GRAPHS_BELOW_FREE): what it frees is not captured again.
CAPTURE_ABOVE_FREE = 0.10
_CACHES: weakref.WeakSet[GraphCache] = weakref.WeakSet()

Inputs = TypeVar("Inputs", bound=tuple)
Outputs = TypeVar("Outputs", bound=tuple)


def graphs_enabled(device: torch.device) -> bool:
    """Whether work on ``device`` replays captured graphs: on CUDA, unless ``GQA_DECODE_ORACLE_GRAPHS=0``."""
    return device.type == "cuda" and os.environ.get(ENABLED_ENV, "1") != "0"


class Captured(Generic[Inputs, Outputs]):
    """``function(inputs)`` captured once: fill ``inputs`` in place, then ``replay()`` for the outputs."""

    def __init__(self, function: Callable[..., Outputs], inputs: Inputs, pool, *, warm_up: bool) -> None:
        self.inputs = inputs
        device = inputs[0].device
        if warm_up:  # lazy initialisation (cuBLAS handles, workspaces) must not be captured
            _on_side_stream(device, lambda: function(inputs))
        self.graph = torch.cuda.CUDAGraph()
        _on_side_stream(device, lambda: self._capture(function, pool))

    def _capture(self, function: Callable[..., Outputs], pool) -> None:
        # As torch.cuda.graph captures, without what its entry adds: a device synchronisation, emptying the
        # allocator's caches (so the next example's pool is cudaMalloc'ed again) and, in some torch versions,
        # gc.collect(): a cost each new shape paid (docs/performance.md). thread_local: another thread's CUDA
        # work (none of the suite's, but a kernel's helper might) goes on.
        self.graph.capture_begin(pool, capture_error_mode="thread_local")
        try:
            self.outputs = function(self.inputs)
        finally:
            self.graph.capture_end()

    def replay(self) -> Outputs:
        """Run the captured work on the current contents of ``inputs``; the outputs live until the next replay."""
        self.graph.replay()
        return self.outputs


def _on_side_stream(device: torch.device, work: Callable[[], object]) -> None:
    """``work()`` on a side stream that waits for the current one, which then waits for it (captures may not run on
    the legacy default stream)."""
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        work()
    torch.cuda.current_stream(device).wait_stream(side)


class GraphCache(Generic[Inputs, Outputs]):
    """One ``Captured`` per key (a device and the input shapes), all in one memory pool per device.

    The graphs share their pool: each one's temporaries are free between replays, and every
    replay runs on the one stream that queues them, so no two graphs' work overlaps. The first
    capture on a device is warmed up eagerly; later ones run the same operations, already initialised.
    """

    def __init__(self, function: Callable[..., Outputs]) -> None:
        self.function = function
        self._captured: dict[Hashable, Captured[Inputs, Outputs] | None] = {}  # None: capturing failed
        self._pools: dict[torch.device, object] = {}
        self._warm: set[torch.device] = set()  # devices with a capture made: their operations are initialised
        self._held: dict[torch.device, int] = {}  # bytes the captures on a device added to torch's reserve
        self._lock = threading.Lock()
        _CACHES.add(self)

    def get(self, device: torch.device, key: Hashable,
            make_inputs: Callable[[], Inputs]) -> Captured[Inputs, Outputs] | None:
        """The capture for ``key`` on ``device``, made on first use with ``make_inputs()`` as its input buffers
        (which may be shared with other keys' captures: each replay reads what was filled just before it).

        None where capturing failed (a driver or an operation that refuses it): the caller computes eagerly, as
        with graphs off, after one warning per key. None, too, while the device is nearly full
        (``CAPTURE_ABOVE_FREE``): computed eagerly this time, captured at a later use. A fault that killed the
        context is raised, not hidden.
        """
        with self._lock:
            full_key = (device, key)
            if full_key not in self._captured:
                with torch.cuda.device(device):
                    if self._held.get(device, 0) >= POOL_SHARE * torch.cuda.get_device_properties(device).total_memory:
                        self._forget(device)
                    free, total = torch.cuda.mem_get_info(device)
                    if free < CAPTURE_ABOVE_FREE * total:
                        return None
                    self._captured[full_key] = self._capture(device, key, make_inputs)
            return self._captured[full_key]

    def _capture(self, device: torch.device, key: Hashable, make_inputs: Callable[[], Inputs]):
        pool = self._pools.setdefault(device, torch.cuda.graph_pool_handle())
        before = torch.cuda.memory_reserved(device)
        try:
            captured = Captured(self.function, make_inputs(), pool, warm_up=device not in self._warm)
            self._warm.add(device)
            return captured
        except RuntimeError as error:
            torch.cuda.synchronize(device)  # a sticky fault (the kernel under test's, say) raises here
            warnings.warn(f"{ENABLED_ENV}: capturing {key} on {device} failed, computed eagerly instead: {error}",
                          RuntimeWarning, stacklevel=4)
            return None
        finally:
            self._held[device] = self._held.get(device, 0) + max(0, torch.cuda.memory_reserved(device) - before)

    def _forget(self, device: torch.device) -> None:
        """Drop ``device``'s captures and their pool (the lock held); torch's allocator gets their memory back."""
        for full_key in [full_key for full_key in self._captured if full_key[0] == device]:
            del self._captured[full_key]
        self._pools.pop(device, None)
        self._held.pop(device, None)
        torch.cuda.empty_cache()  # to the driver, for the processes sharing the GPU

    def forget_all(self) -> None:
        """Forget the captures on every device, their memory back to the driver; the next ones need no warm-up."""
        with self._lock:
            for device in list(self._pools):
                self._forget(device)

    def clear(self) -> None:
        """Forget every capture (their memory returns to torch's allocator once unreferenced)."""
        with self._lock:
            self._captured.clear()
            self._pools.clear()
            self._warm.clear()
            self._held.clear()

    def __len__(self) -> int:
        return len(self._captured)


def release_all() -> None:
    """Forget the captures of every cache in this process, so that their memory can go back to the driver: for a
    GPU that runs short, before torch's cache is emptied. The next examples capture their shapes again."""
    for cache in list(_CACHES):
        cache.forget_all()
