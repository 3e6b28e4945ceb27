"""``--impl`` points the whole property suite at another implementation."""

import subprocess
import tempfile

import pytest

from gqa_decode_fuzz.engine import devices
from gqa_decode_fuzz.engine.target import DeviceError, ImplSpecError, confirm_device, device_type, load_impl
from tests.pytest_runs import ROOT, clean_environment, run_module, run_pytest


def run_suite(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as failures:  # case files of expected failures stay out of the checkout
        env = clean_environment(GQA_DECODE_FAILURES_DIR=failures, GQA_DECODE_REPORT_DIR="none")
        return run_pytest("properties/test_decode.py", "-n0", "--hypothesis-profile=ci", *args, env=env)


def test_file_path_impl_passes_when_correct():
    result = run_suite("--impl", "tests/impls/torch_float32.py:run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "impl=tests/impls/torch_float32.py:run" in result.stdout


def test_module_impl_fails_when_lse_is_natural_log(tmp_path):
    (tmp_path / "natural_lse.py").write_text(
        "import math\n"
        "from tests.impls.torch_float32 import run as correct\n"
        "def run(*args):\n"
        "    output, lse = correct(*args)\n"
        "    return output, lse * math.log(2.0)\n"
    )
    result = run_suite("--impl", f"{tmp_path / 'natural_lse.py'}:run", "-x")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "lse not within bound" in result.stdout


@pytest.mark.parametrize(
    "spec, message",
    [
        ("kernel", "expected 'package.module:function'"),
        ("no_such_module:run", "cannot import module"),
        ("kernel:no_such_function", "has no callable"),
        ("missing/file.py:run", "no such file"),
    ],
)
def test_bad_impl_spec_names_the_problem(spec, message):
    with pytest.raises(ImplSpecError, match=message):
        load_impl(spec, root=ROOT)


def test_bad_impl_spec_is_a_usage_error():
    result = run_suite("--impl", "kernel:no_such_function")
    assert result.returncode == 4
    assert "has no callable" in result.stderr


def test_declared_knobs_are_drawn_per_example_and_explicit_examples_use_the_default(tmp_path):
    seen = tmp_path / "seen.txt"
    (tmp_path / "with_knobs.py").write_text(
        "from tests.impls.torch_float32 import run as correct\n"
        "def run(*args, flavour):\n"
        f"    with open({str(seen)!r}, 'a') as log:\n"
        "        log.write(flavour + '\\n')\n"
        "    return correct(*args)\n"
        "run.knobs = {'flavour': ('plain', 'spiced')}\n"
    )
    result = run_suite("properties/test_edge_shapes.py::test_batch_zero_gives_empty_results",
                       f"--impl={tmp_path / 'with_knobs.py'}:run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "declares knobs flavour" in result.stdout
    drawn = seen.read_text().split()
    assert drawn[0] == "plain" and set(drawn) == {"plain", "spiced"}, drawn  # the @example first, at the default


def test_a_knob_that_breaks_the_kernel_is_in_its_case_file_its_replay_and_its_cause(tmp_path):
    """The knob values an example drew are recorded with its calls: the replay and the root-cause probes call
    the implementation with them (with the defaults a failure only one value gives "passed when probed"), and
    the cause names the knob value it needs (its default passes)."""
    (tmp_path / "spiced_is_wrong.py").write_text(
        "from tests.impls.torch_float32 import run as correct\n"
        "def run(*args, flavour):\n"
        "    output, lse = correct(*args)\n"
        "    return (output + 1.0 if flavour == 'spiced' else output), lse\n"
        "run.knobs = {'flavour': ('plain', 'spiced')}\n"
    )
    env = clean_environment(GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"), GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("properties/test_edge_shapes.py::test_single_token_sequences_stay_within_error_bound", "-n0",
                        "--hypothesis-profile=ci", f"--impl={tmp_path / 'spiced_is_wrong.py'}:run", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "flavour='spiced'" in result.stdout and "its own check passed" not in result.stdout, result.stdout
    assert "1. flavour='spiced', any length: 1 property" in result.stdout, result.stdout  # the knob is what it needs
    (case_file,) = (tmp_path / "failures").glob("*.pt")
    replay = run_module("gqa_decode_fuzz.record.repro", str(case_file), "--no-png", env=env)
    assert replay.returncode == 1 and "flavour='spiced'" in replay.stdout, replay.stdout + replay.stderr


def test_a_worker_without_the_runs_cuda_device_fails_instead_of_testing_on_the_cpu():
    """Under MPS a GPU whose faulted processes are still exiting refuses new ones: a replacement worker
    resolving --device=auto itself went to the CPU interpreter while the run said cuda. No GPU is visible here
    (CUDA_VISIBLE_DEVICES=""), so the worker sees none on a GPU host too."""
    env = clean_environment(GQA_DECODE_REPORT_DIR="none", CUDA_VISIBLE_DEVICES="")
    result = run_pytest("-p", "tests.fake_cuda_controller", "properties/test_decode.py", "-n", "1",
                        "--max-worker-restart=0", "--hypothesis-profile=ci", env=env)
    assert result.returncode != 0 and " passed" not in result.stdout, result.stdout
    message = "xdist worker on the run's device: --device=cuda but torch sees no CUDA device"
    assert message in result.stdout + result.stderr


@pytest.mark.parametrize("device", ["auto", "cpu"])
@pytest.mark.parametrize("warm", ["off", "on"])
def test_the_xdist_controller_starts_its_workers_before_loading_the_implementation(tmp_path, device, warm):
    """Its workers start at once; it loads the implementation (and checks it) while they start. Fresh workers
    (``--warm-workers=off``) start before it imports torch too; warm ones wait for their server's imports of torch
    and Triton, and it makes its own meanwhile, in a thread (how far it has got varies)."""
    log = tmp_path / "imported.txt"
    env = clean_environment(GQA_DECODE_REPORT_DIR="none", SPAWN_IMPORTS_LOG=str(log))
    result = run_pytest("-p", "tests.spawn_imports", "properties/test_edge_shapes.py", "-n", "2", f"--device={device}",
                        "--hypothesis-profile=ci", "-k", "test_batch_zero_gives_empty_results",
                        f"--warm-workers={warm}", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    imported = log.read_text().split()
    assert imported == ["none"] if warm == "off" else "gqa_decode_fuzz.kernel" not in imported
    import torch

    expected = "cuda" if device == "auto" and torch.cuda.is_available() else "cpu"
    assert f"device={expected} " in result.stdout  # the header still names the device


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module:run", "cannot import module"),  # found out before the workers start
    ("kernel:no_such_function", "has no callable"),  # once they are starting
])
def test_bad_impl_spec_is_a_usage_error_under_xdist(spec, message):
    env = clean_environment(GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("properties/test_decode.py", "-n", "2", "--device=cpu", f"--impl={spec}", env=env)
    assert result.returncode == 4, result.stdout + result.stderr
    assert f"--impl='{spec}'" in result.stderr and message in result.stderr
    assert "node down" not in result.stdout  # the workers' own failures are not reported


def test_cuda_without_cuda_is_a_usage_error_under_xdist():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_pytest("properties/test_decode.py", "-n", "2", "--device=cuda",
                        env=clean_environment(GQA_DECODE_REPORT_DIR="none"))
    assert result.returncode == 4
    assert "--device=cuda but torch sees no CUDA device" in result.stderr


@pytest.mark.parametrize("warm", ["off", "on"])  # loaded at its collection step, or in a thread beside the workers
def test_an_xdist_controller_says_what_the_implementation_declares(tmp_path, warm):
    """It prints what an isolated implementation declares, told by a child of its own, and then stops that child:
    the run ends (its exit would wait on the child)."""
    (tmp_path / "with_knobs.py").write_text(
        "from tests.impls.torch_float32 import run as correct\n"
        "def run(*args, flavour):\n"
        "    return correct(*args)\n"
        "run.knobs = {'flavour': ('plain', 'spiced')}\n"
    )
    result = run_pytest("properties/test_edge_shapes.py", "-n", "2", "--hypothesis-profile=ci",
                        "-k", "test_batch_zero_gives_empty_results", f"--impl={tmp_path / 'with_knobs.py'}:run",
                        f"--warm-workers={warm}", env=clean_environment(GQA_DECODE_REPORT_DIR="none"), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gqa-decode: the implementation declares knobs flavour" in result.stdout


def test_the_controller_chooses_the_device_without_torch_and_torch_confirms_it(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    assert device_type("auto") == "cuda" and device_type("cuda") == "cuda" and device_type("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="--device=auto: the CUDA driver reports a GPU but torch sees none"):
        confirm_device("auto", "cuda")
    with pytest.raises(DeviceError, match="--device=cuda but torch sees no CUDA device"):
        confirm_device("cuda", "cuda")
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    assert device_type("auto") == "cpu"
    with pytest.raises(DeviceError, match="--device=cuda but torch sees no CUDA device"):
        device_type("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(DeviceError, match="the CUDA driver reports none but torch sees a CUDA device"):
        confirm_device("auto", "cpu")


def test_the_suite_runs_with_xdist_not_loaded():
    """``-p no:xdist`` drops xdist's options, which xdist's own role helpers read."""
    result = run_pytest("-p", "no:xdist", "properties/test_edge_shapes.py", "-k", "batch_zero", "--run-report=none")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "passed" in result.stdout.splitlines()[-1]
