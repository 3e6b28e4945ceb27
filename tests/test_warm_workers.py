"""Warm workers (``runner/warm_workers.py``): a worker forked by the run's server is, to whoever started its
launcher, that launcher's process running ``python -u -c CODE``; without a server, the launcher runs it fresh."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
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


def test_an_interrupt_to_the_process_group_leaves_the_server_serving(server):
    served = [*_launcher(server), "-u", "-c", "print('served')"]
    assert subprocess.run(served, capture_output=True, timeout=120).returncode == 0  # the server is up
    os.kill(server.process.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends the run's whole process group
    result = subprocess.run(served, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (0, "served\n") and server.process.poll() is None


def test_a_server_that_dies_before_its_launcher_hears_forked_leaves_one_worker(tmp_path):
    """The forked child waits for its launcher's go; the launcher, told nothing, starts its worker fresh: one
    process runs the code, not two readers of the same pipes."""
    dying = tmp_path / "dying_server.py"  # the server, made to die right after its first fork
    dying.write_text("import os, runpy, socket, sys\n"
                     "sendall = socket.socket.sendall\n"
                     "def die_at_forked(self, data, *args):\n"
                     "    if data.startswith(b'forked'):\n"
                     "        os._exit(1)\n"
                     "    return sendall(self, data, *args)\n"
                     "socket.socket.sendall = die_at_forked\n"
                     f"sys.argv = [{warm_workers.__file__!r}, *sys.argv[1:]]\n"
                     f"runpy.run_path({warm_workers.__file__!r}, run_name='__main__')\n")
    server = _started_with(dying)
    try:
        result = subprocess.run([*_launcher(server), "-u", "-c", REPORT], input="once\n", capture_output=True,
                                text=True, timeout=120)
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.split()[1] == "False"  # the fresh interpreter's: no torch


def test_a_runs_server_whose_controller_is_killed_removes_its_folder(tmp_path):
    """A controller killed outright never stops its server: the server, left without it, ends and takes the run's
    folder (its socket and log) with it."""
    controller = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time; from gqa_decode_fuzz.runner import warm_workers; "
         "server = warm_workers.start(['popen'], dict(os.environ)); print(server.directory, flush=True); "
         "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    folder = Path(controller.stdout.readline().strip())
    assert (folder / "socket").exists()
    controller.kill()
    controller.wait()
    deadline = time.monotonic() + 60  # the server finishes its imports first
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not folder.exists()


def test_xdists_gateways_are_made_at_once_in_the_specs_order(monkeypatch):
    """Each node's set-up waits for all the others to have begun (a barrier): one after another, it would break."""
    from xdist.workermanage import NodeManager

    monkeypatch.setattr(NodeManager, "setup_nodes", NodeManager.setup_nodes)  # restored after the test
    assert warm_workers.start_gateways_at_once() and NodeManager.setup_nodes is warm_workers._setup_nodes_at_once
    told, specs = [], ["gw0", "gw1", "gw2", "gw3"]
    all_begun = threading.Barrier(len(specs), timeout=60)

    def setup_node(spec, putevent):
        all_begun.wait()
        return f"node {spec} {putevent}"

    hook = types.SimpleNamespace(pytest_xdist_setupnodes=lambda config, specs: told.append(list(specs)))
    manager = types.SimpleNamespace(config=types.SimpleNamespace(hook=hook), specs=specs, setup_node=setup_node)
    assert NodeManager.setup_nodes(manager, "put") == [f"node {spec} put" for spec in specs]
    assert told == [specs]


def _started_with(script: Path, starting=warm_workers.start) -> warm_workers.Server:
    """A server run from ``script`` in place of warm_workers.py (``starting``, ``start`` or ``keep``, with its
    command swapped)."""
    real = warm_workers.Path.resolve
    try:
        warm_workers.Path.resolve = lambda path: script if path.name == "warm_workers.py" else real(path)
        server = starting(["popen"], dict(os.environ))
    finally:
        warm_workers.Path.resolve = real
    assert server is not None
    return server


