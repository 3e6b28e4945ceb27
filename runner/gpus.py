"""xdist workers on GPUs: which GPU each worker claims, and what ``-n auto`` means.

On a GPU host ``-n auto`` starts ``--workers-per-gpu`` workers per visible GPU (``auto``:
three workers for four cores, at most ``MEASURED_KNEE``). The controller counts the
GPUs and exports their ids; each worker, when the plugin is imported and before anything
touches CUDA, claims a free slot (a lock file held for the life of the process, so a
worker that replaces a crashed one takes over the dead worker's GPU) and pins itself there
with ``CUDA_VISIBLE_DEVICES``. All workers share the one Triton cache (``TRITON_CACHE_DIR`` or
Triton's default): Triton writes each entry atomically, so a kernel specialisation that any
worker of any earlier run compiled is loaded, not compiled again in every worker. On any host each worker takes
its share of the cores for the thread pools of torch and numpy's BLAS, its own and its children's (``share_cores``).

Nothing here imports torch at module level: it runs before the worker is pinned. The controller counts the GPUs
without torch too (``engine/devices.py``: the CUDA driver's own count), so that it can start its workers before
it has imported torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gqa_decode_fuzz.engine import devices

GPU_IDS_ENV = "GQA_DECODE_GPU_IDS"
SLOTS_DIR_ENV = "GQA_DECODE_GPU_SLOTS_DIR"
WORKERS_PER_GPU_ENV = "GQA_DECODE_WORKERS_PER_GPU"

__all__ = ["THREADS_ENV", "Pin", "auto_worker_count", "claim_slot", "core_share", "export_gpus", "memory_turn",
           "memory_wanted", "pin_this_worker", "release_slots", "share_cores", "shares_its_gpu", "visible_gpu_ids",
           "wanting_memory", "workers_per_gpu"]

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


def visible_gpu_ids(count: int) -> list[str]:
    """Ids of the ``count`` GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` would name them."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip()][:count]
    return [str(index) for index in range(count)]


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
            devices.sleep_while_waiting()
    return pin


# Workers per GPU for ``auto``: where examples/s stopped growing on 16 cores a GPU (docs/gpu.md section 39: 8, 12
# and 16 workers, clean once the bound no longer formed |v - o| in memory). A worker is host-bound, so the
# count follows the cores: three workers for four.
MEASURED_KNEE = 12


def workers_per_gpu(option: int | str, gpu_count: int, cores: int | None = None) -> int:
    """``--workers-per-gpu``: the number given, or for ``auto`` three workers for every four cores, at most
    ``MEASURED_KNEE``."""
    if option != "auto":
        return int(option)
    cores = cores or os.cpu_count() or 1
    return max(1, min(MEASURED_KNEE, 3 * cores // (4 * max(gpu_count, 1))))


def auto_worker_count(device_choice: str, per_gpu: int | str) -> int | None:
    """What ``-n auto`` means: ``workers_per_gpu`` per visible GPU; None (xdist's core count) without CUDA.

    Runs in the controller only, which runs no test, so initialising CUDA there is harmless; it does not import
    torch (``cuda_device_count``).
    """
    if device_choice == "cpu":
        return None
    count = devices.cuda_device_count()
    return count * workers_per_gpu(per_gpu, count) if count else None


# Read as the libraries load: torch's pool and, under numpy, OpenBLAS's and MKL's (both fall back to the first).
THREADS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def share_cores() -> int | None:
    """Worker side, at the plugin's import: give this xdist worker, and every process it starts, its share of the
    cores, at least one thread.

    torch sizes its thread pool for the whole machine in every process, and so does numpy's BLAS (the Triton
    interpreter's ``tl.dot`` is a numpy matmul); N workers, their isolated children and the pytest runs the
    project's tests start then run a pool each on the same cores, and an op above the parallel grain waits on
    threads that other pools hold (docs/workers.md). The share is exported before torch and numpy load, so they
    size their pools by it and every child inherits it; a torch loaded earlier is set directly. A user's
    ``OMP_NUM_THREADS`` wins. Returns the thread count set, or None where nothing was changed.
    """
    share = core_share(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0))
    if not share:
        return None
    for name, threads in share.items():
        os.environ.setdefault(name, threads)  # a user's own BLAS count stays
    threads = int(share["OMP_NUM_THREADS"])
    if "torch" in sys.modules:  # loaded before the plugin (a warm worker's, runner/warm_workers.py): set directly
        sys.modules["torch"].set_num_threads(threads)
    return threads


def core_share(workers: int) -> dict[str, str]:
    """The thread-count variables ``share_cores`` gives each of ``workers`` processes; empty for no workers or where
    the user set ``OMP_NUM_THREADS``."""
    if workers < 1 or "OMP_NUM_THREADS" in os.environ:
        return {}
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    return dict.fromkeys(THREADS_ENV, str(threads))


def shares_its_gpu(pin: Pin | None) -> bool:
    """Worker side: whether this worker shares its GPU with others of the run (as ``-n`` spread them)."""
    if pin is None or pin.gpu is None:
        return False
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    gpus = len([gpu for gpu in os.environ.get(GPU_IDS_ENV, "").split(",") if gpu]) or 1
    return workers > gpus


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


@functools.cache
def _wanted_flag(pin: Pin) -> str | None:
    """The file whose presence asks every worker on ``pin``'s GPU to empty its cache after each example."""
    if pin.gpu is None or pin.slots_dir is None:
        return None
    return str(pin.slots_dir / f"gpu{pin.gpu}-memory-wanted")


def memory_wanted(pin: Pin | None) -> bool:
    """Worker side: whether the worker holding this GPU's memory turn ran short and waits for the others' caches
    (one ``stat``, cheap enough after every example)."""
    flag = _wanted_flag(pin) if pin is not None else None
    return flag is not None and os.path.exists(flag)


@contextlib.contextmanager
def wanting_memory(pin: Pin | None) -> Iterator[None]:
    """Inside the block (held by the memory turn's holder), the other workers on this GPU empty their caches after
    each example (``memory_wanted``). A no-op outside xdist GPU slots."""
    flag = _wanted_flag(pin) if pin is not None else None
    if flag is None:
        yield
        return
    Path(flag).touch()
    try:
        yield
    finally:
        Path(flag).unlink(missing_ok=True)
