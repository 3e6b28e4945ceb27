"""A faulting kernel gives one failing test with its case file; later tests run in a fresh process.

The fault is simulated (tests/impls/simulated_cuda_fault.py raises CUDA's message for an
illegal address and stays "poisoned"), so the containment path runs on CPU; on a GPU the
same path handles a real fault (docs/gpu.md has the command with a faulting kernel).

These runs trust the implementation in-process (``--isolation=off``), as the suite does for its own kernel: an
isolated implementation's fault is a failure of its example instead (tests/test_isolation.py).
"""

import re

from gqa_decode_fuzz.engine.containment import CudaContextLost, is_sticky_cuda_error
from gqa_decode_fuzz.record import casefiles
from tests.impls.simulated_cuda_fault import MESSAGE
from tests.pytest_runs import clean_environment, run_pytest

CASES = "tests/containment_cases.py"
IMPL = "--impl=tests/impls/simulated_cuda_fault.py:run"


def _run(tmp_path, *args):
    env = clean_environment(GQA_DECODE_ISOLATION="off", GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR="none")
    return run_pytest(CASES, IMPL, "--device=cpu", "--hypothesis-profile=ci", *args, env=env)


def _saved_case(tmp_path) -> dict:
    files = sorted((tmp_path / "failures").glob("*.pt"))
    assert len(files) == 1, files
    return casefiles.load_case(files[0])


def test_sticky_errors_are_recognised_and_others_are_not():
    assert is_sticky_cuda_error(RuntimeError(MESSAGE))
    assert is_sticky_cuda_error(RuntimeError("Triton Error [CUDA]: misaligned address"))
    assert not is_sticky_cuda_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_sticky_cuda_error(ValueError("an illegal memory access was encountered"))
    assert issubclass(CudaContextLost, BaseException) and not issubclass(CudaContextLost, Exception)


def _assert_the_faulting_example_was_saved(tmp_path):
    saved = _saved_case(tmp_path)
    lengths = saved["case_fields"]["lengths"]
    # The example that faulted, not one "shrunk" inside a poisoned context (those fault regardless).
    assert len(lengths) >= 2 and min(lengths) >= 3, saved["case_repr"]
    # Device memory is unreadable after a fault: the call's inputs are rebuilt from the case descriptor.
    assert saved["calls"] and all(arg == {"built": name} for arg, name in
                                  zip(saved["calls"][-1]["args"], ("q", "k_cache", "v_cache", "kv_indptr")))
    assert MESSAGE in saved["error"]


def test_fault_under_xdist_crashes_one_worker_and_the_next_test_runs_in_a_fresh_one(tmp_path):
    result = _run(tmp_path, "-n", "1")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "1 failed, 1 passed" in result.stdout, output
    assert "crashed while running 'tests/containment_cases.py::test_first_kernel_faults'" in result.stdout, output
    assert "replacing crashed worker" in output
    assert "python -m gqa_decode_fuzz.record.repro" in result.stdout, output
    _assert_the_faulting_example_was_saved(tmp_path)


def test_fault_without_xdist_stops_the_session_after_that_test(tmp_path):
    result = _run(tmp_path, "-n", "0")
    assert result.returncode == 2, result.stdout + result.stderr  # pytest's "interrupted"
    assert "1 failed" in result.stdout and "passed" not in result.stdout.splitlines()[-1], result.stdout
    assert "Interrupted: the CUDA context was lost in tests/containment_cases.py::test_first_kernel_faults" \
        in result.stdout
    assert "python -m gqa_decode_fuzz.record.repro" in result.stdout
    _assert_the_faulting_example_was_saved(tmp_path)


def test_healthy_kernel_runs_both_cases(tmp_path):
    env = clean_environment(GQA_DECODE_ISOLATION="off", GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR="none")
    result = run_pytest(CASES, "--impl=tests/impls/torch_float32.py:run", "--device=cpu",
                        "--hypothesis-profile=ci", "-n", "0", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "failures").exists()


