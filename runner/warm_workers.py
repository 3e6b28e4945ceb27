"""Warm workers: xdist workers forked from a server process that has already imported torch and Triton.

xdist starts each worker through execnet's popen gateway, a fresh ``python -u -c BOOTSTRAP`` that then imports
pytest, the plugins, torch and Triton, twelve of them at once on a GPU host: seconds of every run's start
(docs/performance.md). Here the controller, as it configures, starts one fork server (``serve``) that imports the
heavy libraries once, while the controller goes on, and points xdist's popen specs at a small launcher (``launch``)
instead of the interpreter. Each launcher hands the server its standard streams (the gateway's pipes) with its
environment and working folder; the server forks a worker that takes them over and runs the bootstrap as the fresh
interpreter would, and tells the launcher the worker's exit status, which the launcher exits with. To execnet and
xdist the launcher is the worker's process.

Nothing of the run is decided in the server: it imports only third-party libraries (no plugin module, so pytest's
assert rewriting sees none of them already imported), never touches CUDA (a forked child could not start it),
and forks before anything is configured, so each worker configures itself as a fresh one would, in its own
environment (the GPU pin, the MPS server, the thread share: torch's pool is sized in ``gpus.share_cores``).
What the libraries read as they load is set for the server by the controller: numpy's BLAS sized for a worker's
share of the cores, and on the CPU Triton's interpreter.

``kept`` (``--warm-workers=kept``) keeps the server after the run, for the next: it serves every run of this user
whose interpreter, folder, environment and libraries are the same (one socket per such key, in a folder only the
user can enter), and ends once it has had no worker for ``KEPT_IDLE_S``. A run then forks its workers at once,
where ``on`` has them wait for the server's imports, which on a GPU host lie on the path to the first test.

Where anything fails (no server, a refused hand-over, an interpreter option the server cannot mirror) the launcher
runs the worker the ordinary way, by ``exec`` of the interpreter with its arguments: a run never depends on the
server. The hand-over is a handshake (request, "forked", go, "started"), so that a launcher that falls back never
shares its pipes with a forked child (``_fork_worker``). When a launcher goes (xdist killed it), the server kills
its worker; the server ignores Ctrl-C (the workers' to handle) and ends with the controller (one killed
outright leaves it to remove the run's folder).

This file runs three ways: imported by the plugin (``start``, ``Server``), and as a script, ``serve`` (the fork
server) and ``launch`` (the launcher, run ``python -I -S``: the standard library only, so it starts in
milliseconds). Its top level therefore imports the standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import selectors
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

MODES = ("on", "kept", "off")
# What the server imports before it forks: the libraries every worker imports, heaviest first. None of them is a
# pytest plugin's module (pytest warns where one was imported before it could rewrite its asserts).
PRELOAD = ("numpy", "torch", "triton", "triton.language", "pytest")
READY_TIMEOUT_S = 120.0  # a launcher's wait for its worker's fork: the server's imports come first
_MESSAGE_BYTES = 1 << 20  # a launcher's request: its environment and folder, as JSON
KEPT_IDLE_S = 900.0  # a kept server ends after this long without a worker
KEPT_FOLDER_ENV = "GQA_DECODE_KEPT_WORKERS_DIR"  # where kept servers' sockets live (default: a folder in /tmp)
# Variables a shell changes between two runs of one command, which change nothing of what the server imports.
_VOLATILE = ("_", "OLDPWD", "SHLVL")


def supported() -> bool:
    """Whether this platform can fork workers from a server: Linux (fork, Unix sequenced-packet sockets, descriptor
    passing; elsewhere the workers start fresh)."""
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


def preload() -> None:
    """Import ``PRELOAD`` (what is missing is left to the process that needs it)."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)


# ---- the controller's side ---------------------------------------------------------------------------------


@dataclass
class Server:
    """A fork server: its process (None for a kept one this run found running), its folder, its socket and log
    (``socket`` and ``server.log`` in the run's own folder; ``KEY.socket`` and ``KEY.log`` for a kept one) and
    whether it is kept for later runs."""

    process: subprocess.Popen | None
    directory: Path
    socket: Path
    log: Path
    kept: bool = False

    def spec(self) -> str:
        """xdist's ``--tx`` for a worker started by a launcher that asks this server."""
        launcher = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "launch", str(self.socket),
                    sys.executable]
        return "popen//python=" + shlex.join(launcher)

    def stop(self) -> str | None:
        """End the run's server (a kept one stays for the next run); None, or what went wrong with it during the
        run (its workers then started fresh). A second stop does nothing."""
        trouble = None
        if self.kept:  # this run's to report only where it started it and it failed
            return self._failure() if self.process is not None and self.process.poll() else None
        if not self.directory.exists():
            return None
        if self.process.poll() is not None:  # it ended on its own: a failed start
            trouble = self._failure()
        else:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
        return trouble

    def _failure(self) -> str:
        """How the server ended, with its log's last lines."""
        tail = self.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:] \
            if self.log.exists() else []
        return f"it exited {self.process.returncode}: " + " | ".join(tail)


