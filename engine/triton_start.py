"""Triton's one-off start in a process, made with a launch of our own: the isolated child does it while its parent
starts, so that the target's first call does not pay it (hashing Triton's sources for its cache key, loading its
driver helpers). Imports triton only when called."""

from __future__ import annotations

import functools

__all__ = ["start_triton"]


@functools.cache
def _touch_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def touch(out_ptr):
        tl.store(out_ptr, 1)

    return touch


def start_triton(device) -> None:
    """One launch of a one-store kernel on the CUDA ``device``, waited for; nothing elsewhere."""
    import torch

    if device.type != "cuda":
        return
    out = torch.zeros(1, dtype=torch.int32, device=device)
    _touch_kernel()[(1,)](out)
    torch.cuda.synchronize(device)
