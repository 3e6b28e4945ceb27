"""Destination-passing style (DPS): the one adapter from a function that writes its results into ``output`` and
``lse`` passed as its last arguments to the suite's return-style call.

FlashInfer-Bench's current Solution schema calls ``run(*definition_arguments, output, lse)`` by default: the
caller allocates the destinations and the kernel writes them. ``call_in_destination_style`` is that caller,
made to catch what a wrapper would hide: it allocates ``output`` [B, H, D] bf16 and ``lse`` [B, H] float32 as
views into larger buffers whose every element holds a poison bit pattern (a NaN no arithmetic produces), with a
guard band of one batch row before and after each destination, and, for a drawn layout, gaps between its rows.
After the call:

- a guard band or gap that no longer holds the pattern is a write outside the destination
  (``DestinationError``: "wrote outside output");
- an element of a destination that still holds the pattern was never written ("left ... unwritten").

A kernel's own NaN (a NaN in a referenced page, propagated) is a canonical NaN, never the poison pattern, so
neither check mistakes it. The value the function returns is ignored, as the benchmark ignores it.

The adapter is a pure function of (function, definition, arguments, layout): the process that calls the
implementation (this one, or a child it runs in) runs it there, with no state of the suite.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gqa_decode_fuzz.reference.definitions import Definition

__all__ = ["DESTINATION_LAYOUTS", "DestinationError", "call_in_destination_style", "returning"]

# How the destinations sit in memory; the first is the plain case (what the benchmark allocates), the others
# shrink to it. "padded": each row of output padded to D + 64 elements, of lse to H + 8 (a slice of a wider
# buffer); "interleaved": every other element of a buffer twice as wide (innermost stride 2).
DESTINATION_LAYOUTS = ("contiguous", "padded", "interleaved")
_POISON = {torch.bfloat16: (torch.int16, -0x005B), torch.float32: (torch.int32, -0x005A5A5B)}  # 0xFFA5, 0xFFA5A5A5
_DTYPES = {"output": torch.bfloat16, "lse": torch.float32}


class DestinationError(AssertionError):
    """A DPS call wrote outside a destination or left part of one unwritten; the message says where."""


class _Destination:
    """One destination: a view into a poisoned buffer with guard bands, and which buffer elements it covers."""

    def __init__(self, name: str, shape: tuple[int, ...], layout: str, device: torch.device) -> None:
        if layout not in DESTINATION_LAYOUTS:
            raise ValueError(f"destinations={layout!r}: expected one of {DESTINATION_LAYOUTS}")
        self.name, self.shape = name, shape
        dtype = _DTYPES[name]
        self.bits_dtype, self.poison = _POISON[dtype]
        inner = shape[-1]
        row = {"contiguous": inner, "padded": inner + (64 if name == "output" else 8), "interleaved": 2 * inner}[layout]
        step = 2 if layout == "interleaved" else 1
        strides = [0] * len(shape)
        strides[-1] = step
        size = row
        for axis in range(len(shape) - 2, -1, -1):
            strides[axis] = size
            size *= shape[axis]
        self.guard = max(row * (shape[1] if len(shape) == 3 else 1), 64)  # one batch row, so one row past shows
        span = size if all(shape) else 0
        self.buffer = torch.full((self.guard + span + self.guard,), self.poison, dtype=self.bits_dtype, device=device)
        self.view = self.buffer.view(dtype).as_strided(shape, strides, self.guard)
        self.covered = torch.zeros(self.buffer.numel(), dtype=torch.bool, device=device)
        self.covered.as_strided(shape, strides, self.guard).fill_(True)

    def trouble(self) -> list[str]:
        """What the call did wrong with this destination, in words (empty when nothing)."""
        if self.buffer.device.type == "meta":
            return []
        bits = self.buffer
        changed = (bits != self.poison) & ~self.covered
        said = []
        if bool(changed.any()):
            where = changed.nonzero().flatten()
            end = self.buffer.numel() - self.guard
            before, after = int((where < self.guard).sum()), int((where >= end).sum())
            gaps = where.numel() - before - after
            parts = [f"{n} elements {what}" for n, what in ((before, "before its start"), (after, "after its end"),
                                                             (gaps, "in the gaps between its rows")) if n]
            said.append(f"wrote outside {self.name}: {', '.join(parts)} changed (first at buffer offset "
                        f"{int(where[0]) - self.guard} from the start of {self.name})")
        unwritten = self.view.view(self.bits_dtype) == self.poison
        if bool(unwritten.any()):
            first = tuple(int(i) for i in unwritten.nonzero()[0])
            axes = ("seq", "head", "dim")[:len(self.shape)]
            at = ", ".join(f"{axis}={i}" for axis, i in zip(axes, first))
            said.append(f"left {int(unwritten.sum())} of {unwritten.numel()} elements of {self.name} "
                        f"{list(self.shape)} unwritten (first at {at})")
        return said


def _batch_and_device(args: tuple) -> tuple[int, torch.device]:
    """B and the device from q (args[0]); for a call with a broken q (bad-input claims), from kv_indptr."""
    q = args[0] if args else None
    if isinstance(q, torch.Tensor) and q.dim() >= 1:
        return q.shape[0], q.device
    indptr = args[3] if len(args) > 3 else None
    if isinstance(indptr, torch.Tensor) and indptr.dim() == 1 and indptr.numel() >= 1:
        return indptr.numel() - 1, indptr.device
    return 0, torch.device("cpu")


def call_in_destination_style(function: Callable, definition: Definition, args: tuple, kwargs: dict | None = None, *,
                              layout: str = "contiguous") -> tuple[torch.Tensor, torch.Tensor]:
    """Call ``function(*args, output, lse, **kwargs)`` with poisoned, guard-banded destinations laid out as
    ``layout`` (``DESTINATION_LAYOUTS``); return ``(output, lse)`` (the views it was given).

    ``args`` are the definition's arguments in its order; ``definition`` gives the heads and head dim
    (``num_qo_heads``, ``head_dim``). Raises ``DestinationError`` when the call wrote outside a destination or
    left part of one unwritten; what ``function`` raises, it raises.
    """
    __tracebackhide__ = True
    batch, device = _batch_and_device(args)
    heads, dim = definition.num_qo_heads, definition.head_dim
    output = _Destination("output", (batch, heads, dim), layout, device)
    lse = _Destination("lse", (batch, heads), layout, device)
    function(*args, output.view, lse.view, **(kwargs or {}))
    trouble = output.trouble() + lse.trouble()
    if trouble:
        raise DestinationError(f"destination-passing call ({layout} destinations): " + "; ".join(trouble))
    return output.view, lse.view


def returning(function: Callable, definition: Definition) -> Callable:
    """``function`` (destination-passing) as a return-style callable: ``call(*args, destinations=layout,
    **kwargs) -> (output, lse)``; ``destinations`` (default ``contiguous``) travels in recorded calls, so a case
    file replays the same layout."""

    @functools.wraps(function)
    def call(*args, destinations: str = "contiguous", **kwargs):
        return call_in_destination_style(function, definition, args, kwargs, layout=destinations)

    return call
