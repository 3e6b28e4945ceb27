"""The suite's own Triton kernels (the bound's deviation term, the comparison's verdict) checked against their torch
paths on each device before a process first uses them.

A Triton version can miscompile a reduction under one launch configuration (lmdeploy's decode kernel on Triton 3.5
and 3.6), and a miscompiled bound or verdict would pass or fail kernels wrongly. So the first use on a device runs
the kernel on fixed hostile inputs beside its torch path; where the answers differ, or the kernel does not build
or launch, the process warns once and computes in torch on that device from then on.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import torch

__all__ = ["trusted"]

_verdicts: dict[tuple[str, torch.device], bool] = {}
_lock = threading.Lock()


def trusted(kernel: str, device: torch.device, agrees: Callable[[torch.device], bool]) -> bool:
    """Whether ``kernel`` may run on ``device``: ``agrees(device)`` (its answers equal the torch path's on fixed
    inputs), asked once per process and device; False, after one warning, where it disagrees or raises."""
    with _lock:
        key = (kernel, device)
        if key not in _verdicts:
            _verdicts[key] = _self_check(kernel, device, agrees)
        return _verdicts[key]


def _self_check(kernel: str, device: torch.device, agrees: Callable[[torch.device], bool]) -> bool:
    try:
        if agrees(device):
            return True
        why = "its answers differ from the torch path's on the self-check's inputs"
    except Exception as error:  # noqa: BLE001 - any failure to build or launch means: compute in torch
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a sticky fault (the kernel under test's, say) raises here
        why = f"it failed: {error!r}"
    warnings.warn(f"{kernel}: Triton's kernel is not used on {device}, {why}; computed in torch there instead",
                  RuntimeWarning, stacklevel=3)
    return False
