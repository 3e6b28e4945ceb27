"""Crashes under MPS: each one is replayed alone at the end of the run before it is believed.

Under an MPS server (``devices.mps_control_pipe``) the processes sharing a GPU share its
faults: a process running a correct kernel beside one running a faulting kernel gets the
same "illegal memory access" and crashes too (docs/gpu.md), and nothing in the error tells
a process whether its own call faulted. With N workers per GPU, one fault can crash N
properties, each with a case file that does not replay.

So under MPS the controller, once every worker is gone, replays the case file of each
crash that owns its property (``python -m gqa_decode_fuzz.record.repro FILE``) in a fresh process,
outside MPS where the GPU allows it (``_replay_one``). A
crash whose case faults again stays a crash; one whose case passes alone is reported as
an error (no verdict on the kernel) with ``COLLATERAL`` as its reason; a replay that
cannot tell (timed out, could not run) leaves the crash standing. Replays on one GPU run
one after another (a replay that faults under MPS would reach its neighbours too), those
on different GPUs at once; at most ``MAX_REPLAYS`` of them, each within ``REPLAY_TIMEOUT_S`` and
all within ``REPLAY_BUDGET_S``. A run without a crash replays nothing and waits for nothing.

On CPU only an implementation that raises CUDA's messages crashes
(tests/impls/simulated_cuda_fault.py), which is how this path is tested without a GPU.
The results go to ``mps.json`` in the run's report folder, where the run report reads them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from gqa_decode_fuzz.engine.devices import MPS_PIPE_ENV

MAX_REPLAYS = 16  # two faults' worth at 8 workers per GPU; more crashes stay crashed, unconfirmed
REPLAY_TIMEOUT_S = 180.0  # a fresh process: imports, a Triton compile on a cold cache, a huge pool's build
REPLAY_BUDGET_S = 600.0  # from the first replay's start: none starts after it, none runs past it
FILE_NAME = "mps.json"
WORKER_UNDER_MPS = "gqa_decode_under_mps"  # xdist workerinput: whether the worker started inside an MPS server

REPRODUCED = "reproduced"  # stays crashed
DID_NOT_REPRODUCE = "did not reproduce"  # reported as an error (no verdict on the kernel), with COLLATERAL
UNCONFIRMED = "unconfirmed"  # the replay could not tell: stays crashed
COLLATERAL = ("crashed under MPS but the case did not fault when replayed alone: most likely another "
              "process's fault on the same GPU (under MPS one process's fault reaches them all)")

__all__ = ["COLLATERAL", "DID_NOT_REPRODUCE", "MAX_REPLAYS", "REPLAY_BUDGET_S", "REPLAY_TIMEOUT_S", "REPRODUCED",
           "UNCONFIRMED", "WORKER_UNDER_MPS", "Replay", "crashed_under_mps", "header_line", "load", "replay_crashes",
           "report_line", "save"]


@dataclass(frozen=True)
class Replay:
    """One crash replayed alone: its test item, case file, status (``REPRODUCED``, ``DID_NOT_REPRODUCE``
    or ``UNCONFIRMED``), a short why, and the replay's seconds."""

    nodeid: str
    case_file: str | None
    status: str
    detail: str
    seconds: float = 0.0

    @property
    def collateral(self) -> bool:
        """Whether the crash is not the kernel's: its case passed when replayed alone."""
        return self.status == DID_NOT_REPRODUCE


def crashed_under_mps(report) -> bool:
    """Whether the worker of a crash report (xdist's, ``report.node``) ran inside an MPS server: a crash of a worker
    that ran outside one (time-sliced, ``mps_server.Server.leave``) is its own and needs no replay."""
    node = getattr(report, "node", None)
    return bool(getattr(node, "workerinput", {}).get(WORKER_UNDER_MPS, True))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def _replay_one(nodeid: str, case_file: str, *, device: str, root: Path, gpu: str | None, timeout: float) -> Replay:
    """Replay one case file in a fresh process; its exit status (see ``record.repro.replay``) decides.

    First outside MPS: a process of its own on the GPU, which no other process's fault reaches, and which
    starts even while a faulted MPS client (a crashed run without xdist, still reporting) keeps the server
    from taking new clients. Where the GPU takes no process outside MPS (exclusive-process mode: the replay
    finds no device and exits 2), once more inside it.
    """
    from .casefiles import REPLAY_MODULE  # here, not at import: casefiles imports torch, the header needs none

    command = [sys.executable, "-m", REPLAY_MODULE, case_file, "--device", device, "--no-png"]
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}  # not a test
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gqa-decode-no-mps-") as no_pipe:
        for where, attempt_env in (("outside MPS", {**env, MPS_PIPE_ENV: no_pipe}), ("inside MPS", env)):
            try:
                done = subprocess.run(command, cwd=root, env=attempt_env, capture_output=True, text=True,
                                      timeout=timeout)
            except subprocess.TimeoutExpired:
                return Replay(nodeid, case_file, UNCONFIRMED, f"the replay ({where}) ran past {timeout:.0f} s",
                              time.perf_counter() - started)
            if done.returncode != 2:
                break
    seconds = time.perf_counter() - started
    if done.returncode == 1:
        return Replay(nodeid, case_file, REPRODUCED, f"faulted again when replayed alone ({where}): "
                                                     f"{_last_line(done.stdout)}", seconds)
    if done.returncode == 0:
        return Replay(nodeid, case_file, DID_NOT_REPRODUCE, f"passed when replayed alone ({where})", seconds)
    last = _last_line(done.stdout + "\n" + done.stderr)
    return Replay(nodeid, case_file, UNCONFIRMED, f"the replay ({where}) exited with status {done.returncode}: "
                                                  f"{last}", seconds)


