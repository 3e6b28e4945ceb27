"""A run's plan and state, made by the plugin at configure time and read by its hooks (``SuiteRun``) and fixtures:
``RunPlan``, what the options and the machine say, settled without torch (all an xdist controller knows when it
starts its workers), and ``RunState``, the plan with what loading torch and the implementation settled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from gqa_decode_fuzz.engine import child_start
    from gqa_decode_fuzz.engine.target import Target
    from gqa_decode_fuzz.generation.sizes import SizeLimits
    from gqa_decode_fuzz.generation.warm_up import Warming
    from gqa_decode_fuzz.record.casefiles import ArtifactBudget
    from gqa_decode_fuzz.reference.definitions import Definition

    from . import mps_server, warm_workers

__all__ = ["RunPlan", "RunState"]


@dataclass(frozen=True)
class RunPlan:
    """What the options and the machine say about this run, settled without importing torch or the
    implementation: all that an xdist controller knows when it starts its workers."""

    spec: str  # --impl
    device: str  # "cuda" or "cpu"
    contract: str  # "correct" or "strict"
    sizes: str
    run_id: str
    worker: str | None  # the xdist worker id, None outside xdist workers
    controller: bool  # an xdist controller (its workers inherit its run id, claims and GPUs)
    claims_dir: Path  # failure claims, shared by the controller and its workers
    made_dirs: tuple[Path, ...]  # made by this process, removed at its end
    mps_server: mps_server.Server | None = None  # started by this controller for its workers, stopped at its end
    no_mps_server: str | None = None  # why starting one failed, for the header
    isolated: bool = False  # the implementation runs in a child process (``isolation``)
    deadline: float | None = None  # --time-budget: no test starts after this time.time()
    child: child_start.Started | None = None  # isolated, not a controller: the child, spawned before torch is here
    warm_server: warm_workers.Server | None = None  # an xdist controller's: its workers are forked from it


@dataclass(frozen=True)
class RunState:
    """What this run tests, where, to which tier, and where its failures and report go: its ``plan`` (the tier, the
    run id, the worker, ...) with what loading torch and the implementation settled."""

    plan: RunPlan
    target: Target
    definitions: tuple[Definition, ...]  # each property runs once per each
    device: torch.device
    limits: SizeLimits
    failures_dir: Path
    failures_budget: ArtifactBudget
    report_dir: Path | None  # None: no run report
    workload_cases: tuple = ()  # DecodeCases of --workloads, explicit examples of the property marked ``workloads``
    warming: Warming | None = None  # the first calls made while the implementation loads; waited for by the first test