def start_gateways_at_once() -> bool:
    """Have xdist, in this process (a controller whose workers a server forks), make its workers' gateways at once,
    each in a thread, instead of one after another: each is a launcher's start, a fork and execnet's bootstrap,
    mostly waiting (docs/performance.md has what that costs). False where xdist lacks what this replaces (its
    ``NodeManager.setup_nodes`` and ``setup_node``): the gateways are then made one after another, as before."""
    try:
        from xdist.workermanage import NodeManager
    except ImportError:
        return False
    if not all(callable(getattr(NodeManager, name, None)) for name in ("setup_nodes", "setup_node")):
        return False
    NodeManager.setup_nodes = _setup_nodes_at_once
    return True


def _setup_nodes_at_once(manager, putevent) -> list:
    """xdist's ``NodeManager.setup_nodes`` (its hook, then ``setup_node`` for each spec, in the specs' order), the
    nodes set up in threads."""
    from concurrent.futures import ThreadPoolExecutor

    manager.config.hook.pytest_xdist_setupnodes(config=manager.config, specs=manager.specs)
    with ThreadPoolExecutor(max(len(manager.specs), 1), thread_name_prefix="gqa-decode-gateway") as pool:
        return list(pool.map(lambda spec: manager.setup_node(spec, putevent), manager.specs))


def _forkable(tx: list[str]) -> bool:
    """Whether xdist's ``--tx`` specs are plain ``popen`` ones (a user's own specs stay theirs) on a platform that
    can fork workers from a server."""
    return bool(tx) and all(spec == "popen" for spec in tx) and supported()


def start(tx: list[str], environment: dict[str, str]) -> Server | None:
    """Start the fork server for xdist's workers, given its ``--tx`` specs; None where they are not plain
    ``popen`` (a user's own specs stay theirs) or the platform cannot. ``environment``: the server's (the
    workers bring their own; this one governs its imports, such as the thread counts)."""
    if not _forkable(tx):
        return None
    try:
        directory = Path(tempfile.mkdtemp(prefix="gqa-decode-warm-"))
    except OSError:  # no writable temporary folder: fresh workers
        return None
    server = Server(None, directory, directory / "socket", directory / "server.log")
    try:
        server.process = _spawn(server, environment, ["--controller", str(os.getpid())])
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)
        return None
    return server


