"""GPU pinning of xdist workers, what -n auto means, and properties split into shards."""

import argparse
import contextlib
import ctypes
import os
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gqa_decode_fuzz.engine import devices
from gqa_decode_fuzz.engine.examples import Shard
from gqa_decode_fuzz.runner import gpus, shards
from gqa_decode_fuzz.runner.plugin import count_or_auto
from tests.pytest_runs import ROOT, clean_environment, run_pytest


@pytest.fixture
def slots(tmp_path):
    yield tmp_path
    gpus.release_slots()


def test_workers_spread_over_gpus_before_doubling_up(slots):
    pins = [gpus.claim_slot(f"gw{n}", ["0", "1"], 2, slots).gpu for n in range(4)]
    assert pins == ["0", "1", "0", "1"]


def test_a_replacement_worker_takes_the_gpu_a_crashed_worker_left(slots):
    assert gpus.claim_slot("gw0", ["0", "1"], 1, slots).gpu == "0"
    gpus.release_slots()  # gw0 dies: its lock goes with it
    assert gpus.claim_slot("gw1", ["0", "1"], 1, slots).gpu == "1"
    # gw2 (the replacement) would start at slot 0 anyway; gw3 starts at slot 1, held by gw1.
    assert gpus.claim_slot("gw3", ["0", "1"], 1, slots).gpu == "0"


def test_more_workers_than_slots_share_round_robin(slots):
    gpus.claim_slot("gw0", ["0"], 1, slots)
    pin = gpus.claim_slot("gw1", ["0"], 1, slots)
    assert pin.gpu == "0" and pin.slot == "gpu0-gw1"


def test_worker_is_pinned_and_shares_the_triton_cache(monkeypatch, slots):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv(gpus.GPU_IDS_ENV, "3,5")
    monkeypatch.setenv(gpus.SLOTS_DIR_ENV, str(slots))
    monkeypatch.setenv(gpus.WORKERS_PER_GPU_ENV, "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(slots / "cache"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pin = gpus.pin_this_worker()
    assert pin.gpu == "5" and os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert os.environ["TRITON_CACHE_DIR"] == str(slots / "cache")  # one cache: what any worker compiled, all load


@pytest.mark.parametrize(("workers", "gpu_ids", "shared"), [("16", "0", True), ("3", "0,1", True), ("2", "0,1", False)])
def test_a_worker_knows_whether_it_shares_its_gpu(monkeypatch, workers, gpu_ids, shared):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    monkeypatch.setenv(gpus.GPU_IDS_ENV, gpu_ids)
    assert gpus.shares_its_gpu(gpus.Pin(gpu="0", slot="gpu0-0")) is shared
    assert not gpus.shares_its_gpu(None) and not gpus.shares_its_gpu(gpus.Pin(gpu=None, slot="gw0"))


def _shared_run(monkeypatch, tmp_path, free: int, calls: list):
    """A stand-in SuiteRun on a GPU two workers share, ``free`` of 1000 bytes free, its cache emptyings in
    ``calls``."""
    import torch

    from gqa_decode_fuzz.runner.suite_run import SuiteRun

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, 1000))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("emptied"))
    run = argparse.Namespace(state=argparse.Namespace(device=torch.device("cuda")), shares_gpu=True,
                             pin=gpus.Pin(gpu="0", slot="gpu0-1", slots_dir=tmp_path))
    run._release_cache_if_short = lambda: SuiteRun._release_cache_if_short(run)
    return run


@pytest.mark.parametrize(("free", "wanted", "emptied"), [(200, False, True), (400, False, False), (400, True, True)])
def test_a_worker_on_a_shared_gpu_empties_its_cache_when_memory_is_short_or_wanted(monkeypatch, tmp_path, free,
                                                                                  wanted, emptied):
    from gqa_decode_fuzz.runner.suite_run import SuiteRun

    calls = []
    run = _shared_run(monkeypatch, tmp_path, free, calls)
    example = SuiteRun.sharing_memory(run, lambda value: value * 2)
    with gpus.wanting_memory(gpus.Pin(gpu="0", slot="gpu0-0", slots_dir=tmp_path)) if wanted \
            else contextlib.nullcontext():
        assert example(21) == 42 and calls == (["emptied"] if emptied else [])
    assert not gpus.memory_wanted(run.pin)  # the flag goes with the turn


