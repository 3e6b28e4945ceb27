"""Host-to-device copies that do not wait for the device.

``tensor.to("cuda")`` from ordinary (pageable) host memory synchronises the stream before it
returns. Where several processes share one GPU, each such wait is a turn on the GPU (time-slicing),
and the builder and the oracle used to take several turns per example for copies of a few
numbers. Staged through pinned memory the copy is queued like a kernel instead; torch's pinned
allocator keeps the staging buffer alive until the copy has run.
"""

from __future__ import annotations

import torch

__all__ = ["to_device"]


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` (on the host) on ``device``: queued without a stream synchronisation on a GPU."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