def _spawn(server: Server, environment: dict[str, str], until: list[str]) -> subprocess.Popen:
    """Bind ``server``'s socket and start its process on it (``serve``), logging to its log; ``until`` says when it
    ends (``--controller PID``: with that process; ``--idle SECONDS``: kept, after so long without a worker, in a
    session of its own)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(str(server.socket))
        listener.listen(128)  # launchers queue here while the server imports
        with open(server.log, "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-u", str(Path(__file__).resolve()), "serve", str(listener.fileno()),
                 str(server.socket), *until],
                pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=environment,
                start_new_session=server.kept)
    finally:
        listener.close()  # the server's copy alone: if it dies, launchers are refused and start workers fresh


def keep(tx: list[str], environment: dict[str, str], *, idle_s: float = KEPT_IDLE_S) -> Server | None:
    """The kept fork server for ``environment`` (``start``'s arguments): the one already running for the same key
    (this interpreter, folder, environment and the preloaded libraries' versions), else one started now, in a new
    session, to outlive this run. None where ``start`` would give none or the folder is not this user's alone."""
    if not _forkable(tx):
        return None
    folder = _kept_folder()
    if folder is None:
        return None
    key = _kept_key(environment)
    server = Server(None, folder, folder / f"{key}.socket", folder / f"{key}.log", kept=True)
    try:
        with open(folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one start per key, however many runs begin at once
            if _answers(server.socket):
                return server
            with contextlib.suppress(FileNotFoundError):
                server.socket.unlink()  # a server that ended without removing it
            server.process = _spawn(server, environment, ["--idle", repr(idle_s)])
    except OSError:
        return None
    return server


def _kept_folder() -> Path | None:
    """This user's folder of kept servers (``KEPT_FOLDER_ENV``, else one in the temporary folder), made if missing;
    None where another user owns it or may enter it: its sockets fork processes that run what they are sent."""
    folder = Path(os.environ.get(KEPT_FOLDER_ENV) or Path(tempfile.gettempdir()) / f"gqa-decode-warm-{os.getuid()}")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = folder.lstat()
    except OSError:
        return None
    private = stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid() and not status.st_mode & 0o077
    return folder if private else None


def _kept_key(environment: dict[str, str]) -> str:
    """What a kept server's imports depend on, hashed: the interpreter, the folder (the search path's first
    entry), the environment and the versions of the libraries it preloads; and this file."""
    versions = {}
    for name in dict.fromkeys(module.partition(".")[0] for module in PRELOAD):  # their distributions' names
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    here = Path(__file__).resolve()
    key = {"python": sys.executable, "folder": os.getcwd(), "versions": versions,
           "environment": {name: value for name, value in environment.items() if name not in _VOLATILE},
           "server": [str(here), here.stat().st_mtime_ns]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def _answers(socket_path: Path) -> bool:
    """Whether a server listens at ``socket_path`` (it answers a ping: at once where none listens, after its
    imports where one has just started)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.settimeout(READY_TIMEOUT_S)
        connection.connect(str(socket_path))
        socket.send_fds(connection, [json.dumps({"ping": True}).encode()], [])
        return connection.recv(16) == b"pong"
    except OSError:
        return False
    finally:
        connection.close()


# ---- the fork server -----------------------------------------------------------------------------------------


def serve(listener_fd: int, socket_path: str, *, controller: int | None = None, idle_s: float | None = None) -> None:
    """Import ``PRELOAD``, then fork a worker for each launcher that connects, until the ``controller`` is gone or,
    kept, until it has had no worker for ``idle_s`` or its socket is no longer the one at ``socket_path``."""
    if not sys.flags.safe_path:  # as in ``python -c``, which a worker is to itself (-P keeps the first path)
        sys.path[0] = ""
    # A terminal's Ctrl-C reaches the whole process group: it is the workers' to handle, and the server stays to
    # tell each launcher how its worker ended.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    listener = socket.socket(fileno=listener_fd)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listener")
    ours, busy = os.stat(socket_path).st_ino, time.monotonic()
    while os.getppid() == controller if controller is not None else _still_kept(socket_path, ours, busy, idle_s):
        for key, _ in selector.select(timeout=0.5):
            if key.data == "listener":
                _serve_one(listener, selector)
            elif key.fileobj == key.data.pidfd:  # a worker that ended
                key.data.ended(selector, launcher_gone=False)
            elif _hung_up(key.fileobj):  # a launcher that went away (else: its go, which its worker reads)
                key.data.ended(selector, launcher_gone=True)
        workers = _workers(selector)
        for worker in workers:
            if worker.pidfd is None:  # without pidfds, workers are polled
                worker.ended(selector, launcher_gone=False)
        if workers:
            busy = time.monotonic()
    if controller is not None:  # its controller is gone without stopping it (killed): the folder was the run's own
        shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)
    elif _still_ours(socket_path, ours):
        with contextlib.suppress(OSError):
            os.unlink(socket_path)


def _still_kept(socket_path: str, ours: int, busy: float, idle_s: float | None) -> bool:
    """A kept server serves on while its socket is its own (not removed, nor bound again by another) and it had a
    worker within ``idle_s``."""
    return _still_ours(socket_path, ours) and (idle_s is None or time.monotonic() - busy < idle_s)


def _still_ours(socket_path: str, ours: int) -> bool:
    try:
        return os.stat(socket_path).st_ino == ours
    except OSError:
        return False


def _serve_one(listener: socket.socket, selector: selectors.BaseSelector) -> None:
    """Fork a worker for the next launcher; whatever goes wrong here costs that launcher its warm start (told
    nothing, it starts its worker fresh), never the server."""
    try:
        connection, _ = listener.accept()
    except OSError:  # out of descriptors, say: that launcher gives up in time and starts its worker fresh
        traceback.print_exc()
        return
    if not _same_user(connection):  # the folder is private already: a second lock on running what is sent
        connection.close()
        return
    try:
        _fork_worker(connection, listener, selector)
    except Exception:  # noqa: BLE001 - logged; the handshake keeps a half-started worker from running
        traceback.print_exc()
        connection.close()


@dataclass(eq=False)
class _Worker:
    """A forked worker: its pid, its launcher's connection, and its pidfd (None where the platform has none)."""

    pid: int
    connection: socket.socket
    pidfd: int | None
    reported: bool = False

    def ended(self, selector: selectors.BaseSelector, *, launcher_gone: bool) -> None:
        """Its launcher went (kill the worker) or it may have ended: once it has, tell the launcher how (a negative
        number: the signal that ended it) and forget it."""
        if launcher_gone:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            if self.pidfd is not None:  # its pidfd tells when it has gone; the server waits for nobody
                _unregister(selector, self.connection)
                return
        try:
            pid, status = os.waitpid(self.pid, 0 if launcher_gone else os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 1 << 8
        if pid == 0 or self.reported:
            return
        self.reported = True
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        with contextlib.suppress(OSError):
            self.connection.sendall(f"exit {code}".encode())
        _unregister(selector, self.connection)
        self.connection.close()
        if self.pidfd is not None:
            _unregister(selector, self.pidfd)
            os.close(self.pidfd)


def _same_user(connection: socket.socket) -> bool:
    """Whether the process at the other end of ``connection`` runs as this one's user."""
    try:
        _, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except OSError:
        return False
    return uid == os.getuid()


def _hung_up(connection: socket.socket) -> bool:
    """Whether a launcher's connection is at its end (nothing waiting to be read would be a go for the worker)."""
    try:
        return connection.recv(16, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _unregister(selector: selectors.BaseSelector, held: socket.socket | int) -> None:
    with contextlib.suppress(KeyError, ValueError):
        selector.unregister(held)


def _workers(selector: selectors.BaseSelector) -> list[_Worker]:
    return list({key.data for key in selector.get_map().values() if key.data != "listener"})


def _fork_worker(connection: socket.socket, listener: socket.socket, selector: selectors.BaseSelector) -> None:
    """Receive a launcher's request and fork its worker. The worker takes over nothing before the launcher's go
    (sent once the launcher has heard "forked"), and says "started" once it has, before the launcher lets go of its
    streams: a launcher that gave up and started its worker fresh, or whose server failed before it heard
    "forked", leaves a child that ends untouched, never a second reader of the same pipes."""
    message, descriptors, _, _ = socket.recv_fds(connection, _MESSAGE_BYTES, 3)
    try:
        request = json.loads(message)
        if request.get("ping") and not descriptors:  # a run asking whether a kept server is there
            connection.sendall(b"pong")
            connection.close()
            return
        if len(descriptors) != 3:
            raise ValueError(f"{len(descriptors)} descriptors, not 3")
        server = os.getpid()
        pid = os.fork()
    except BaseException:
        _close(descriptors)
        raise
    if pid == 0:  # the child never returns to the loop: it ends by the SystemExit that leaves this interpreter
        try:
            held = [listener, *_held(selector)]
            selector.close()
            _become_worker(request, descriptors, connection, held, server)
        except SystemExit:
            raise
        except KeyboardInterrupt:  # as ``python -c`` would: print it and end by SIGINT, for the parent to see
            traceback.print_exc()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - as ``python -c`` would: print it and exit 1
            traceback.print_exc()
            raise SystemExit(1) from None
    _close(descriptors)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # an old kernel, or a sandbox that refuses it: polled instead
        pidfd = None
    worker = _Worker(pid, connection, pidfd)
    selector.register(connection, selectors.EVENT_READ, worker)
    if pidfd is not None:
        selector.register(pidfd, selectors.EVENT_READ, worker)
    try:
        connection.sendall(f"forked {pid}".encode())
    except OSError:  # the launcher is gone already: its child gets no go, and ends
        worker.ended(selector, launcher_gone=True)


def _close(descriptors: list[int]) -> None:
    for descriptor in descriptors:
        os.close(descriptor)


def _held(selector: selectors.BaseSelector) -> list:
    """The other workers' connections and pidfds, which a new worker must not keep open."""
    return [key.fileobj for key in selector.get_map().values() if key.data != "listener"]


def _become_worker(request: dict, descriptors: list[int], connection: socket.socket, held: list,
                   server: int) -> None:
    """In the forked child: wait for the launcher's go, take its streams, environment and folder, and run the
    bootstrap. It never returns: it ends as ``python -c`` would, by the SystemExit or exception that leaves this
    interpreter, whose ordinary exit follows (exit handlers, finalisers)."""
    for thing in held:
        if isinstance(thing, int):
            os.close(thing)
        else:
            thing.close()
    connection.settimeout(0.5)
    while True:  # the go, or the end: the launcher gave up (EOF), or the server that would tell it died
        try:
            if connection.recv(16) != b"go":
                os._exit(0)
            break
        except TimeoutError:
            if os.getppid() != server:
                os._exit(0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number, descriptor in enumerate(descriptors):
        os.dup2(descriptor, number)
        os.close(descriptor)
    connection.sendall(b"started")
    connection.close()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["-c"]
    sys.dont_write_bytecode = request["dont_write_bytecode"]
    main = types.ModuleType("__main__")  # a fresh one: multiprocessing's spawn must not import this script
    sys.modules["__main__"] = main
    exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    raise SystemExit(0)


# ---- the launcher ------------------------------------------------------------------------------------------


def launch(socket_path: str, python: str, arguments: list[str]) -> None:
    """Have the server fork the worker execnet asked for (``python ARGUMENTS``: ``-u [-B] -c CODE``), then wait
    for it and exit as it did; start it fresh where the server cannot."""
    request = _request(arguments)
    handed = _handed_over(socket_path, request) if request is not None else None
    if handed is None:
        os.execv(python, [python, *arguments])
    connection, worker = handed
    devnull = os.open(os.devnull, os.O_RDWR)
    for number in range(3):  # the worker holds the pipes now: their ends close when it ends
        os.dup2(devnull, number)
    answer = b""
    with contextlib.suppress(OSError):
        answer = connection.recv(64)
    if not answer.startswith(b"exit "):  # the server is gone: wait for the worker itself, its status unknown
        _wait_for(worker)
        sys.exit(1)
    code = int(answer.split()[1])
    if code < 0:  # ended by a signal: so does this process, as the worker's parent sees it
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set, and needs not be
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def _request(arguments: list[str]) -> dict | None:
    """The server's request for ``python ARGUMENTS``, or None where it holds an option the server cannot mirror."""
    options, code = arguments[:-2], arguments[-2:]
    if len(code) != 2 or code[0] != "-c" or any(option not in ("-u", "-B") for option in options):
        return None
    return {"code": code[1], "cwd": os.getcwd(), "env": dict(os.environ), "dont_write_bytecode": "-B" in options}


def _handed_over(socket_path: str, request: dict) -> tuple[socket.socket, int] | None:
    """Send the request with this process's standard streams and, once the worker is forked, tell it to go; the
    connection and the worker's pid once it has started, else None (the streams are still this process's alone:
    a worker that did not start has ended untouched)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.settimeout(READY_TIMEOUT_S)
        connection.connect(socket_path)
        socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
        forked = connection.recv(64)
        if not forked.startswith(b"forked "):
            raise OSError("no worker forked")
        # From the go on, no time limit: the worker either starts at once or ends, and either way this ends.
        signal.signal(signal.SIGINT, _interrupts_for(int(forked.split()[1])))
        connection.settimeout(None)
        connection.sendall(b"go")
        if connection.recv(64) != b"started":
            raise OSError("the worker did not start")
    except OSError:
        connection.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored, it would stay so in a fresh worker
        return None
    return connection, int(forked.split()[1])


def _interrupts_for(worker: int):
    """This launcher's SIGINT handler once its worker is forked: an interrupt is the worker's to handle, as without
    a launcher. A worker in this process's group (the run's own server's) has it from the terminal already; a kept
    server's, in that server's session, has it from here."""
    try:
        outside = os.getpgid(worker) != os.getpgrp()
    except OSError:
        outside = False
    if not outside:
        return signal.SIG_IGN

    def passed_on(*_) -> None:
        with contextlib.suppress(OSError):
            os.kill(worker, signal.SIGINT)

    return passed_on


def _wait_for(pid: int) -> None:
    """Until the process ``pid`` (not this one's child) has ended."""
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1].startswith("Z"):
                return  # ended, not yet reaped
        except OSError:  # gone
            return
        time.sleep(0.1)


if __name__ == "__main__":
    if sys.argv[1] == "serve":  # serve LISTENER_FD SOCKET (--controller PID | --idle SECONDS)
        until = {sys.argv[4]: sys.argv[5]}
        serve(int(sys.argv[2]), sys.argv[3], controller=int(until["--controller"]) if "--controller" in until else None,
              idle_s=float(until["--idle"]) if "--idle" in until else None)
    elif sys.argv[1] == "launch":
        launch(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(f"{sys.argv[0]}: expected serve or launch, not {sys.argv[1]!r}")