class _OneCall:
    """A child's end of the pipe that brings one call of ``args`` and then the order to stop."""

    def __init__(self, args: tuple) -> None:
        from gqa_decode_fuzz.engine.isolated_impl import _ambient  # the parent's settings, as a call carries them

        self.messages, self.sent = [("call", None, args, {}, _ambient()), ("stop",)], []

    def recv(self):
        return self.messages.pop(0)

    def send(self, reply) -> None:
        self.sent.append(reply)


@pytest.mark.parametrize(("free", "emptied"), [(200, True), (400, False)])
def test_an_isolated_child_empties_its_cache_after_a_call_when_memory_is_short(monkeypatch, free, emptied):
    import torch

    from gqa_decode_fuzz.engine import isolation_child

    calls = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, 1000))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("emptied"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *device: None)
    connection = _OneCall((21,))
    isolation_child._serve(connection, lambda value: value * 2, torch.device("cuda"), own_copies=False)
    assert connection.sent == [("result", 42)] and calls == (["emptied"] if emptied else [])


def test_running_out_of_memory_anywhere_in_an_example_on_a_shared_gpu_is_the_runs_limit(monkeypatch, tmp_path):
    import torch

    from gqa_decode_fuzz.generation.cases import SuiteOutOfMemory
    from gqa_decode_fuzz.runner.suite_run import SuiteRun

    def example(error):  # e.g. a check's or a metamorphic property's second build's allocation
        raise error

    shared = SuiteRun.sharing_memory(_shared_run(monkeypatch, tmp_path, 400, []), example)
    with pytest.raises(SuiteOutOfMemory, match="ran out of memory in the suite's work"):
        shared(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    with pytest.raises(AssertionError, match="not within bound"):  # a property's failure stays one
        shared(AssertionError("output not within bound"))


@pytest.mark.parametrize("shares_gpu", [True, False])
def test_a_huge_example_short_of_memory_asks_the_others_and_runs_once_more(monkeypatch, tmp_path, shares_gpu):
    import torch

    from gqa_decode_fuzz.generation.cases import SuiteOutOfMemory
    from gqa_decode_fuzz.runner import suite_run

    run = _shared_run(monkeypatch, tmp_path, 400, calls := [])
    run.shares_gpu = shares_gpu
    monkeypatch.setattr(suite_run, "_wait_for_released_memory", lambda device: calls.append("waited"))
    attempts = []

    def check(size):
        attempts.append(gpus.memory_wanted(run.pin))
        if len(attempts) == 1:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size}")
        return size

    if not shares_gpu:  # alone on its GPU: no one to ask, the error is the example's
        with pytest.raises(torch.OutOfMemoryError):
            suite_run.SuiteRun.in_memory_turn(run, check, "6.79 GiB")
        assert attempts == [False]
        return
    assert suite_run.SuiteRun.in_memory_turn(run, check, "6.79 GiB") == "6.79 GiB"
    assert attempts == [False, True] and calls == ["emptied", "waited", "emptied"]
    assert not gpus.memory_wanted(run.pin)
    with pytest.raises(SuiteOutOfMemory):  # short twice: the run's limit (the example's own wrapper says so)
        attempts.clear()
        suite_run.SuiteRun.in_memory_turn(run, lambda: (_ for _ in ()).throw(SuiteOutOfMemory("6.79 GiB")))


