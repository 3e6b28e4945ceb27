"""The run's own MPS server: workers that share a GPU run their kernels side by side, not in turns.

Time-sliced, the workers sharing a GPU take turns on it and each read-back waits for a turn; under an MPS server
their kernels run side by side, and the suite runs faster (docs/gpu.md sections 17 and 19). So an xdist
controller whose workers share a GPU starts an MPS control daemon of its own (``--mps=auto``, the
default) before it starts them:

- private: its pipe and log directories lie in a temporary directory of the run's, named to the
  workers through ``CUDA_MPS_PIPE_DIRECTORY``, so no other process on the machine joins it; it runs
  without ``CUDA_VISIBLE_DEVICES``, so the GPU ids the workers pin themselves to mean what they mean
  outside it;
- proven: a probe process must create a context and allocate on every GPU of the run through it
  within ``PROBE_TIMEOUT_S`` (another user's MPS server on a GPU, a compute mode that refuses it),
  or the daemon is stopped and the run goes on time-sliced, saying why;
- left after the first crash, where the GPUs take processes outside it (the default compute mode): one
  process's GPU fault reaches every process on its GPU, so a faulting kernel would crash all eight
  workers each time; the workers xdist starts in place of crashed ones run time-sliced, so each later
  crash is the crashing process's own (``leave``), and the first ones are replayed alone (``mps``);
- stopped when the run ends, after those replays; a run killed before it could stop its server
  (SIGTERM from a CI job's time limit, SIGKILL) leaves it running, so each start first quits and
  removes the servers whose runs are gone (``sweep``: an ``owner`` file names the run's process).

An isolated implementation's children stay outside it, so that a child's fault is its own, unless ``--mps=all``
asks them in: faster where many children share a GPU, at the price of a child's fault crashing its neighbours.

No MPS is started where one already runs (its control pipe exists: the workers join that one), with
``--mps=off``, without workers sharing a GPU, on MIG instances, or without ``nvidia-cuda-mps-control``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gqa_decode_fuzz.engine.devices import MPS_PIPE_ENV

CONTROL = "nvidia-cuda-mps-control"
PREFIX = "gqa-decode-mps-"  # the temporary folder of each run's server
OWNER = "owner"  # in that folder: the process id of the run that started it
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
MODES = ("auto", "all", "off")  # all: the isolated children join it too (``children_inside``)
PROBE_TIMEOUT_S = 30.0  # the first client of a daemon starts its server
QUIT_TIMEOUT_S = 30.0  # the server waits for its clients to end; the run's have
SWEEP_TIMEOUT_S = 5.0  # a left-over server's clients died with their run

# Runs in a process of its own (ctypes on the driver: no torch) with the run's GPUs visible: a context
# and an allocation on each, through the server. Exit status 0 when every step worked.
_PROBE = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
count, device, context, memory = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_void_p(), ctypes.c_uint64()
def step(name, status):
    if status != 0:
        sys.exit(f"{name} returned CUDA error {status}")
step("cuInit", cuda.cuInit(0))
step("cuDeviceGetCount", cuda.cuDeviceGetCount(ctypes.byref(count)))
for ordinal in range(count.value):
    step("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), ordinal))
    step("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
    step("cuCtxSetCurrent", cuda.cuCtxSetCurrent(context))
    step("cuMemAlloc", cuda.cuMemAlloc_v2(ctypes.byref(memory), ctypes.c_size_t(1 << 20)))
    step("cuMemFree", cuda.cuMemFree_v2(memory))
"""

__all__ = ["CONTROL", "LOG_ENV", "MODES", "Server", "children_inside", "probe", "start", "sweep", "why_not"]


@dataclass(frozen=True)
class Server:
    """A running MPS control daemon of this run's: where its pipe and logs are, and how long it took."""

    directory: Path
    control: str  # the nvidia-cuda-mps-control executable
    seconds: float  # to start it and probe it
    can_leave: bool = False  # the GPUs take processes outside it (default compute mode)

    @property
    def pipe_directory(self) -> Path:
        return self.directory / "pipe"

    @property
    def log_directory(self) -> Path:
        return self.directory / "log"

    def environ(self) -> dict[str, str]:
        """What a process needs in its environment to join this server."""
        return {MPS_PIPE_ENV: str(self.pipe_directory), LOG_ENV: str(self.log_directory)}

    def leave(self) -> bool:
        """Make the processes this one starts from now on (xdist's replacements for crashed workers) run outside
        the server, time-sliced: point their ``CUDA_MPS_PIPE_DIRECTORY`` at an empty folder. True where it did
        (the GPUs take them, and this process's environment still named the server)."""
        if not self.can_leave or os.environ.get(MPS_PIPE_ENV) != str(self.pipe_directory):
            return False
        outside = self.directory / "outside"
        outside.mkdir(exist_ok=True)
        os.environ[MPS_PIPE_ENV] = str(outside)
        return True

    def stop(self, timeout: float = QUIT_TIMEOUT_S) -> str | None:
        """Tell the daemon to quit (its server first waits for its clients to end) and remove its directory;
        None, or why it did not quit (its directory is then left for a look)."""
        trouble = _control(self.control, self.environ(), "quit", timeout)
        if trouble is None:
            shutil.rmtree(self.directory, ignore_errors=True)
        return trouble


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    return True


