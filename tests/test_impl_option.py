"""``--impl`` points the whole property suite at another implementation."""

import subprocess
import tempfile

import pytest

from properties._plugin.target import ImplSpecError, load_impl
from tests.pytest_runs import ROOT, clean_environment, run_pytest


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


def test_a_worker_without_the_runs_cuda_device_fails_instead_of_testing_on_the_cpu():
    """Under MPS a GPU whose faulted processes are still exiting refuses new ones: a replacement worker
    resolving --device=auto itself went to the CPU interpreter while the run said cuda."""
    env = clean_environment(GQA_DECODE_REPORT_DIR="none")
    result = run_pytest("-p", "tests.fake_cuda_controller", "properties/test_decode.py", "-n", "1",
                        "--max-worker-restart=0", "--hypothesis-profile=ci", env=env)
    assert result.returncode != 0 and " passed" not in result.stdout, result.stdout
    message = "xdist worker on the run's device: --device=cuda but torch sees no CUDA device"
    assert message in result.stdout + result.stderr