@pytest.mark.parametrize("in_child", [False, True])
def test_an_implementation_out_of_memory_on_a_shared_gpu_is_the_runs_limit(in_child):
    import torch

    from gqa_decode_fuzz.generation.cases import SuiteOutOfMemory
    from gqa_decode_fuzz.runner.suite_run import on_a_shared_gpu

    def impl(*args):
        if in_child:  # an isolated child's error, re-raised in the parent as the nearest built-in class
            raise RuntimeError("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    with pytest.raises(SuiteOutOfMemory, match="ran out of memory in the implementation's call"):
        on_a_shared_gpu(impl)()


def test_an_implementations_other_errors_stay_its_own():
    from gqa_decode_fuzz.runner.suite_run import on_a_shared_gpu

    def impl(*args):
        raise ValueError("kv_indptr must start at 0")

    with pytest.raises(ValueError, match="kv_indptr"):
        on_a_shared_gpu(impl)()


def test_cpu_worker_gets_no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    monkeypatch.delenv(gpus.GPU_IDS_ENV, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    assert gpus.pin_this_worker() == gpus.Pin(gpu=None, slot="gw2")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path)


@pytest.mark.parametrize("per_gpu, sleeps", [("1", False), ("8", True)])
def test_workers_sharing_a_gpu_wait_asleep(monkeypatch, slots, per_gpu, sleeps):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv(gpus.GPU_IDS_ENV, "0")
    monkeypatch.setenv(gpus.SLOTS_DIR_ENV, str(slots))
    monkeypatch.setenv(gpus.WORKERS_PER_GPU_ENV, per_gpu)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    calls = []
    monkeypatch.setattr(devices, "sleep_while_waiting", lambda: calls.append(os.environ["CUDA_VISIBLE_DEVICES"]))
    gpus.pin_this_worker()
    assert calls == (["0"] if sleeps else [])  # after the pin: the driver sees the worker's GPU only


class _Driver:
    """libcuda stand-in: ``devices`` GPUs; ``refuse`` makes cuDevicePrimaryCtxSetFlags_v2 fail."""

    def __init__(self, devices: int, refuse: bool = False):
        self.devices, self.refuse, self.flags = devices, refuse, {}

    def cuInit(self, flags):  # noqa: N802 - the driver's names
        return 0

    def cuDeviceGetCount(self, count):  # noqa: N802
        ctypes.cast(count, ctypes.POINTER(ctypes.c_int))[0] = self.devices
        return 0

    def cuDeviceGet(self, device, ordinal):  # noqa: N802
        ctypes.cast(device, ctypes.POINTER(ctypes.c_int))[0] = 100 + ordinal
        return 0

    def cuDevicePrimaryCtxSetFlags_v2(self, device, flags):  # noqa: N802
        self.flags[device.value] = flags
        return 101 if self.refuse else 0


@pytest.mark.parametrize("count", [1, 3])
def test_every_visible_device_gets_blocking_synchronisation(monkeypatch, count):
    driver = _Driver(count)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: driver)
    assert devices.sleep_while_waiting()
    assert driver.flags == {100 + i: 0x04 for i in range(count)}  # CU_CTX_SCHED_BLOCKING_SYNC


def test_a_refused_flag_or_no_driver_is_reported(monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _Driver(2, refuse=True))
    assert not devices.sleep_while_waiting()

    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_driver)
    assert not devices.sleep_while_waiting() and devices.driver_device_count() == 0


