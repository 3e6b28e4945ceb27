"""The run's own MPS server (runner/mps_server.py), with a stand-in for nvidia-cuda-mps-control.

The stand-in does what the real daemon does to the file system (``-d`` makes the ``control`` pipe in
``$CUDA_MPS_PIPE_DIRECTORY``, ``quit`` on stdin removes it), logs what it was given, and, like a daemon, leaves
a child holding its output open. On a GPU host the real one is exercised by the plain
``pytest properties -n auto`` (docs/gpu.md).
"""

import os
import stat
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from gqa_decode_fuzz.engine import devices
from gqa_decode_fuzz.record import mps
from gqa_decode_fuzz.runner import mps_server, plugin

FAKE_CONTROL = """#!/bin/sh
echo "$* CVD=${CUDA_VISIBLE_DEVICES-unset} LOG=$CUDA_MPS_LOG_DIRECTORY" >> "$FAKE_MPS_LOG"
if [ "$1" = "-d" ]; then
    [ -n "$FAKE_MPS_REFUSE" ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
    touch "$CUDA_MPS_PIPE_DIRECTORY/control"
    sleep 5 &   # the daemon lives on, holding the output it inherited
    exit 0
fi
read command
[ -n "$FAKE_MPS_QUIT_FAILS" ] && { echo "the server did not stop" >&2; exit 1; }
[ "$command" = quit ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    """A stand-in ``nvidia-cuda-mps-control`` first on PATH; yields its log file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps_server.CONTROL
    control.write_text(FAKE_CONTROL)
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "control.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    temporary = tmp_path / "tmp"  # where the servers' folders go, and where start() sweeps
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    return log


def _proved(environ, gpu_ids):
    return None


def test_a_started_server_is_private_joined_by_its_environment_and_removed_when_stopped(fake_control):
    server, trouble = mps_server.start(["3", "5"], can_leave=True, check=_proved)
    assert trouble is None and server is not None
    environ = server.environ()
    assert devices.mps_control_pipe(environ) == server.pipe_directory / "control"
    assert server.pipe_directory.parent == server.directory and server.log_directory.is_dir()
    assert devices.mps_control_pipe({devices.MPS_PIPE_ENV: str(server.directory.parent)}) is None  # not the default
    assert server.stop() is None
    assert not server.directory.exists()
    started, quit_ = fake_control.read_text().splitlines()
    # The daemon sees every GPU, so the ids the workers pin themselves to mean the same inside it.
    assert started == f"-d CVD=unset LOG={server.log_directory}"
    assert quit_.startswith(" CVD=unset")


def test_a_server_that_fails_its_probe_is_stopped_and_the_run_goes_on_time_sliced(fake_control):
    asked = []
    server, trouble = mps_server.start(["3"], can_leave=True,
                                       check=lambda environ, ids: asked.append((environ, ids)) or "no")
    assert server is None and trouble == "no"
    (environ, ids), = asked
    assert ids == ["3"] and environ[devices.MPS_PIPE_ENV].endswith("pipe")
    assert not os.path.exists(environ[devices.MPS_PIPE_ENV])  # stopped (quit) and removed
    assert fake_control.read_text().splitlines()[1].startswith(" CVD=unset")


