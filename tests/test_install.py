"""The suite installed as a package: ``pytest --pyargs gqa_decode_fuzz.properties`` from another repository.

Installs this checkout with pip into a temporary directory (no dependencies: they are
this environment's), then runs pytest from an empty directory with only that install on
the path: the ``pytest11`` entry point loads the plugin, and the packages live under
``gqa_decode_fuzz`` (no top-level ``kernel``, ``reference`` or ``properties``).
"""

import subprocess
import sys

import pytest

from tests.pytest_runs import ROOT, clean_environment


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    return site


def _pytest_elsewhere(installed, tmp_path, *args):
    env = clean_environment(PYTHONPATH=str(installed))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hypothesis-profile=ci",
                           "-n", "0", "--run-report=none", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)


def test_installed_packages_live_under_one_name(installed):
    names = {path.name for path in installed.iterdir() if not path.name.endswith(".dist-info")}
    assert names == {"gqa_decode_fuzz"}
    assert {p.name for p in (installed / "gqa_decode_fuzz").iterdir()} >= {"kernel", "reference", "properties"}


def test_installed_plugin_runs_the_properties_against_your_kernel(installed, tmp_path):
    impl = ROOT / "tests" / "impls" / "torch_float32.py"
    result = _pytest_elsewhere(installed, tmp_path, "--pyargs", "gqa_decode_fuzz.properties.test_decode",
                               f"--impl={impl}:run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "contract tier correct" in result.stdout and "2 passed" in result.stdout


def test_installed_default_target_is_the_installed_kernel(installed, tmp_path):
    result = _pytest_elsewhere(installed, tmp_path, "--pyargs", "gqa_decode_fuzz.properties", "--collect-only", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "impl gqa_decode_fuzz.kernel:run" in result.stdout and "contract tier strict" in result.stdout
