"""Warm workers (``runner/warm_workers.py``): a worker forked by the run's server is, to whoever started its
launcher, that launcher's process running ``python -u -c CODE``; without a server, the launcher runs it fresh."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gqa_decode_fuzz.runner import warm_workers
from tests.pytest_runs import clean_environment, run_pytest

pytestmark = pytest.mark.skipif(not warm_workers.supported(), reason="needs fork and Unix descriptor passing")

# What a worker reports of itself: its parent, whether torch came with it, argv, the folder, one variable, a line read.
REPORT = ("import os, sys; print(os.getppid(), 'torch' in sys.modules, sys.argv, os.getcwd(), os.environ.get('MARK'),"
          " sys.modules['__main__'].__dict__.get('__file__'), input(), flush=True)")


@pytest.fixture(scope="module")
def server():
    started = warm_workers.start(["popen", "popen"], dict(os.environ))
    assert started is not None
    yield started
    assert started.stop() is None  # it ran to its stop


def _launcher(server: warm_workers.Server) -> list[str]:
    return shlex.split(server.spec().split("python=", 1)[1])


def test_a_forked_worker_runs_its_code_with_the_launchers_streams_folder_and_environment(server, tmp_path):
    result = subprocess.run([*_launcher(server), "-u", "-c", REPORT + "; sys.exit(3)"], input="a line\n",
                            capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, MARK="here"),
                            timeout=120)
    assert result.returncode == 3, result.stderr
    parent, torch_loaded, argv, folder, mark, main_file, line = result.stdout.split(maxsplit=6)
    assert int(parent) == server.process.pid
    assert (torch_loaded, argv, folder, mark, main_file, line.strip()) == (
        "True", "['-c']", str(tmp_path), "here", "None", "a line")


def test_a_worker_ended_by_a_signal_ends_its_launcher_by_the_same_signal(server):
    result = subprocess.run([*_launcher(server), "-u", "-c", "import os; os.kill(os.getpid(), 9)"],
                            capture_output=True, timeout=120)
    assert result.returncode == -signal.SIGKILL


def test_a_launcher_that_is_killed_takes_its_worker_with_it(server):
    launcher = subprocess.Popen([*_launcher(server), "-u", "-c", "import os, time; print(os.getpid(), flush=True); "
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    worker = int(launcher.stdout.readline())
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent's wait counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.parametrize("arguments", [
    pytest.param(["-u", "-c"], id="no server"),
    pytest.param(["-X", "dev", "-u", "-c"], id="an option the server cannot mirror"),
])
def test_a_launcher_the_server_cannot_serve_starts_its_worker_fresh(server, tmp_path, arguments):
    socket_path = "/nonexistent/socket" if "-X" not in arguments else str(server.directory / "socket")
    result = subprocess.run([sys.executable, "-I", "-S", warm_workers.__file__, "launch", socket_path, sys.executable,
                             *arguments, REPORT + "; sys.exit(4)"], input="fresh\n", capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 4, result.stderr
    parent, torch_loaded, *_ = result.stdout.split()
    assert int(parent) == os.getpid() and torch_loaded == "False"


@pytest.mark.parametrize("warm", ["on", "off"])
def test_xdist_workers_fork_from_the_runs_server_unless_turned_off(tmp_path, warm):
    log = tmp_path / "parents.txt"
    test_file = tmp_path / "test_parent.py"
    test_file.write_text("import os\n"
                         "def test_parent():\n"
                         "    parent = open(f'/proc/{os.getppid()}/cmdline').read().replace('\\0', ' ')\n"
                         f"    with open({str(log)!r}, 'a') as log:\n"
                         "        log.write(parent + '\\n')\n")
    result = run_pytest(str(test_file), "-n", "2", "--device=cpu", f"--warm-workers={warm}", "--run-report=none",
                        "--rootdir", str(tmp_path), env=clean_environment())
    assert result.returncode == 0, result.stdout + result.stderr
    forked = "warm_workers.py serve" in log.read_text()
    assert forked == (warm == "on")
    assert ("warm workers: each forked" in result.stdout) == (warm == "on")
