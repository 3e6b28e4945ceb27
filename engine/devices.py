"""The CUDA devices this process sees, asked of the CUDA driver without importing torch.

An xdist controller counts its GPUs (``cuda_device_count``) and a worker sets its contexts' wait mode
(``sleep_while_waiting``) before torch is imported; whether the run's CUDA processes join an MPS server is one
``stat`` of its control pipe (``mps_control_pipe``), and whether a GPU takes processes beside that server one
attribute (``shared_compute_mode``). The runner places workers with these (``runner/gpus.py``); the engine starts
an isolated child outside the server with them. Once torch is loaded, a worker after each example and an isolated
child after each call give their cached memory back when the GPU runs short (``release_cache_if_short``).
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DEFAULT_MPS_PIPE_DIRECTORY", "MPS_PIPE_ENV", "RELEASE_CACHE_BELOW_FREE", "RELEASE_GRAPHS_BELOW_FREE",
           "cuda_device_count", "driver_device_count", "mps_control_pipe", "release_cache_if_short",
           "shared_compute_mode", "sleep_while_waiting", "torch_build"]

MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
DEFAULT_MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # the CUDA driver's default, where the env variable is unset

# A process of the run empties torch's cache after its work on an example when less than this share of its GPU's
# memory is free: each process's cache grows to its largest examples (and a worker's graphs' pool), and together
# the workers' and their isolated children's caches can leave the suite's own allocations short (docs/workers.md).
RELEASE_CACHE_BELOW_FREE = 0.25
# Below this share it also forgets the oracle's captured graphs, which are in use and cost a capture each to make
# again: only when the GPU is nearly full (or another process waits for memory), not at every example of a busy one.
# The same share below which no capture starts (``reference.graphs.CAPTURE_ABOVE_FREE``).
RELEASE_GRAPHS_BELOW_FREE = 0.10


def torch_build(version_file: Path | None = None) -> str | None:
    """What the installed torch was built for, read from ``torch/version.py`` without importing torch: "cuda",
    "cpu" (no ``torch.version.cuda``: ``torch.cuda.is_available()`` is False), or None where that file does not
    tell (not found, not literal, or a ROCm build, whose ``torch.cuda`` runs on HIP)."""
    if version_file is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(version_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    values = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(
            node, "target", None)
        if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
            with contextlib.suppress(ValueError, TypeError, SyntaxError, RecursionError):
                values[target.id] = ast.literal_eval(node.value)
    if "cuda" not in values or values.get("hip"):
        return None
    return "cpu" if values["cuda"] is None else "cuda"


def _driver() -> tuple[ctypes.CDLL, int] | None:
    """The CUDA driver (libcuda) after ``cuInit``, and its device count; None without a driver."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    return driver, count.value


def driver_device_count() -> int:
    """The CUDA driver's device count (``cuInit``, ``cuDeviceGetCount``): what the CUDA runtime under torch counts,
    ``CUDA_VISIBLE_DEVICES`` applied by the driver itself (indices, UUIDs, MIG instances, "" for none). 0 without a
    driver or a device, as torch's ``cudaGetDeviceCount`` then gives."""
    found = _driver()
    return found[1] if found else 0


_CU_CTX_SCHED_BLOCKING_SYNC = 0x04


def sleep_while_waiting() -> bool:
    """Blocking synchronisation on every visible device's primary context: a process waiting for its GPU sleeps.

    By default CUDA spins a core while a process waits for the device. Workers sharing a GPU spend most of an
    example waiting for a turn on it, and spinning they would take the cores the others' Hypothesis generation
    needs (docs/gpu.md section 19). Must run before torch creates the context. True if every device took the flag.
    """
    found = _driver()
    if found is None or not found[1]:
        return False
    driver, count = found
    set_flags = getattr(driver, "cuDevicePrimaryCtxSetFlags_v2", None) or driver.cuDevicePrimaryCtxSetFlags
    took = True
    for ordinal in range(count):
        device = ctypes.c_int(0)
        took &= driver.cuDeviceGet(ctypes.byref(device), ordinal) == 0 and set_flags(
            device, _CU_CTX_SCHED_BLOCKING_SYNC) == 0
    return took


_CU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20
_CU_COMPUTEMODE_DEFAULT = 0


def shared_compute_mode() -> bool:
    """Whether every visible GPU is in the default compute mode, where processes outside an MPS server may use it
    beside one (not exclusive-process, not prohibited); False without a driver. Needs no context."""
    found = _driver()
    if found is None or not found[1]:
        return False
    driver, count = found
    for ordinal in range(count):
        device, mode = ctypes.c_int(0), ctypes.c_int(-1)
        if (driver.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or driver.cuDeviceGetAttribute(
                ctypes.byref(mode), _CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, device) != 0
                or mode.value != _CU_COMPUTEMODE_DEFAULT):
            return False
    return True


def cuda_device_count() -> int:
    """How many CUDA devices torch sees in this process (``torch.cuda.device_count()`` where
    ``torch.cuda.is_available()``, else 0), told without importing torch where that can be: 0 for a torch built
    without CUDA, the driver's count for a CUDA build on Linux. Elsewhere (ROCm, another OS, no torch/version.py)
    it asks torch. The xdist controller's answer is checked against torch's once it has imported torch
    (``target.confirm_device``)."""
    build = torch_build() if sys.platform == "linux" else None
    if build == "cpu":
        return 0
    if build == "cuda":
        return driver_device_count()
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def mps_control_pipe(environ: Mapping[str, str] | None = None) -> Path | None:
    """The MPS control pipe this run's CUDA processes join, or None when they run without MPS.

    The CUDA driver joins an MPS server when a ``control`` pipe exists in ``$CUDA_MPS_PIPE_DIRECTORY``
    (``/tmp/nvidia-mps`` when unset), so this checks the same entry: one ``stat``, no CUDA call.
    ``environ`` defaults to this process's environment, which the workers inherit.
    """
    environ = os.environ if environ is None else environ
    pipe = Path(environ.get(MPS_PIPE_ENV) or DEFAULT_MPS_PIPE_DIRECTORY) / "control"
    return pipe if os.path.exists(pipe) else None  # False, not an error, where the directory is unreadable


def release_cache_if_short(device, wanted: bool = False) -> bool:
    """Empty torch's CUDA cache when less than ``RELEASE_CACHE_BELOW_FREE`` of ``device``'s memory is free (the
    driver's count: no synchronisation, no allocator statistics) or another process ``wanted`` it, first forgetting
    the oracle's graphs where less than ``RELEASE_GRAPHS_BELOW_FREE`` is free or it was wanted; whether it emptied.
    A lost CUDA context is left for the work's own error to report."""
    import torch

    from gqa_decode_fuzz.reference import graphs

    try:
        free, total = torch.cuda.mem_get_info(device)
        if wanted or free < RELEASE_CACHE_BELOW_FREE * total:
            if wanted or free < RELEASE_GRAPHS_BELOW_FREE * total:
                graphs.release_all()  # the oracle's captures can hold the most, and are made again at need
            torch.cuda.empty_cache()
            return True
    except RuntimeError:
        pass
    return False