def test_a_forked_worker_has_the_search_path_a_fresh_one_has(tmp_path):
    (tmp_path / "only_on_pythonpath.py").write_text("")
    environment = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=str(tmp_path))
    server = warm_workers.start(["popen"], environment)
    code = "import sys, only_on_pythonpath; print(sys.path[:2])"
    try:
        warm = subprocess.run([*_launcher(server), "-u", "-c", code], capture_output=True, text=True, env=environment,
                              timeout=120)
    finally:
        server.stop()
    fresh = subprocess.run([sys.executable, "-u", "-c", code], capture_output=True, text=True, env=environment)
    assert (warm.returncode, warm.stdout) == (fresh.returncode, fresh.stdout) == (0, fresh.stdout), warm.stderr


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


@pytest.fixture
def kept_folder(monkeypatch):
    """A private folder for kept servers (short: a socket's path has about 100 bytes), and their end afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="kw-"))
    monkeypatch.setenv(warm_workers.KEPT_FOLDER_ENV, str(folder))
    yield folder
    for command in Path("/proc").glob("[0-9]*/cmdline"):  # the servers serving a socket in it
        with contextlib.suppress(OSError, ValueError):
            if f"\0{folder}/" in command.read_text() and "warm_workers.py\0serve\0" in command.read_text():
                os.kill(int(command.parent.name), signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_kept_server_serves_the_next_run_and_ends_once_idle(kept_folder):
    first = warm_workers.keep(["popen"], dict(os.environ), idle_s=4)
    assert first is not None and first.process is not None and first.kept
    second = warm_workers.keep(["popen"], dict(os.environ), idle_s=4)  # at once: the first is still importing
    assert second.process is None and second.socket == first.socket
    parents = []
    for server in (first, second):
        result = subprocess.run([*_launcher(server), "-u", "-c", REPORT], input="x\n", capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        parents.append(int(result.stdout.split()[0]))
        assert server.stop() is None  # a run's end leaves it serving
    assert parents == [first.process.pid] * 2
    assert first.process.wait(timeout=60) == 0  # idle for 4 s: it ends, and takes its socket with it
    assert not first.socket.exists()


def test_a_kept_server_serves_only_its_own_environment():
    environment = dict(os.environ, MARK="one")
    key = warm_workers._kept_key(environment)
    assert key != warm_workers._kept_key(dict(environment, MARK="two"))
    assert key == warm_workers._kept_key(dict(environment, OLDPWD="/elsewhere", SHLVL="3"))  # a shell's bookkeeping


def test_a_kept_folder_that_others_may_enter_is_not_used(kept_folder):
    kept_folder.chmod(0o755)
    assert warm_workers.keep(["popen"], dict(os.environ)) is None


def test_xdist_workers_of_two_runs_fork_from_one_kept_server(tmp_path, kept_folder):
    log = tmp_path / "parents.txt"
    test_file = tmp_path / "test_parent.py"
    test_file.write_text("import os\n"
                         "def test_parent():\n"
                         f"    with open({str(log)!r}, 'a') as log:\n"
                         "        log.write(f'{os.getppid()}\\n')\n")
    for _ in range(2):
        result = run_pytest(str(test_file), "-n", "2", "--device=cpu", "--warm-workers=kept", "--run-report=none",
                            "--rootdir", str(tmp_path),
                            env=clean_environment(**{warm_workers.KEPT_FOLDER_ENV: str(kept_folder)}))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "it is kept for the next run" in result.stdout
    (parent,) = set(log.read_text().split())
    assert "warm_workers.py serve" in Path(f"/proc/{parent}/cmdline").read_text().replace("\0", " ")


def test_a_launcher_passes_a_terminals_interrupt_to_its_kept_servers_worker(kept_folder):
    """A kept server's workers are in its session, not the terminal's: the launcher, which is, passes Ctrl-C on."""
    server = warm_workers.keep(["popen"], dict(os.environ))
    launcher = subprocess.Popen([*_launcher(server), "-u", "-c", "import time; print('ready', flush=True); "
                                 "time.sleep(60)"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert launcher.stdout.readline() == "ready\n"
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=30) == -signal.SIGINT  # the worker's KeyboardInterrupt ended it, as a fresh one's
    assert "KeyboardInterrupt" in launcher.stderr.read()


def test_a_kept_server_that_fails_is_reported_by_the_run_that_started_it(kept_folder):
    broken = kept_folder / "broken_server.py"
    broken.write_text("import sys\nprint('broken on purpose', flush=True)\nsys.exit(3)\n")
    server = _started_with(broken, warm_workers.keep)
    server.process.wait(timeout=60)
    assert server.stop() == "it exited 3: broken on purpose"