def sweep(control: str, root: Path | None = None) -> list[Path]:
    """Quit and remove the servers left by runs that are gone (their ``owner`` process no longer exists), in
    ``root`` (the temporary directory by default); the folders removed. A folder without an owner file (a run
    still starting, or not ours) or whose daemon does not quit is left alone."""
    removed = []
    for directory in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = int((directory / OWNER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if _alive(owner):
            continue
        left = Server(directory, control, 0.0)
        if not (left.pipe_directory / "control").exists() or left.stop(SWEEP_TIMEOUT_S) is None:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


def _daemon_environ(server_environ: dict[str, str]) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if name != "CUDA_VISIBLE_DEVICES"}
    return {**environ, **server_environ}


def _control(control: str, server_environ: dict[str, str], command: str | None, timeout: float) -> str | None:
    """Run ``nvidia-cuda-mps-control`` (``-d`` to start the daemon, or one command on its stdin); None or why not.

    Its output goes to a file, not a pipe: the daemon it forks keeps the inherited descriptors open, and
    reading a pipe would wait for the daemon to end."""
    arguments, given = ([control, "-d"], b"") if command is None else ([control], command.encode() + b"\n")
    name = f"{Path(control).name} {command or '-d'}"
    with tempfile.TemporaryFile() as output:
        try:
            done = subprocess.run(arguments, input=given, env=_daemon_environ(server_environ), stdout=output,
                                  stderr=subprocess.STDOUT, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{name}: {error}"
        output.seek(0)
        said = output.read().decode(errors="replace").strip().splitlines()
    if done.returncode != 0:
        return f"{name} exited with status {done.returncode}" + (f": {said[-1]}" if said else "")
    return None


def probe(server_environ: dict[str, str], gpu_ids: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Create a context and allocate on every GPU of the run through the server, in a process of its own;
    None, or why that failed."""
    environ = {**os.environ, **server_environ, "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids)}
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], env=environ, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no context through it within {timeout:.0f} s"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        return f"a process could not use the GPUs through it: {said[-1] if said else done.returncode}"
    return None


def children_inside(mode: str) -> bool:
    """Whether ``--mps=mode`` starts an isolated implementation's children inside the server (``child_start``)."""
    return mode == "all"


def why_not(mode: str, gpu_ids: Sequence[str], workers: int, running: Path | None) -> str | None:
    """Why this run starts no MPS server of its own (None: it should): ``mode`` is ``--mps``, ``workers`` the
    xdist worker count, ``running`` the control pipe of an MPS server the workers would join already."""
    if mode == "off":
        return "--mps=off"
    if running is not None:
        return f"the workers join the MPS server at {running}"
    if workers <= len(gpu_ids):
        return "no GPU is shared by two workers"
    if any(gpu.startswith("MIG") for gpu in gpu_ids):
        return "the GPUs are MIG instances"
    return None


def start(gpu_ids: Sequence[str], *, can_leave: bool, control: str | None = None,
          check: Callable[[dict[str, str], Sequence[str]], str | None] | None = None,
          ) -> tuple[Server | None, str | None]:
    """Start a private MPS control daemon and prove it serves ``gpu_ids``: the server, or None and why not.

    ``can_leave``: the GPUs also take processes outside it (``devices.shared_compute_mode``); ``control`` is the
    daemon's executable (default: ``nvidia-cuda-mps-control`` on ``PATH``); ``check`` the proof (default
    ``probe``), a stand-in in the suite's own tests.
    """
    control = control or shutil.which(CONTROL)
    check = check or probe
    if control is None:
        return None, f"{CONTROL} is not on PATH"
    started = time.perf_counter()
    sweep(control)
    server = Server(Path(tempfile.mkdtemp(prefix=PREFIX)), control, 0.0)
    server.pipe_directory.mkdir()
    server.log_directory.mkdir()
    (server.directory / OWNER).write_text(str(os.getpid()), encoding="utf-8")
    trouble = _control(control, server.environ(), None, PROBE_TIMEOUT_S) or check(server.environ(), gpu_ids)
    if trouble is not None:
        server.stop()
        shutil.rmtree(server.directory, ignore_errors=True)
        return None, trouble
    return replace(server, seconds=time.perf_counter() - started, can_leave=can_leave), None
