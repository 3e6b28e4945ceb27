"""The suite installed as a package: ``pytest --pyargs gqa_decode_fuzz.properties`` from another repository.

Installs this checkout with pip into a temporary directory (no dependencies: they are
this environment's), then runs pytest from an empty directory with only that install on
the path: the ``pytest11`` entry point loads the plugin, and the packages live under
``gqa_decode_fuzz`` (no top-level ``kernel``, ``reference`` or ``properties``). The editable
install (``pip install -e``, the README's quick start) goes into a virtual environment of its
own, whose ``.pth`` files are read, with this environment's packages on its path.
"""

import subprocess
import sys
import sysconfig

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
    assert names == {"gqa_decode_fuzz", "bin"}  # bin/: the console script
    assert (installed / "bin" / "gqa-decode-fuzz").is_file()
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


@pytest.fixture(scope="module")
def editable(tmp_path_factory):
    """A virtual environment with this checkout installed editable (``pip install -e``); its python."""
    venv = tmp_path_factory.mktemp("editable")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (venv / purelib / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: without it pip uninstalls the checkout's install from the environment running the tests
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed",
                    "--prefix", str(venv), "-e", str(ROOT)], check=True, capture_output=True, timeout=600)
    return python


def test_editable_install_runs_a_solution_file_from_another_folder(editable, tmp_path):
    """The checkout's conftest.py is read too (the collected files are the checkout's): it must not register the
    plugin a second time (``ValueError: option names {'--impl'} already added``)."""
    from tests import solution_files

    solution = solution_files.write(tmp_path, "python_returning")
    result = subprocess.run(
        [str(editable), "-m", "pytest", "-p", "no:cacheprovider", "--hypothesis-profile=ci", "-n", "0",
         "--run-report=none", "--max-examples=2", "--pyargs", "gqa_decode_fuzz.properties.test_decode",
         f"--impl={solution}"],
        cwd=tmp_path, env=clean_environment(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "solution 'python_returning'" in result.stdout and "2 passed" in result.stdout