def replay_crashes(crashes: Mapping[str, str | None], *, device: str, root: Path,
                   lanes: Sequence[str | None] = (None,), limit: int = MAX_REPLAYS,
                   timeout: float = REPLAY_TIMEOUT_S, budget: float = REPLAY_BUDGET_S) -> list[Replay]:
    """Replay each crash's case file alone; one ``Replay`` per crash, in node-id order.

    ``crashes`` maps a crashed test item to its case file (None: none was saved); ``device`` is the run's
    device type; ``root`` the directory the run resolved ``--impl`` against; ``lanes`` the GPUs to replay on
    (``CUDA_VISIBLE_DEVICES`` values; None inherits this process's), each running its share one at a time.
    Crashes past ``limit``, those without a case file and those the ``budget`` leaves no time for are not
    replayed and stay crashed.
    """
    if not lanes:
        raise ValueError("lanes=[]: expected at least one lane (None: the GPUs this process sees)")
    named = sorted(crashes.items())
    todo = [(nodeid, path) for nodeid, path in named if path][:limit]
    left = [Replay(nodeid, path, UNCONFIRMED, "no case file to replay" if not path else
                   f"not replayed: the run replays at most {limit} crashes") for nodeid, path in named
            if (nodeid, path) not in todo]

    deadline = time.monotonic() + budget

    def lane(share: list[tuple[str, str]], gpu: str | None) -> list[Replay]:
        replays = []
        for nodeid, path in share:
            left_s = deadline - time.monotonic()
            replays.append(_replay_one(nodeid, path, device=device, root=root, gpu=gpu, timeout=min(timeout, left_s))
                           if left_s > 1 else Replay(nodeid, path, UNCONFIRMED, f"not replayed: the run's replays "
                                                                                 f"had {budget:.0f} s in all"))
        return replays

    shares = [todo[start::len(lanes)] for start in range(len(lanes))]
    with ThreadPoolExecutor(max_workers=len(lanes), thread_name_prefix="gqa-decode-replay") as pool:
        done = [replay for replays in pool.map(lane, shares, lanes) for replay in replays]
    return sorted([*done, *left], key=lambda replay: replay.nodeid)


# ---- words and the report's file ------------------------------------------------------------


def header_line(pipe: Path, started_s: float | None = None) -> str:
    """The terminal header's line: MPS is on, whether the run started its server (in ``started_s`` seconds,
    ``mps_server``), and what that means for crashes."""
    own = "" if started_s is None else f" (the run's own, started in {started_s:.1f} s; --mps=off: time-sliced)"
    return (f"gqa-decode: MPS server at {pipe}{own}: a GPU fault in one process reaches every process on its GPU, "
            "so each crash is replayed alone after the run and stays a crash only if it faults again")


def report_line(pipe: str | Path, replays: Sequence[Replay]) -> str:
    """The run report's line (report.md and summary.png): MPS was on, and what the crash replays found."""
    line = f"MPS server at {pipe}: one process's GPU fault reaches every process on its GPU; "
    if not replays:
        return line + "no crash to replay"
    count = {status: sum(r.status == status for r in replays) for status in (REPRODUCED, DID_NOT_REPRODUCE,
                                                                             UNCONFIRMED)}
    said = [f"{count[REPRODUCED]} faulted again (crashed)", f"{count[DID_NOT_REPRODUCE]} did not (error)"]
    if count[UNCONFIRMED]:
        said.append(f"{count[UNCONFIRMED]} unconfirmed (kept as crashed)")
    return line + f"of {len(replays)} crash(es) replayed alone, " + ", ".join(said)


def save(directory: Path, pipe: Path, replays: Sequence[Replay]) -> Path:
    """Write ``mps.json`` (the control pipe and the replays) into a run's report folder."""
    path = directory / FILE_NAME
    path.write_text(json.dumps({"control_pipe": str(pipe), "replays": [asdict(r) for r in replays]}, indent=1),
                    encoding="utf-8")
    return path


def load(directory: Path) -> tuple[str, list[Replay]] | None:
    """A report folder's ``mps.json``: the control pipe and the replays; None when the run was not under MPS."""
    path = directory / FILE_NAME
    if not path.is_file():
        return None
    saved = json.loads(path.read_text(encoding="utf-8"))
    return saved["control_pipe"], [Replay(**replay) for replay in saved["replays"]]