def test_visible_gpu_ids_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert gpus.visible_gpu_ids(2) == ["2", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpus.visible_gpu_ids(2) == ["0", "1"]


def test_auto_means_workers_per_gpu_times_gpus_and_the_core_count_without_cuda(monkeypatch):
    assert gpus.auto_worker_count("cpu", 2) is None
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    assert gpus.auto_worker_count("auto", 1) == 2
    assert gpus.auto_worker_count("cuda", 3) == 6
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    assert gpus.auto_worker_count("auto", 1) is None


@pytest.mark.parametrize("visible", [None, "", "0", "0,1", "1,0", "0,0", "-1", "GPU-no-such-uuid", "MIG-no-such-uuid"])
def test_gpus_are_counted_without_torch_as_torch_counts_them(visible):
    """The controller counts GPUs before importing torch (-n auto, the workers' device); in a fresh process, as
    CUDA reads CUDA_VISIBLE_DEVICES once, the count matches torch's on whatever machine this runs (on a CUDA host
    the driver's count; on a CPU build 0)."""
    env = clean_environment()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    script = ("import sys; from gqa_decode_fuzz.engine import devices; ours = devices.cuda_device_count(); "
              "assert 'torch' not in sys.modules or devices.torch_build() is None; import torch; "
              "print(ours, torch.cuda.device_count() if torch.cuda.is_available() else 0)")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    ours, torchs = done.stdout.split()
    assert ours == torchs


@pytest.mark.parametrize(("text", "build"), [
    ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", "cuda"),
    ("cuda = None\nhip = None\n", "cpu"),
    ("cuda: Optional[str] = None\nhip: Optional[str] = '6.2.4'\n", None),  # ROCm: torch.cuda runs on HIP
    ("__version__ = '2.13.0'\n", None),
    ("cuda = compute()\n", None),
])
def test_torch_build_is_read_from_its_version_file(tmp_path, text, build):
    (tmp_path / "version.py").write_text(text)
    assert devices.torch_build(tmp_path / "version.py") == build
    assert devices.torch_build(tmp_path / "missing.py") is None


def test_shard_count_follows_the_workers_unless_given(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    assert shards.resolved_shard_count(count_or_auto("auto")) == 4
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT")
    assert shards.resolved_shard_count(count_or_auto("auto")) == 1
    assert shards.resolved_shard_count(count_or_auto("3")) == 3
    for bad in ("0", "many"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a positive whole number"):
            count_or_auto(bad)


def test_each_shard_runs_its_share_of_the_examples():
    own = settings(max_examples=40)
    assert shards.shard_settings(own, shard=Shard(0, 4), profile_max_examples=40, max_examples=None).max_examples == 10
    assert shards.shard_settings(own, shard=Shard(2, 3), profile_max_examples=40, max_examples=None).max_examples == 14
    half = settings(max_examples=20)  # a property that runs half the profile's examples keeps its half
    assert shards.shard_settings(half, shard=Shard(0, 4), profile_max_examples=40, max_examples=400) \
        .max_examples == 50


def _drawn(shard: Shard | None, derandomize: bool) -> list[int]:
    seen = []

    @settings(max_examples=8, derandomize=derandomize, database=None)
    @given(st.integers(0, 10**9))
    def draws(value):
        seen.append(value)

    with shards.sharded(draws, "tests/x.py::draws", shard=shard, profile_max_examples=8, max_examples=None):
        draws()
    return seen


def test_derandomized_shards_draw_different_examples_and_the_same_ones_every_run():
    first, second = _drawn(Shard(0, 2), True), _drawn(Shard(1, 2), True)
    assert len(first) <= 4 and set(first) != set(second)
    assert _drawn(Shard(0, 2), True) == first


def test_explicit_examples_run_in_the_first_shard_only():
    """They are the same in every shard; the huge pools' would otherwise take the GPU's memory turn once a shard."""
    seen = []

    @settings(max_examples=4, derandomize=True, database=None)
    @given(st.integers(0, 10**9))
    @example(-1)
    def draws(value):
        seen.append(value)

    for index in range(3):
        with shards.sharded(draws, "tests/x.py::draws", shard=Shard(index, 3), profile_max_examples=4,
                            max_examples=None):
            draws()
    assert seen.count(-1) == 1 and seen[0] == -1 and len(seen) > 3


def test_sharding_restores_the_tests_own_settings():
    @settings(max_examples=8)
    @given(st.integers())
    def draws(value):
        pass

    with shards.sharded(draws, "x", shard=Shard(0, 2), profile_max_examples=8, max_examples=None):
        assert draws._hypothesis_internal_use_settings.max_examples == 4
    assert draws._hypothesis_internal_use_settings.max_examples == 8
    assert draws._hypothesis_internal_use_seed is None


def test_properties_are_collected_as_shards_and_other_tests_are_not():
    result = run_pytest("--collect-only", "-q", "--shards=3", "properties/test_decode.py", "tests/test_oracle.py",
                        env=clean_environment(GQA_DECODE_REPORT_DIR="none"))
    ids = [line for line in result.stdout.splitlines() if "::" in line]
    assert result.returncode == 0, result.stdout + result.stderr
    within = [i for i in ids if "test_output_and_lse_within_error_bound" in i]
    assert within == [f"properties/test_decode.py::test_output_and_lse_within_error_bound[shard{n}of3]"
                      for n in (1, 2, 3)]
    assert "tests/test_oracle.py::test_oracle_matches_naive_per_head_loop" in ids


def test_bad_shard_count_is_a_usage_error():
    result = run_pytest("--collect-only", "-q", "--shards=0", "properties/test_decode.py")
    assert result.returncode == 4 and "--shards: '0': expected a positive whole number" in result.stderr


def test_auto_workers_per_gpu_are_three_for_four_cores_up_to_the_measured_knee():
    assert gpus.workers_per_gpu(3, 2) == 3
    assert gpus.workers_per_gpu("auto", 1, cores=16) == 12  # one H200 (or H100) with 16 cores
    assert gpus.workers_per_gpu("auto", 2, cores=32) == 12  # two with 32 cores
    assert gpus.workers_per_gpu("auto", 8, cores=64) == 6
    assert gpus.workers_per_gpu("auto", 1, cores=128) == gpus.MEASURED_KNEE
    assert gpus.workers_per_gpu("auto", 4, cores=8) == 1


def _no_thread_counts(monkeypatch) -> None:
    """None of ``gpus.THREADS_ENV`` set, and each restored after the test (``share_cores`` sets them)."""
    for name in gpus.THREADS_ENV:
        monkeypatch.setenv(name, "0")  # recorded, so that what the test leaves is undone
        monkeypatch.delenv(name)


@pytest.mark.parametrize(("workers", "user_threads", "expected"), [(2, None, "share"), (64, None, 1), (2, "3", None)])
def test_each_worker_takes_its_share_of_the_cores(monkeypatch, workers, user_threads, expected):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    _no_thread_counts(monkeypatch)
    if user_threads is not None:
        monkeypatch.setenv("OMP_NUM_THREADS", user_threads)
    before = torch.get_num_threads()
    try:
        threads = gpus.share_cores()
        share = max(1, len(os.sched_getaffinity(0)) // workers)
        assert threads == (share if expected == "share" else expected)
        assert torch.get_num_threads() == (before if threads is None else threads)  # torch loaded first: set
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("user", "expected"), [({}, "share"), ({"OMP_NUM_THREADS": "3"}, None),
                                                 ({"OPENBLAS_NUM_THREADS": "3"}, "share")])
def test_each_worker_exports_its_share_for_numpys_blas_and_the_processes_it_starts(monkeypatch, user, expected):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    _no_thread_counts(monkeypatch)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    before = torch.get_num_threads()
    try:
        assert gpus.share_cores() == (int(share) if expected else None)
    finally:
        torch.set_num_threads(before)
    if expected:  # a user's own BLAS count stays
        assert os.environ["OMP_NUM_THREADS"] == share and os.environ["MKL_NUM_THREADS"] == share
        assert os.environ["OPENBLAS_NUM_THREADS"] == user.get("OPENBLAS_NUM_THREADS", share)
    else:
        assert all(os.environ.get(name) == user.get(name) for name in gpus.THREADS_ENV)


def test_a_worker_has_exported_its_share_before_anything_loaded_numpy_or_torch(tmp_path):
    """End to end: the plugin's import in an xdist worker comes before numpy's and torch's, so the share takes
    effect in their pools, and what the worker starts inherits it."""
    (tmp_path / "test_share.py").write_text(
        "import os\nimport sys\n\nSHARE = str(max(1, len(os.sched_getaffinity(0)) // 2))\n\n\n"
        "def test_share():\n"
        "    assert os.environ.get('OMP_NUM_THREADS') == SHARE and os.environ.get('OPENBLAS_NUM_THREADS') == SHARE\n"
        "    import torch\n\n    assert str(torch.get_num_threads()) == SHARE\n")
    env = clean_environment(GQA_DECODE_REPORT_DIR="none")
    for name in gpus.THREADS_ENV:
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-q", "test_share.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
