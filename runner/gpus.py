"""xdist workers on GPUs: which GPU each worker claims, and what ``-n auto`` means.

On a GPU host ``-n auto`` starts ``--workers-per-gpu`` workers per visible GPU (``auto``:
two cores per worker, at most the measured knee of 8 per H200). The controller counts the
GPUs and exports their ids; each worker, when the plugin is imported and before anything
touches CUDA, claims a free slot (a lock file held for the life of the process, so a
worker that replaces a crashed one takes over the dead worker's GPU) and pins itself there
with ``CUDA_VISIBLE_DEVICES``. All workers share the one Triton cache (``TRITON_CACHE_DIR`` or
Triton's default): Triton writes each entry atomically, so a kernel specialisation that any
worker of any earlier run compiled is loaded, not compiled again in every worker.

Whether the run's CUDA processes join an MPS server is told here too (``mps_control_pipe``; the run's own
server is started by ``mps_server``): under MPS one process's GPU fault reaches every process on that GPU
(see ``record/mps.py``).

Nothing here imports torch at module level: it runs before the worker is pinned. The controller counts the GPUs
without torch too (``cuda_device_count``: the CUDA driver's own count), so that it can start its workers before
it has imported torch.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import fcntl
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

GPU_IDS_ENV = "GQA_DECODE_GPU_IDS"
SLOTS_DIR_ENV = "GQA_DECODE_GPU_SLOTS_DIR"
WORKERS_PER_GPU_ENV = "GQA_DECODE_WORKERS_PER_GPU"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
DEFAULT_MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # the CUDA driver's default, where the env variable is unset

__all__ = ["Pin", "auto_worker_count", "claim_slot", "cuda_device_count", "export_gpus", "memory_turn",
           "mps_control_pipe", "pin_this_worker", "release_slots", "share_cores", "shared_compute_mode",
           "sleep_while_waiting", "visible_gpu_ids", "workers_per_gpu"]


@dataclass(frozen=True)
class Pin:
    """Where one xdist worker runs: a GPU id (as CUDA_VISIBLE_DEVICES names it) and its slot name."""

    gpu: str | None
    slot: str
    slots_dir: Path | None = None  # shared by the workers of one run (lock files)


_held_slot_locks: list[int] = []  # claimed slots' lock files, open for the life of the worker


def release_slots() -> None:
    """Close the claimed slots' lock files (a worker never needs to: its exit releases them)."""
    while _held_slot_locks:
        os.close(_held_slot_locks.pop())


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

    By default CUDA spins a core while a process waits for the device (a process with fewer contexts than the
    machine has cores). Workers sharing a GPU spend most of an example waiting for a turn on it, so they would
    spin as many cores as there are workers while the others' Hypothesis generation (Python) needs them: on an
    H200 host with 16 cores and 8 workers generation took 5.0 ms per example spinning and 2.4 ms asleep
    (docs/gpu.md section 19). Must run before torch creates the context. True if every device took the flag.
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


