"""Starting the child process an isolated implementation runs in, without torch in this process: a run starts its
child first and imports torch and collects its tests while the child imports torch and the target (both take
seconds). The child is not told it runs under test (``_neutral_start``); ``isolated_impl.Child`` talks to it."""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import multiprocessing.spawn
import os
import shutil
import stat
import sys
import tempfile
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import devices, isolation_child
from .isolation import SANITIZER_ENV

__all__ = ["Launch", "Started", "start"]

# Environment variables that tell a process it runs under the suite: the child starts without them.
_TELLING_PREFIXES = ("PYTEST_", "GQA_DECODE_", "HYPOTHESIS", "_PYTEST")
PRINT_LIMIT = 10**9  # compute-sanitizer's --print-limit: errors it prints before it stops printing them


@dataclass(frozen=True)
class Launch:
    """What a child needs: the ``--impl`` spec and the root its relative path resolves against, the device
    choice, a sanitizer tool (None: plain), and whether a plain CUDA child joins its parent's MPS server
    (``--mps=all``: its kernels then run beside the other processes' instead of in turns, and its fault reaches
    them all) or starts outside it (the default: its fault is its own). Definitions travel with the calls
    (``IsolatedImpl.for_definition``)."""

    spec: str
    root: Path
    device: str
    sanitize: str | None = None
    inside_mps: bool = False


@dataclass
class Started:
    """A child started for ``launch`` that has not yet said it is ready: its process, this side of its pipe, its
    folder (the log it writes, the sanitizer's log where sanitized)."""

    launch: Launch
    process: multiprocessing.process.BaseProcess
    connection: multiprocessing.connection.Connection
    directory: Path
    log: Path
    sanitizer_log: Path | None

    def stop(self) -> None:
        """End the process (politely when idle, killed otherwise) and remove its folder."""
        with contextlib.suppress(OSError, ValueError):
            if self.process.is_alive():
                with contextlib.suppress(BrokenPipeError, ConnectionError, OSError):
                    self.connection.send(("stop",))
                self.process.join(0.5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
        with contextlib.suppress(OSError):
            self.connection.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def start(launch: Launch) -> Started:
    """Spawn the child for ``launch`` and return at once; it loads the target and then answers ``ready`` (or
    ``refused``) on its pipe, which ``isolated_impl.Child`` waits for."""
    directory = Path(tempfile.mkdtemp(prefix="gqa-decode-impl-"))
    log = directory / "child.log"
    executable, sanitizer_log = None, None
    extra_env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"} if launch.sanitize else {}
    extra_env.update(_outside_mps(launch, directory))
    if launch.sanitize:
        executable, sanitizer_log = _sanitizer_wrapper(launch.sanitize, directory)
    context = multiprocessing.get_context("spawn")  # torch.multiprocessing's is this one: no torch needed here
    connection, theirs = context.Pipe()
    payload = {"spec": launch.spec, "root": str(launch.root), "device": launch.device, "log": str(log),
               "sanitize": launch.sanitize}
    process = context.Process(target=isolation_child.main, args=(theirs, payload), name="gqa-decode-impl",
                              daemon=False)
    with _neutral_start(executable, extra_env):
        process.start()
    theirs.close()
    return Started(launch, process, connection, directory, log, sanitizer_log)


def _outside_mps(launch: Launch, directory: Path) -> dict[str, str]:
    """The environment that starts a CUDA child outside the run's MPS server, where the GPUs allow processes beside
    one: under MPS one process's fault reaches every process on its GPU, its parent's checker among them.
    Time-sliced, the child's fault is its own, an ordinary failure of its call. Empty elsewhere, and where the
    launch asks in (a sanitized child never does: it keeps a context of its own, as it always had)."""
    if launch.inside_mps and launch.sanitize is None:
        return {}
    if launch.device == "cpu" or devices.mps_control_pipe() is None or not _shared_compute_mode():
        return {}
    outside = directory / "outside-mps"  # no control pipe in it: the driver gives the child a context of its own
    outside.mkdir()
    return {devices.MPS_PIPE_ENV: str(outside)}


@functools.lru_cache(maxsize=1)
def _shared_compute_mode() -> bool:
    return devices.shared_compute_mode()


@contextlib.contextmanager
def _neutral_start(executable: str | None, extra_env: dict[str, str]) -> Iterator[None]:
    """While a child starts: no pytest, Hypothesis or suite variables in its environment, no ``__main__`` for
    spawn to import again (a ``pytest`` script would bring pytest in), and ``executable`` (a sanitizer wrapper)
    instead of this Python. The one process-wide change is undone at once."""
    saved_env = {name: value for name, value in os.environ.items() if name.startswith(_TELLING_PREFIXES)}
    saved_extra = {name: os.environ.get(name) for name in extra_env}
    main, exe = sys.modules.get("__main__"), multiprocessing.spawn.get_executable()
    with _START_LOCK:
        try:
            for name in saved_env:
                del os.environ[name]
            os.environ.update(extra_env)
            sys.modules["__main__"] = types.ModuleType("__main__")
            if executable is not None:
                multiprocessing.spawn.set_executable(executable)
            yield
        finally:
            multiprocessing.spawn.set_executable(exe)
            if main is not None:
                sys.modules["__main__"] = main
            for name, value in saved_extra.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            os.environ.update(saved_env)


_START_LOCK = threading.Lock()


def _sanitizer_wrapper(tool: str, directory: Path) -> tuple[str, Path]:
    """A script that starts Python under ``compute-sanitizer --tool TOOL``, logging to a file; both paths."""
    sanitizer = os.environ.get(SANITIZER_ENV) or shutil.which("compute-sanitizer")
    if sanitizer is None:
        raise FileNotFoundError("--sanitize needs NVIDIA's compute-sanitizer on PATH (or GQA_DECODE_SANITIZER)")
    log = directory / f"{tool}.log"
    wrapper = directory / "python-under-sanitizer"
    # --destroy-on-device-error kernel: a precise error ends the kernel, not the context, so the child lives on.
    # Every error printed: under the default limit (100) a long-lived child's later errors go unlogged and a
    # shrink sees its failing example pass (memcheck logs each faulting thread).
    wrapper.write_text(f"#!/bin/sh\nexec '{sanitizer}' --tool {tool} --log-file '{log}' --print-limit {PRINT_LIMIT} "
                       "--destroy-on-device-error kernel "
                       f"'{sys.executable}' \"$@\"\n", encoding="utf-8")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper), log
