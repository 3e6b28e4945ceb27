"""The inputs' way into the isolated child: one buffer per device, shared once and refilled for every call.

Sending a tensor to another process costs, for every storage of every call, a CUDA IPC handle and event that the
child opens and closes, or on the CPU a shared-memory file whose descriptor travels over a socket. ``Arenas`` keeps
one buffer per device that the child receives once (again only when it grows); each call copies its inputs'
storages into it, whole (guard bands, gaps and storages that several inputs share included), and sends
``ArenaSlot`` placeholders, which the child turns into the same views of its mapping of that buffer (``view``).
After the answer the parent copies every storage back, so writes into inputs (destinations, a kernel that
scribbles on its inputs) reach the originals as they would in-process. A call whose inputs would need a buffer
over ``LIMIT_BYTES`` (the huge pools) goes the per-call way instead (``isolated_impl.Child.call``).

What differs from the per-call way, and why it does not matter to a verdict: the child's input storages are
regions of one larger buffer (an implementation that reads past its inputs reads other inputs, not unmapped
memory, as it would in the parent's cached segments anyway), and a write the implementation makes into its inputs
after it answered lands in the buffer, not in the originals (as on the CPU before; its results, which the parent
watches for late writes, still come back the per-call way). Each storage keeps its alignment modulo ``ALIGN``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 512  # bytes; the CUDA caching allocator's block alignment, so a storage's pointer keeps its alignment class
FIRST_BYTES = 16 << 20
LIMIT_BYTES = 512 << 20  # per device: twelve workers' children map 6 GiB of a GPU at most
DEVICE_TYPES = ("cpu", "cuda")

__all__ = ["ALIGN", "LIMIT_BYTES", "ArenaSlot", "Arenas", "bytes_of", "mapped", "resolved"]


def mapped(value: Any, function, kind: type = torch.Tensor) -> Any:
    """``value`` with ``function`` applied to each ``kind`` (a tensor) in it (tuples, lists and dicts followed)."""
    if isinstance(value, kind):
        return function(value)
    if isinstance(value, (tuple, list)):
        return type(value)(mapped(item, function, kind) for item in value)
    if isinstance(value, dict):
        return {key: mapped(item, function, kind) for key, item in value.items()}
    return value


@dataclass(frozen=True)
class ArenaSlot:
    """Where one input tensor lies in its device's buffer: its storage at ``offset`` bytes, and its view of it."""

    device: str
    offset: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    requires_grad: bool = False

    def view(self, buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        """The tensor in the child's mapping of the buffers (``buffers``: device -> uint8 buffer)."""
        buffer = buffers[self.device]
        start = self.offset // torch.empty((), dtype=self.dtype).element_size()
        tensor = torch.empty((0,), dtype=self.dtype, device=buffer.device)
        tensor.set_(buffer.untyped_storage(), start + self.storage_offset, self.size, self.stride)
        return tensor.requires_grad_() if self.requires_grad else tensor


def resolved(value: Any, buffers: dict[str, torch.Tensor]) -> Any:
    """``value`` (a call's args or kwargs) with each ``ArenaSlot`` replaced by its tensor; the child's side."""
    return mapped(value, lambda slot: slot.view(buffers), ArenaSlot)


def _plain(tensor: torch.Tensor) -> bool:
    """Whether a buffer's bytes and a view's shape, strides and dtype are all of ``tensor``: not sparse, nested or
    quantized, no conjugate or negative bit, on the CPU or a CUDA device."""
    return (tensor.layout == torch.strided and tensor.device.type in DEVICE_TYPES and not tensor.is_nested
            and not tensor.is_quantized and not tensor.is_conj() and not tensor.is_neg())


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """``storage`` as a uint8 tensor over all of it."""
    return torch.empty((0,), dtype=torch.uint8, device=storage.device).set_(storage)


class Arenas:
    """The parent's buffers, one per device. ``pack`` fills them for a call; ``unsent`` lists the buffers the child
    has not received yet; ``copy_back`` returns the call's writes to the originals."""

    def __init__(self, limit_bytes: int = LIMIT_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self.buffers: dict[str, torch.Tensor] = {}
        self._unsent: set[str] = set()
        self._copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (original's bytes, its region) of the call

    def pack(self, args: tuple | None, kwargs: dict | None) -> tuple[Any, Any] | None:
        """``args`` and ``kwargs`` with each strided CPU or CUDA tensor replaced by its ``ArenaSlot``, its storage
        copied into the buffer; None (nothing copied) when they would need a buffer over the limit or hold a tensor
        of another kind, for the per-call way."""
        self._copies = []
        offsets: dict[tuple[str, int], int] = {}
        storages: dict[tuple[str, int], torch.UntypedStorage] = {}
        totals: dict[str, int] = {}

        def place(tensor: torch.Tensor) -> ArenaSlot | torch.Tensor:
            nonlocal fits
            if not _plain(tensor):
                fits = False
                return tensor
            storage = tensor.untyped_storage()
            device, key = str(tensor.device), (str(tensor.device), storage.data_ptr())
            if key not in offsets:
                offsets[key], storages[key] = totals.get(device, 0), storage
                totals[device] = offsets[key] + _aligned(storage.nbytes())
            return ArenaSlot(device, offsets[key], tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()),
                             tensor.storage_offset(), tensor.requires_grad)

        fits = True
        packed = mapped((args, kwargs), place)
        if not fits or any(total > self.limit_bytes for total in totals.values()):
            return None
        for device, total in totals.items():
            self._reserve(device, total)
        for key, storage in storages.items():
            original = bytes_of(storage)
            region = self.buffers[key[0]][offsets[key]:offsets[key] + storage.nbytes()]
            region.copy_(original)
            self._copies.append((original, region))
        for device in totals:
            if device.startswith("cuda"):  # the child reads them from another process: they must have landed
                torch.cuda.current_stream(torch.device(device)).synchronize()
        return packed

    def _reserve(self, device: str, nbytes: int) -> None:
        """A buffer of at least ``nbytes`` on ``device``: a new one, twice as large, when the old one is short."""
        buffer = self.buffers.get(device)
        if buffer is not None and buffer.numel() >= nbytes:
            return
        size = min(max(nbytes, FIRST_BYTES, 2 * (buffer.numel() if buffer is not None else 0)), self.limit_bytes)
        buffer = torch.empty(size, dtype=torch.uint8, device=device)
        self.buffers[device] = buffer.share_memory_() if buffer.device.type == "cpu" else buffer
        self._unsent.add(device)

    def unsent(self) -> dict[str, torch.Tensor]:
        """The buffers the child has not received (new or grown), marked as sent."""
        fresh = {device: self.buffers[device] for device in sorted(self._unsent)}
        self._unsent.clear()
        return fresh

    def copy_back(self) -> None:
        """Copy each storage of the last packed call back from the buffer: its writes, as in-process."""
        copies, self._copies = self._copies, []
        for original, region in copies:
            original.copy_(region)