def test_an_error_raised_after_the_fault_does_not_replace_it(tmp_path):
    env = clean_environment(GQA_DECODE_ISOLATION="off", GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("tests/containment_cleanup_cases.py", IMPL, "--device=cpu", "--hypothesis-profile=ci",
                        "-n", "0", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "1 failed" in result.stdout and "passed" not in result.stdout.splitlines()[-1], result.stdout
    raised = [line for line in result.stdout.splitlines() if re.match(r"E\s+[\w.]+(Error|Lost):", line)]
    assert "CudaContextLost" in raised[-1], result.stdout  # what the test finally raised: the lost context
    _assert_the_faulting_example_was_saved(tmp_path)


def test_shards_of_a_crashing_property_give_one_report(tmp_path):
    result = _run(tmp_path, "-n", "2", "--shards=2", "-rfs")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 1 and "test_first_kernel_faults" in failed[0], output
    assert "test_second_runs_in_a_healthy_process" not in " ".join(failed)
    _assert_the_faulting_example_was_saved(tmp_path)


def test_the_suite_running_out_of_memory_is_an_infrastructure_error_not_a_failure(tmp_path):
    env = clean_environment(GQA_DECODE_ISOLATION="off", GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("tests/infrastructure_cases.py", "--impl=tests/impls/torch_float32.py:run", "--device=cpu",
                        "--hypothesis-profile=ci", "-n", "0", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 errors" in result.stdout and "failed" not in result.stdout.splitlines()[-1], result.stdout
    assert "the suite could not allocate the float64 oracle of a call of 2 sequences" in result.stdout, result.stdout
    assert "SuiteOutOfMemory" in result.stdout and not (tmp_path / "failures").exists()


def test_a_fault_that_surfaces_after_the_call_is_contained_too(tmp_path):
    """A sticky error raised where the example reads the result (as a GPU's asynchronous fault, or under MPS
    another process's fault, surfaces at the next synchronisation), not inside the guarded call."""
    env = clean_environment(GQA_DECODE_ISOLATION="off", GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"),
                            GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("properties/test_decode.py::test_output_and_lse_within_error_bound", "--device=cpu",
                        "--impl=tests/impls/asynchronous_cuda_fault.py:run", "--hypothesis-profile=ci", "-n", "0",
                        env=env)
    assert result.returncode == 2, result.stdout + result.stderr  # the session stops
    assert "Interrupted: the CUDA context was lost in properties/test_decode.py" in result.stdout, result.stdout
    # Contained at the first such example: Hypothesis neither shrinks nor replays it in a dead context.
    raised = [line for line in result.stdout.splitlines() if re.match(r"E\s+[\w.]+(Error|Lost):", line)]
    assert "CudaContextLost" in raised[-1] and "Failing test case" not in result.stdout, result.stdout
    assert len(list((tmp_path / "failures").glob("*.pt"))) == 1


class _Device:
    """torch.cuda.synchronize stand-in: counts waits and raises ``fault`` (once set) at the next one."""

    def __init__(self):
        self.waits, self.fault = 0, None

    def synchronize(self):
        self.waits += 1
        if self.fault:
            raise RuntimeError(self.fault)


def _guard_on_a_pretend_gpu(monkeypatch):
    import torch

    from gqa_decode_fuzz.engine.containment import Guard

    device = _Device()
    monkeypatch.setattr(torch.cuda, "synchronize", device.synchronize)
    saved = []
    guard = Guard(torch.device("cuda"), save=lambda message: saved.append(message), nodeid=lambda: "test_x",
                  in_worker=False, replay=lambda path: "")
    return guard, device, saved


def test_an_example_waits_for_its_calls_once_at_its_end(monkeypatch):
    """One wait per example that called the implementation, however many calls: each is a GPU turn."""
    guard, device, _ = _guard_on_a_pretend_gpu(monkeypatch)
    impl = guard.wrap(lambda x: x, on_call=lambda args, kwargs: None)
    calls_then_wait = guard.shielding(lambda: [impl(1), impl(2), device.waits][-1])
    assert calls_then_wait() == 0 and device.waits == 1
    guard.shielding(lambda: None)()
    assert device.waits == 1  # no call, no wait


def test_a_fault_pending_at_the_end_of_an_example_is_charged_to_it(monkeypatch):
    """A fault still running when the example ends is contained there, even if the example failed otherwise."""
    guard, device, saved = _guard_on_a_pretend_gpu(monkeypatch)
    impl = guard.wrap(lambda: None, on_call=lambda args, kwargs: None)

    def fails_after_the_call():
        impl()
        raise AssertionError("a mismatch read from a result the fault wrote")

    device.fault = MESSAGE
    try:
        guard.shielding(fails_after_the_call)()
    except CudaContextLost as lost:
        assert MESSAGE in str(lost) and len(saved) == 1
    else:
        raise AssertionError("the pending fault was not contained")