def test_a_daemon_that_will_not_start_is_named_with_its_own_words(fake_control, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_REFUSE", "1")
    server, trouble = mps_server.start(["0"], can_leave=True, check=_proved)
    assert server is None
    assert trouble == f"{mps_server.CONTROL} -d exited with status 1: An instance of this daemon is already running"


def test_without_the_control_program_no_server_is_started(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert mps_server.start(["0"], can_leave=True, check=_proved) == (None, f"{mps_server.CONTROL} is not on PATH")


def test_the_probe_needs_a_cuda_driver_that_serves_every_gpu(fake_control):
    """The real probe in a process of its own: where no CUDA driver loads (this CPU host) it says why."""
    if devices.driver_device_count():
        pytest.skip("a CUDA driver is here: the probe would pass")
    server, trouble = mps_server.start(["0"], can_leave=True)
    assert server is None
    assert trouble.startswith("a process could not use the GPUs through it: ") and "libcuda" in trouble


@pytest.mark.parametrize(("mode", "gpu_ids", "workers", "running", "why"), [
    ("auto", ["0"], 8, None, None),
    ("auto", ["0", "1"], 16, None, None),
    ("off", ["0"], 8, None, "--mps=off"),
    ("auto", ["0", "1"], 2, None, "no GPU is shared by two workers"),
    ("auto", ["MIG-1234"], 8, None, "the GPUs are MIG instances"),
])
def test_which_runs_start_a_server_of_their_own(mode, gpu_ids, workers, running, why):
    assert mps_server.why_not(mode, gpu_ids, workers, running) == why


def test_a_server_already_running_is_joined_not_replaced(tmp_path, fake_control, monkeypatch):
    pipe = tmp_path / "nvidia-mps"
    pipe.mkdir()
    (pipe / "control").touch()
    monkeypatch.setenv(devices.MPS_PIPE_ENV, str(pipe))
    assert mps_server.why_not("auto", ["0"], 8, devices.mps_control_pipe()).startswith("the workers join")
    assert plugin._own_mps_server("auto", ["0"], 8) == (None, None)
    assert not fake_control.exists()  # the control program was never run


def test_the_controller_names_its_server_to_the_workers_it_starts(fake_control, monkeypatch):
    monkeypatch.delenv(devices.MPS_PIPE_ENV, raising=False)
    monkeypatch.delenv(mps_server.LOG_ENV, raising=False)
    monkeypatch.setattr(devices, "DEFAULT_MPS_PIPE_DIRECTORY", str(fake_control.parent / "no-default-server"))
    monkeypatch.setattr(mps_server, "probe", _proved)
    server, trouble = plugin._own_mps_server("auto", ["0"], 8)
    try:
        assert trouble is None and server is not None
        assert os.environ[devices.MPS_PIPE_ENV] == str(server.pipe_directory)  # inherited by the workers
        assert os.environ[mps_server.LOG_ENV] == str(server.log_directory)
        assert "(the run's own, started in " in mps.header_line(devices.mps_control_pipe(), server.seconds)
    finally:
        server.stop()


def _crash(server, error="Not properly terminated"):
    """xdist's pytest_testnodedown for a worker that died (``error``) in a run with ``server``."""
    config = SimpleNamespace(stash={plugin.PLAN: SimpleNamespace(mps_server=server)},
                             pluginmanager=SimpleNamespace(get_plugin=lambda name: None))
    plugin.pytest_testnodedown(SimpleNamespace(config=config), error)


@pytest.mark.parametrize("can_leave", [True, False])
def test_after_a_crash_the_replacement_workers_run_outside_the_server_where_the_gpus_allow(
        fake_control, monkeypatch, can_leave):
    server, _ = mps_server.start(["0"], can_leave=can_leave, check=_proved)
    try:
        monkeypatch.setenv(devices.MPS_PIPE_ENV, str(server.pipe_directory))
        _crash(server, error=None)  # a worker that ended normally changes nothing
        assert devices.mps_control_pipe() == server.pipe_directory / "control"
        _crash(server)
        if can_leave:  # a folder without a control pipe: the driver runs the process outside MPS
            assert os.environ[devices.MPS_PIPE_ENV] == str(server.directory / "outside")
            assert devices.mps_control_pipe() is None
            assert not server.leave()  # once
        else:  # exclusive-process GPUs take no process outside it: the replacements stay inside
            assert devices.mps_control_pipe() == server.pipe_directory / "control"
    finally:
        assert server.stop() is None
    assert not server.directory.exists()


def test_each_worker_is_told_whether_it_started_inside_a_server_and_only_its_crashes_are_replayed(
        fake_control, monkeypatch):
    server, _ = mps_server.start(["0"], can_leave=True, check=_proved)
    config = SimpleNamespace(stash={plugin.PLAN: SimpleNamespace(device="cuda", mps_server=server)},
                             pluginmanager=SimpleNamespace(get_plugin=lambda name: None))
    try:
        monkeypatch.setenv(devices.MPS_PIPE_ENV, str(server.pipe_directory))
        first, replacement = (SimpleNamespace(config=config, workerinput={}) for _ in range(2))
        plugin.pytest_configure_node(first)
        _crash(server)  # the first crash: the server is left
        plugin.pytest_configure_node(replacement)
    finally:
        server.stop()
    assert first.workerinput[mps.WORKER_UNDER_MPS] and not replacement.workerinput[mps.WORKER_UNDER_MPS]
    assert mps.crashed_under_mps(SimpleNamespace(node=first))
    assert not mps.crashed_under_mps(SimpleNamespace(node=replacement))  # its crash is its own
    assert mps.crashed_under_mps(SimpleNamespace())  # no worker (no xdist): whatever the run was under


def _left_over(name: str, owner: int | None, pipe: bool = True):
    """A server folder as a run leaves it, in the temporary directory; ``owner`` None: no owner file."""
    left = mps_server.Server(Path(tempfile.gettempdir()) / (mps_server.PREFIX + name), mps_server.CONTROL, 0.0)
    left.pipe_directory.mkdir(parents=True)
    if pipe:
        (left.pipe_directory / "control").touch()
    if owner is not None:
        (left.directory / mps_server.OWNER).write_text(str(owner))
    return left.directory


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_start_quits_and_removes_the_servers_of_runs_that_are_gone(fake_control, monkeypatch):
    gone, no_pipe = _left_over("gone", _dead_pid()), _left_over("no-pipe", _dead_pid(), pipe=False)
    running, starting = _left_over("running", os.getpid()), _left_over("starting", None)
    server, _ = mps_server.start(["0"], can_leave=True, check=_proved)
    server.stop()
    assert not gone.exists() and not no_pipe.exists()
    assert running.exists() and starting.exists()  # a live run's, and one without an owner yet
    said = fake_control.read_text().splitlines()
    assert said[0].startswith(" CVD=unset")  # the left-over one quit (its pipe was there) before the start
    assert said[1].startswith("-d ")


def test_a_left_over_server_that_will_not_quit_is_left_alone(fake_control, monkeypatch):
    stuck = _left_over("stuck", _dead_pid())
    monkeypatch.setenv("FAKE_MPS_QUIT_FAILS", "1")
    assert mps_server.sweep(mps_server.CONTROL) == []
    assert stuck.exists()
    monkeypatch.delenv("FAKE_MPS_QUIT_FAILS")
    assert mps_server.sweep(mps_server.CONTROL) == [stuck]