def visible_gpu_ids(count: int) -> list[str]:
    """Ids of the ``count`` GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` would name them."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip()][:count]
    return [str(index) for index in range(count)]


def mps_control_pipe(environ: Mapping[str, str] | None = None) -> Path | None:
    """The MPS control pipe this run's CUDA processes join, or None when they run without MPS.

    The CUDA driver joins an MPS server when a ``control`` pipe exists in ``$CUDA_MPS_PIPE_DIRECTORY``
    (``/tmp/nvidia-mps`` when unset), so this checks the same entry: one ``stat``, no CUDA call.
    ``environ`` defaults to this process's environment, which the workers inherit.
    """
    environ = os.environ if environ is None else environ
    pipe = Path(environ.get(MPS_PIPE_ENV) or DEFAULT_MPS_PIPE_DIRECTORY) / "control"
    return pipe if os.path.exists(pipe) else None  # False, not an error, where the directory is unreadable


def export_gpus(gpu_ids: list[str], workers_per_gpu: int) -> Path:
    """Controller side: tell the workers (through their inherited environment) which GPUs to share."""
    slots_dir = Path(tempfile.mkdtemp(prefix="gqa-decode-gpu-slots-"))
    os.environ[GPU_IDS_ENV] = ",".join(gpu_ids)
    os.environ[WORKERS_PER_GPU_ENV] = str(workers_per_gpu)
    os.environ[SLOTS_DIR_ENV] = str(slots_dir)
    return slots_dir


def _worker_number(worker: str) -> int:
    digits = re.sub(r"\D", "", worker)
    return int(digits) if digits else 0


def _try_lock(path: Path) -> int | None:
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return None
    return descriptor


def claim_slot(worker: str, gpu_ids: list[str], workers_per_gpu: int, slots_dir: Path | None) -> Pin:
    """Pick this worker's GPU: its own slot if free, else the next free one, else share round-robin.

    Slots are ordered GPU-first (gpu0, gpu1, ..., then each GPU's second slot), so
    ``gw0, gw1, ...`` spread over the GPUs before doubling up. A lock file per slot,
    held until the process exits, lets a replacement worker find the GPU a crashed
    worker left free.
    """
    if not gpu_ids:
        raise ValueError(f"{GPU_IDS_ENV} names no GPU")
    slots = [(gpu, copy) for copy in range(workers_per_gpu) for gpu in gpu_ids]
    start = _worker_number(worker) % len(slots)
    order = slots[start:] + slots[:start]
    if slots_dir is not None:
        for gpu, copy in order:
            descriptor = _try_lock(slots_dir / f"gpu{gpu}-{copy}.lock")
            if descriptor is not None:
                _held_slot_locks.append(descriptor)
                return Pin(gpu=gpu, slot=f"gpu{gpu}-{copy}", slots_dir=slots_dir)
    gpu, _ = order[0]  # more workers than slots (an explicit -n): share
    return Pin(gpu=gpu, slot=f"gpu{gpu}-{worker}", slots_dir=slots_dir)


def pin_this_worker() -> Pin | None:
    """Worker side, at conftest import: pin to a GPU.

    Returns None outside an xdist worker. Must run before torch initialises CUDA.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return None
    gpu_ids = [gpu for gpu in os.environ.get(GPU_IDS_ENV, "").split(",") if gpu]
    if not gpu_ids:
        pin = Pin(gpu=None, slot=worker)
    else:
        slots_dir = os.environ.get(SLOTS_DIR_ENV)
        per_gpu = int(os.environ.get(WORKERS_PER_GPU_ENV, "1"))
        pin = claim_slot(worker, gpu_ids, per_gpu, Path(slots_dir) if slots_dir else None)
        os.environ["CUDA_VISIBLE_DEVICES"] = pin.gpu
        if per_gpu > 1:  # a GPU shared with other workers: wait asleep
            sleep_while_waiting()
    return pin


# Workers per H200 beyond which examples/s stopped growing: benchmarks/throughput.py scaling on one H200 of a
# 32-core host gave 144.7 examples/s with 4 workers, 221.3 with 8 and 219.8 with 16 (2026-11-30); on a 16-core
# host, the whole suite at 1500 examples per property, 248.6, 263.4 and 264.1 time-sliced, and 646.6 (8) against
# 583.9 (16) under an MPS daemon (2026-12-01, docs/gpu.md section 17); with two read-backs per example left,
# 260.4, 268.3 and 264.5 for 8, 12 and 16 on one H200 of a 32-core host (800 per property, docs/gpu.md section 18);
# with one wait per example, 287.4 and 302.0 for 8 and 12 on a 16-core host (section 19; 5%, within the noise).
MEASURED_KNEE = 8


def workers_per_gpu(option: int | str, gpu_count: int, cores: int | None = None) -> int:
    """``--workers-per-gpu``: the number given, or for ``auto`` two cores per worker, at most ``MEASURED_KNEE``."""
    if option != "auto":
        return int(option)
    cores = cores or os.cpu_count() or 1
    return max(1, min(MEASURED_KNEE, cores // (2 * max(gpu_count, 1))))


def auto_worker_count(device_choice: str, per_gpu: int | str) -> int | None:
    """What ``-n auto`` means: ``workers_per_gpu`` per visible GPU; None (xdist's core count) without CUDA.

    Runs in the controller only, which runs no test, so initialising CUDA there is harmless; it does not import
    torch (``cuda_device_count``).
    """
    if device_choice == "cpu":
        return None
    count = cuda_device_count()
    return count * workers_per_gpu(per_gpu, count) if count else None


def share_cores() -> int | None:
    """Worker side: give this xdist worker's torch its share of the cores, at least one thread.

    torch sizes its thread pool for the whole machine in every process; N workers then run N
    pools on the same cores, and an op above torch's parallel grain waits on threads that
    other workers hold: 40x slower on a loaded 2-core machine. A user's ``OMP_NUM_THREADS``
    wins. Returns the thread count set, or None where nothing was changed.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    import torch

    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    torch.set_num_threads(threads)
    return threads


@contextlib.contextmanager
def memory_turn(pin: Pin | None) -> Iterator[None]:
    """Take this GPU's turn for an example that needs a large share of its memory: the workers sharing
    the GPU run such examples one at a time, so the suite's own allocations cannot exhaust it together.
    A no-op outside xdist GPU slots (one process per GPU)."""
    if pin is None or pin.gpu is None or pin.slots_dir is None:
        yield
        return
    descriptor = os.open(pin.slots_dir / f"gpu{pin.gpu}-memory.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # waits for the other workers' huge examples on this GPU
        yield
    finally:
        os.close(descriptor)  # releases the lock
