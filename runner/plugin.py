"""The suite's pytest plugin: options, the run's plan and state, and the fixtures; the hooks of a run are the
methods of one ``SuiteRun`` object (``suite_run``).

Loaded by the repository's conftest.py (``pytest_plugins``) or, when the suite is
installed, by its ``pytest11`` entry point. A failing example travels one line, each
stage owned by one module:

  strategy (``strategies``) -> builder (``cases``) -> guarded call (``containment``) ->
  oracle, bound and comparison (``reference``) -> verdict (``SuiteRun.pytest_runtest_makereport``)
  -> case file (``casefiles``) -> run report (``run_report``) -> replay (``record.repro``).

An xdist controller whose workers share a GPU starts an MPS server of the run's own for them
(``mps_server``, ``--mps``). Under MPS (``devices.mps_control_pipe``) a crash is believed only once its
case file, replayed alone at the end of the run, faults again (``mps``).

Importing this module imports neither torch nor Triton nor the implementation, so that an xdist
controller starts its workers first: it plans the run (``RunPlan``: the device from the CUDA
driver's device count, the run id, the GPUs the workers share) at configure time, and loads the
implementation and the ``SuiteRun`` (``_start``) at its collection step, while its workers start.
Every other process (a worker, a run without xdist) does both at configure time. With warm workers
(``--warm-workers``, the default) the workers are forked from a server of the controller's that imports torch
and Triton once (``warm_workers``); while they wait for its imports, the controller makes its whole load
(torch, Triton, the implementation) in a thread (``_Loading``), and its collection step only takes the result.
"""

from __future__ import annotations

from . import gpus
from .assert_rewriting import leave_unrewritten

# An xdist worker claims its GPU before anything can initialise CUDA in this process.
PIN = gpus.pin_this_worker()
gpus.share_cores()  # before torch, numpy and the child start: they read the count once
leave_unrewritten("hypothesis")  # before its first import: no assert rewriting of it at every start
# ruff: noqa: E402  (everything below is imported after the pin, on purpose)

import argparse
import datetime
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings
from xdist import get_xdist_worker_id, is_xdist_controller, is_xdist_worker

from gqa_decode_fuzz.engine import child_start, devices, examples, isolation
from gqa_decode_fuzz.engine.target import (
    DEFAULT_IMPL,
    DeviceError,
    ImplSpecError,
    Target,
    check_spec,
    confirm_device,
    device_type,
    resolve_device,
)
from gqa_decode_fuzz.record import mps
from gqa_decode_fuzz.reference import definitions

from . import mps_server, profiles, shards, warm_workers
from .run_state import RunPlan, RunState

# Loaded with this plugin however it is loaded (conftest.py, or an installed copy's pytest11 entry point): an xdist
# worker's prompt end of process and every process's frozen garbage-collector generation (``prompt_exit``).
pytest_plugins = [__name__.rpartition(".")[0] + ".prompt_exit"]

if TYPE_CHECKING:
    import torch

    from gqa_decode_fuzz.generation.warm_up import Warming
    from gqa_decode_fuzz.reference.definitions import Definition

    from .suite_run import SuiteRun

RUN_ID_ENV = "GQA_DECODE_RUN_ID"
DEADLINE_ENV = "GQA_DECODE_DEADLINE"  # the controller's --time-budget as a wall-clock time, for its workers
CLAIMS_DIR_ENV = "GQA_DECODE_CLAIMS_DIR"
CONTRACTS = ("auto", "correct", "strict")

profiles.register_profiles()
profiles.skip_pareto_front()
# The hypothesis plugin's --hypothesis-profile, when given, overrides this at configure time.
settings.load_profile(profiles.default_profile())


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive whole number")
    return number


def count_or_auto(text: str) -> int | str:
    """argparse type of ``--shards`` and ``--workers-per-gpu``: a positive whole number, or ``auto``."""
    return text if text == "auto" else positive_int(text)


_OPTIONS = (
    # flag, environment variable, default, type, choices, metavar, help
    ("--impl", "GQA_DECODE_IMPL", DEFAULT_IMPL, str, None, "TARGET",
     "implementation under test: 'package.module:function' or 'path/to/file.py:function'"),
    ("--definition", "GQA_DECODE_DEFINITION", None, str, None, "NAME",
     "the contract: a built-in definition's name, path/to/definition.json (a FlashInfer-Bench Definition file), "
     "a comma-separated list of them, or all (the built-in family; each property runs once per definition); "
     "default: gqa_paged_decode_h32_kv4_d128_ps1, or a Solution file's own"),
    ("--device", "GQA_DECODE_DEVICE", "auto", str, ("auto", "cpu", "cuda"), None,
     "where the kernel runs: cuda, cpu (Triton interpreter), or auto (cuda when available)"),
    ("--contract", "GQA_DECODE_CONTRACT", "auto", str, CONTRACTS, None,
     "claims to hold the implementation to: correct (what every correct implementation must do), strict "
     "(also this project's kernel's promises: bitwise determinism, named errors); auto: strict for the "
     "project's kernel, correct for any other --impl"),
    ("--case-sizes", "GQA_DECODE_CASE_SIZES", None, str, tuple(profiles.CASE_SIZES), None,
     "size limits of generated cases; default small on cpu, large on cuda"),
    ("--workers-per-gpu", gpus.WORKERS_PER_GPU_ENV, "auto", count_or_auto, None, "N",
     "xdist workers per visible GPU under -n auto; auto: three workers for four cores, at most "
     f"{gpus.MEASURED_KNEE} (the measured knee)"),
    ("--mps", "GQA_DECODE_MPS", "auto", str, mps_server.MODES, None,
     "auto: workers that share a GPU run side by side under an MPS server of the run's own (faster; one "
     "process's GPU fault then reaches its neighbours, and crashes are replayed alone after the run), an "
     "isolated implementation's children outside it; all: the children inside it too (faster on a shared GPU; "
     "a child's fault then crashes its neighbours); off: they take turns on it"),
    ("--shards", "GQA_DECODE_SHARDS", "auto", count_or_auto, None, "N",
     "split each property into N items with a share of the examples each; auto: one per xdist worker"),
    ("--max-examples", "GQA_DECODE_MAX_EXAMPLES", None, positive_int, None, "N",
     "examples per property instead of the profile's, shared among its shards"),
    ("--failures-dir", "GQA_DECODE_FAILURES_DIR", "failures", str, None, "DIR",
     "where failing examples are saved as case files"),
    ("--failures-budget", "GQA_DECODE_FAILURES_BUDGET_MB", "1024", positive_int, None, "MB",
     "most megabytes of case files one run writes (each file is at most 4 MB)"),
    ("--run-report", "GQA_DECODE_REPORT_DIR", "reports", str, None, "DIR",
     "where the run report goes, one folder per run; 'none' for no report"),
    ("--report-picture", "GQA_DECODE_REPORT_PICTURE", "on", str, ("on", "off"), None,
     "on: the run report includes summary.png; off: report.md and report.json only, a second or so sooner "
     "(check --first-failure's; gqa-decode-fuzz merge-reports DIR draws it later)"),
    ("--workloads", "GQA_DECODE_WORKLOADS", None, str, None, "FILE.jsonl",
     "FlashInfer-Bench workloads (flashinfer-trace JSONL) of the definition under test: each becomes an "
     "explicit example of the central property"),
    ("--isolation", "GQA_DECODE_ISOLATION", "auto", str, isolation.MODES, None,
     "on: the implementation runs in a child process, which cannot touch the checker and whose crash or hang "
     "fails the example; off: inside the checking process (trusted); auto: on for every --impl but this "
     "project's own kernel"),
    ("--sanitize", "GQA_DECODE_SANITIZE", None, str, isolation.SANITIZER_TOOLS, None,
     "run one example in --sanitize-every in a child under compute-sanitizer --tool TOOL (GPU; needs isolation)"),
    ("--time-budget", "GQA_DECODE_TIME_BUDGET", None, positive_int, None, "SECONDS",
     "start no test once SECONDS have passed since the run began: the rest are reported as not started, and the "
     "failures found so far are still grouped into root causes, probing within what is left of SECONDS or for 30 s "
     "past it (a test that has started runs to its end, but stops shrinking once SECONDS are spent, or 10 s after "
     "its shrink started where that is later)"),
    ("--shrink-limit", "GQA_DECODE_SHRINK_LIMIT", None, positive_int, None, "SECONDS",
     "shrink each failure for at most SECONDS (Hypothesis's own limit is five minutes), then report the smallest "
     "failing example found by then, noted as such; a --time-budget also stops shrinks once it is spent, but "
     "gives a shrink that starts near its end 10 s"),
    ("--warm-workers", "GQA_DECODE_WARM_WORKERS", "on", str, warm_workers.MODES, None,
     "on: xdist's workers are forked from a process of the run's own that has imported torch and Triton once, "
     "instead of each starting a fresh interpreter that imports them (seconds sooner to the first test on a GPU "
     "host); kept: from such a process kept after the run for the next one of the same environment, which then "
     "waits for no import (it ends after 15 idle minutes); off: fresh, as xdist starts them"),
    ("--sanitize-every", "GQA_DECODE_SANITIZE_EVERY", str(isolation.SANITIZE_EVERY), positive_int, None, "N",
     "with --sanitize: about one example in N runs under the sanitizer"),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gqa-decode", "GQA paged-decode property suite")
    for flag, env, default, kind, choices, metavar, text in _OPTIONS:
        group.addoption(
            flag, dest=flag.lstrip("-").replace("-", "_"), default=os.environ.get(env, default), type=kind,
            choices=choices, metavar=metavar, help=f"{text} (env {env})",
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: --workers-per-gpu workers per visible GPU; the core count without CUDA."""
    return gpus.auto_worker_count(config.option.device, config.option.workers_per_gpu)



PLAN = pytest.StashKey[RunPlan]()
RUN = pytest.StashKey[RunState]()
WORKER_DEVICE_KEY = "gqa_decode_device"  # xdist workerinput: the device the controller resolved
SUITE_RUN = "gqa-decode-run"  # the name the SuiteRun object is registered under


def _xdist_role(config: pytest.Config) -> SimpleNamespace:
    """What xdist's helpers (written for a request or session) need: an object with ``.config``."""
    return SimpleNamespace(config=config)


def _tier(option: str, spec: str) -> str:
    if option != "auto":
        return option
    return "strict" if spec == DEFAULT_IMPL else "correct"


def _is_controller(config: pytest.Config) -> bool:
    """Whether this process is an xdist controller; False where xdist is not loaded (``-p no:xdist``), whose
    helper would ask for an option that then does not exist."""
    return hasattr(config.option, "dist") and is_xdist_controller(_xdist_role(config))


def _starts_workers(config: pytest.Config) -> bool:
    """Whether this process is an xdist controller about to start workers (with --collect-only xdist starts none
    and the controller collects itself)."""
    return _is_controller(config) and not config.option.collectonly


def _run_plan(config: pytest.Config) -> RunPlan:
    option = config.option
    role = _xdist_role(config)
    worker = get_xdist_worker_id(role) if is_xdist_worker(role) else None
    controller = _is_controller(config)
    # An xdist worker takes the device its controller resolved --device to (``_run_state`` has torch confirm it).
    # Resolving ``auto`` itself, it would go to the CPU interpreter, silently, whenever CUDA failed to start in it
    # (under MPS a GPU whose faulted processes are still exiting refuses new ones): it must fail instead.
    controllers_device = getattr(config, "workerinput", {}).get(WORKER_DEVICE_KEY)
    isolated = _isolated(option)
    try:
        if controllers_device:
            device = controllers_device
        elif controller:  # without torch: the workers start before this process imports it
            device = device_type(option.device)
            check_spec(option.impl, root=config.rootpath, find=not isolated)  # the rest: once they are starting
        else:  # without torch too: its import here overlaps the child's (``_run_state`` has torch confirm it)
            device = device_type(option.device)
    except (DeviceError, ImplSpecError) as error:
        raise pytest.UsageError(str(error)) from None
    child = child_start.start(_launch(option, config.rootpath, device)) if (
        isolated and not controller) else None
    # The controller names the run and its workers inherit the name; a worker then drops it, so that a
    # pytest it starts (tests/ does) is a run of its own.
    run_id = os.environ.pop(RUN_ID_ENV, None) if worker else None
    run_id = run_id or datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + str(os.getpid())
    inherited = os.environ.get(CLAIMS_DIR_ENV) if worker else None
    claims_dir = Path(inherited) if inherited else Path(tempfile.mkdtemp(prefix="gqa-decode-claims-"))
    made = () if inherited else (claims_dir,)
    deadline = _deadline(option.time_budget, worker)
    server, no_server = None, None
    warm = _warm_server(config, device) if _starts_workers(config) else None
    if controller:  # what its workers inherit through their environment
        os.environ[RUN_ID_ENV] = run_id
        if deadline is not None:
            os.environ[DEADLINE_ENV] = repr(deadline)
        os.environ[CLAIMS_DIR_ENV] = str(claims_dir)
        if device == "cuda":
            ids = gpus.visible_gpu_ids(devices.cuda_device_count())
            made += (gpus.export_gpus(ids, gpus.workers_per_gpu(option.workers_per_gpu, len(ids))),)
            if _starts_workers(config):
                server, no_server = _own_mps_server(option.mps, ids, option.numprocesses or 0)
    return RunPlan(
        spec=option.impl, device=device, contract=_tier(option.contract, option.impl),
        sizes=option.case_sizes or ("small" if device == "cpu" else "large"), run_id=run_id, worker=worker,
        controller=controller, claims_dir=claims_dir, made_dirs=made, mps_server=server, no_mps_server=no_server,
        isolated=isolated, deadline=deadline, child=child, warm_server=warm,
    )


def _warm_server(config: pytest.Config, device: str) -> warm_workers.Server | None:
    """An xdist controller about to start its workers: fork them from a server with torch imported
    (``--warm-workers``). Its imports see what a worker's would: a worker's share of the cores, and on the CPU the
    Triton interpreter switched on (Triton decides at its import whether its own functions are interpreted)."""
    mode = config.option.warm_workers
    if mode == "off":
        return None
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # as ``resolve_device`` sets it later, before this process's import
    tx = config.option.tx
    environment = dict(os.environ, **gpus.core_share(len(tx)))
    server = warm_workers.keep(tx, environment) if mode == "kept" else warm_workers.start(tx, environment)
    if server is not None:
        config.option.tx = [server.spec()] * len(tx)
        config.add_cleanup(server.stop)  # where configuring fails after this (unconfigure stops it otherwise)
    return server


def _launch(option: argparse.Namespace, root: Path, device: str) -> child_start.Launch:
    """The plain child this process starts before it imports torch (``load_target_for`` takes it over)."""
    return child_start.Launch(option.impl, root, device, inside_mps=mps_server.children_inside(option.mps))


def _deadline(budget_s: int | None, worker: str | None) -> float | None:
    """When the run's --time-budget ends (``time.time()``): its controller's, for an xdist worker, so that every
    process stops starting tests at the same moment."""
    inherited = os.environ.pop(DEADLINE_ENV, None) if worker else None
    if inherited:
        return float(inherited)
    return time.time() + budget_s if budget_s else None


def _isolated(option: argparse.Namespace) -> bool:
    """Whether this run's implementation runs in a child process; --sanitize without it is a usage error."""
    isolated = isolation.isolated(option.isolation, option.impl, DEFAULT_IMPL)
    if option.sanitize and not isolated:
        raise pytest.UsageError(f"--sanitize={option.sanitize} runs the implementation in a sanitized child "
                                f"process: it needs --isolation=on or auto, not --isolation={option.isolation}")
    return isolated


def _load_target(config: pytest.Config, plan: RunPlan, device: torch.device, definition: Definition | None) -> Target:
    """The implementation: imported here, or (isolated) in a child process that reports its declarations.
    ``definition``: the one ``--definition`` names, if any (a Solution file for another is refused)."""
    from gqa_decode_fuzz.engine.isolated_impl import load_target_for  # torch: after the workers start

    option = config.option
    return load_target_for(plan.spec, config.rootpath, device.type, definition, isolated=plan.isolated,
                           sanitize=option.sanitize, sanitize_every=option.sanitize_every, started=plan.child,
                           inside_mps=mps_server.children_inside(option.mps))


def _own_mps_server(mode: str, gpu_ids: list[str], workers: int) -> tuple[mps_server.Server | None, str | None]:
    """An xdist controller on CUDA: start the run's own MPS server where ``mps_server`` says so, and name it to
    the workers it is about to start; the server, or None and why starting one failed (None where the run
    wants none)."""
    if mps_server.why_not(mode, gpu_ids, workers, devices.mps_control_pipe()) is not None:
        return None, None
    server, trouble = mps_server.start(gpu_ids, can_leave=devices.shared_compute_mode())
    if server is not None:
        os.environ.update(server.environ())
    return server, trouble


def _run_state(config: pytest.Config, plan: RunPlan) -> RunState:
    """The plan with torch's device and the loaded implementation; a usage error where either fails."""
    from gqa_decode_fuzz.record.casefiles import ArtifactBudget  # torch: after the workers start

    option = config.option
    try:
        # Not given: the seed's, or a Solution file's own (load_target refuses one that disagrees with a given one).
        # --definition=all is every built-in of every op type; each property runs for the definitions of its own.
        chosen = definitions.select(option.definition, config.rootpath) if option.definition else None
        device = resolve_device(plan.device) if plan.worker else confirm_device(option.device, plan.device)
        warming = _warming(plan, device)
        target = _load_target(config, plan, device, chosen[0] if chosen else None)
        chosen = chosen or (target.definition or definitions.SEED,)
        try:
            _check_serves(target, chosen)
        except ImplSpecError:
            if callable(getattr(target.function, "close", None)):  # an isolated child: stopped, or exit waits on it
                target.function.close()
            raise
    except (DeviceError, ImplSpecError, definitions.DefinitionError) as error:
        if plan.child is not None:  # not taken, or its target's close above: stopping it again is harmless
            plan.child.stop()
        where = "xdist worker on the run's device: " if plan.worker else ""
        raise pytest.UsageError(f"{where}{error}") from None
    workload_cases = _workload_cases(option.workloads, config.rootpath, chosen)
    report = option.run_report
    return RunState(
        plan=plan, target=target, definitions=chosen, device=device, limits=profiles.CASE_SIZES[plan.sizes],
        failures_dir=config.rootpath / option.failures_dir,
        failures_budget=ArtifactBudget(option.failures_budget * 2**20),
        report_dir=None if report == "none" else config.rootpath / report / plan.run_id,
        workload_cases=workload_cases, warming=warming,
    )


def _warming(plan: RunPlan, device: torch.device) -> Warming | None:
    """On CUDA, in a process that runs tests: the warm-up, started now so that it overlaps loading the implementation
    (an isolated one waits for its child)."""
    if device.type != "cuda" or plan.controller:
        return None
    from gqa_decode_fuzz.generation import warm_up  # imported here, not raced by the thread's imports

    return warm_up.Warming(device) if warm_up.warm_up_enabled() else None


def _check_serves(target: Target, chosen: tuple) -> None:
    """A target without ``for_definition`` serves one definition; one with it is bound to each (a refusal is a
    usage error now, not a failure of every test later)."""
    if len(chosen) > 1 and not target.serves_several:
        raise ImplSpecError(f"--impl={target.spec!r} declares no for_definition, so it serves one definition; "
                            f"--definition names {len(chosen)}: name one")
    for definition in chosen:
        target.serving(definition)


def _workload_cases(spec: str | None, root: Path, chosen: tuple) -> tuple:
    """``--workloads``' lines as cases of the run's one definition; a usage error naming what cannot be built."""
    if not spec:
        return ()
    from gqa_decode_fuzz.generation import workloads  # torch: after the workers start

    if len(chosen) != 1:
        raise pytest.UsageError(f"--workloads={spec!r}: a workload file belongs to one definition; --definition "
                                f"names {len(chosen)}")
    path = Path(spec) if Path(spec).is_absolute() else root / spec
    try:
        return tuple(workloads.workload_case(w, chosen[0]) for w in workloads.read_workloads(path))
    except workloads.WorkloadError as error:
        raise pytest.UsageError(str(error)) from None


class _Loading:
    """An xdist controller's load (torch, Triton, the implementation, the ``RunState``) in a thread started as it
    configures, so that it overlaps the start of its workers instead of following it; its collection step takes
    the result (``result``), or the error, a usage error on the main thread as a load there would raise it."""

    def __init__(self, config: pytest.Config, plan: RunPlan) -> None:
        self._state: RunState | None = None
        self._error: BaseException | None = None
        # Started after every write to the environment of this process: the thread reads it as it imports.
        self._thread = threading.Thread(target=self._load, args=(config, plan), name="gqa-decode-load", daemon=True)
        self._thread.start()

    def _load(self, config: pytest.Config, plan: RunPlan) -> None:
        try:
            warm_workers.preload()
            from . import suite_run  # noqa: F401  (torch and the engine: imported here, off the main thread)

            self._state = _loaded_state(config, plan)
        except BaseException as error:  # noqa: BLE001  (raised again on the main thread by ``result``)
            self._error = error

    def result(self) -> RunState:
        """The loaded state; what the load raised, raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._state


LOADING = pytest.StashKey[_Loading]()


def _loaded_state(config: pytest.Config, plan: RunPlan) -> RunState:
    """``_run_state``; an xdist controller of an isolated implementation then stops its child, which only told it
    the declarations (it runs no test, and the process's exit would wait on the child)."""
    state = _run_state(config, plan)
    if plan.controller and plan.isolated:
        state.target.function.close()
    return state


def _start(config: pytest.Config) -> SuiteRun:
    """Register the run's ``SuiteRun``, with its state: loaded now, or taken from the controller's ``_Loading``."""
    plan = config.stash[PLAN]
    loading = config.stash.get(LOADING, None)
    state = loading.result() if loading is not None else _loaded_state(config, plan)
    from .suite_run import SuiteRun  # torch: after the workers start

    config.stash[RUN] = state
    run = SuiteRun(config, state, PIN)
    config.pluginmanager.register(run, SUITE_RUN)
    return run


def _declarations(target: Target) -> list[str]:
    return [f"gqa-decode: the implementation declares {said}" for said in target.declarations()]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped when the kernel runs in the interpreter")
    config.addinivalue_line("markers", "strict: a claim of the strict tier only (--contract=strict)")
    config.addinivalue_line("markers", "paged: a claim about pages of several tokens; skipped where pages hold one")
    config.addinivalue_line("markers", "empty_sequences: a claim about empty sequences; skipped for an "
                                       "implementation that waives empty_sequences")
    config.addinivalue_line("markers", "input_validation: a claim about calls the contract forbids; skipped "
                                       "for an implementation that waives input_validation")
    config.addinivalue_line("markers", "prefill: a causal prefill property; runs for prefill definitions only "
                                       "(the others run for decode definitions only; deselected, not skipped)")
    config.addinivalue_line("markers", "pool: a claim about the page pool; skipped for ragged K and V")
    config.addinivalue_line("markers", "destination_passing: a claim about destination-passing calls; skipped for "
                                       "an implementation that returns its results")
    config.addinivalue_line("markers", "claim(reference): the claim a property checks ('module:name'); put there by "
                                       "properties.claims.property_claim, required of every test in the suite")
    config.addinivalue_line("markers", "workloads(argument): each --workloads case becomes an explicit example of "
                                       "this property, given as its argument named so")
    plan = config.stash[PLAN] = _run_plan(config)
    if not _starts_workers(config):
        _start(config)
    elif plan.warm_server is not None:  # its workers wait for the server's imports: it makes its own meanwhile
        warm_workers.start_gateways_at_once()
        config.stash[LOADING] = _Loading(config, plan)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker runs on the device this run resolved (see ``_run_plan``), and is told
    whether it started inside an MPS server (its environment was just copied from this process's)."""
    node.workerinput[WORKER_DEVICE_KEY] = node.config.stash[PLAN].device
    node.workerinput[mps.WORKER_UNDER_MPS] = devices.mps_control_pipe() is not None


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error: object | None) -> None:
    """xdist controller, a worker crashed (xdist starts its replacement next): under the run's own MPS server the
    replacements run time-sliced from now on (``mps_server.Server.leave``)."""
    plan = node.config.stash[PLAN]
    if error is None or plan.mps_server is None or not plan.mps_server.leave():
        return
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("\ngqa-decode: a worker crashed under the run's MPS server, where one process's GPU "
                            "fault reaches them all: the workers that replace crashed ones run time-sliced")


CHILDREN_INSIDE_MPS = ("gqa-decode: --mps=all: the isolated implementation's children run inside the MPS server too, "
                       "so its GPU fault crashes the workers beside it (--mps=auto keeps each child's fault its own)")


WARM_WORKERS = ("gqa-decode: warm workers: each forked from a process with torch and Triton imported "
                "(--warm-workers=off: fresh interpreters)")
KEPT_WORKERS = "; it is kept for the next run (--warm-workers=kept)"


def pytest_report_header(config: pytest.Config) -> list[str]:
    plan = config.stash[PLAN]
    run = config.stash.get(RUN, None)
    pipe = devices.mps_control_pipe()
    children_inside = plan.isolated and mps_server.children_inside(config.option.mps)
    return [f"gqa-decode: impl={plan.spec} contract={plan.contract} device={plan.device} case-sizes={plan.sizes} "
            f"hypothesis-profile={shards.profile_name()} shards={config.option.shards} run={plan.run_id}",
            f"gqa-decode: definition={_definition_names(config, run)}",
            "gqa-decode: " + isolation.mode_line(plan.isolated, config.option.isolation, config.option.sanitize),
            *(_declarations(run.target) if run is not None else ()),  # an xdist controller's: once loaded
            *([mps.header_line(pipe, plan.mps_server.seconds if plan.mps_server else None)] if pipe else []),
            *([CHILDREN_INSIDE_MPS] if pipe and children_inside else []),
            *([WARM_WORKERS + (KEPT_WORKERS if plan.warm_server.kept else "")] if plan.warm_server is not None
              else []),
            *([f"gqa-decode: time budget {config.option.time_budget} s: no test starts after it, the rest are "
               "reported as not started"] if plan.deadline else []),
            *([f"gqa-decode: no MPS server ({plan.no_mps_server}): the workers take turns on each GPU"]
              if plan.no_mps_server else [])]


def _definition_names(config: pytest.Config, run: RunState | None) -> str:
    """The run's definitions (an xdist controller's header is written before they are resolved: the option)."""
    if run is not None:
        return ",".join(definition.name for definition in run.definitions)
    return config.option.definition or "default (the seed's, or a Solution file's own)"


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    """An xdist controller, its workers starting: load the implementation now (a bad --impl stops the run here,
    as a usage error, before any test) and say what it declares, as the header does elsewhere."""
    config = session.config
    if config.stash.get(RUN, None) is not None:
        return
    declared = _declarations(_start(config).state.target)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if declared and reporter is not None:
        reporter.ensure_newline()
        reporter.write("\n" + "\n".join(declared) + "\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    plan = config.stash.get(PLAN, None)
    trouble = plan.warm_server.stop() if plan is not None and plan.warm_server is not None else None
    if trouble is not None:
        print(f"gqa-decode: the warm workers' server failed ({trouble}); the workers started fresh", file=sys.stderr)
    if plan is not None and plan.mps_server is not None:
        trouble = plan.mps_server.stop()  # after the crash replays (sessionfinish), which may need it
        if trouble is not None:
            print(f"gqa-decode: the run's MPS server did not quit ({trouble}); its folder is "
                  f"{plan.mps_server.directory}", file=sys.stderr)
    for directory in plan.made_dirs if plan is not None else ():
        for path in directory.glob("*"):
            path.unlink(missing_ok=True)
        directory.rmdir()


# ---- fixtures (module level: pytest reads them from the plugin module) ----------------------------


def _suite_run(config: pytest.Config) -> SuiteRun:
    return config.pluginmanager.get_plugin(SUITE_RUN)


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    """The device the kernel under test runs on."""
    return pytestconfig.stash[RUN].device


@pytest.fixture(scope="session")
def contract(pytestconfig: pytest.Config) -> str:
    """The contract tier the implementation is held to: "correct" or "strict"."""
    return pytestconfig.stash[RUN].plan.contract


@pytest.fixture(scope="session")
def impl(pytestconfig: pytest.Config) -> Callable:
    """The implementation under test (``--impl``): records its calls, draws its knobs, contains faults."""
    return _suite_run(pytestconfig).guarded_impl()


@pytest.fixture(autouse=True)
def suite_definition(request: pytest.FixtureRequest):
    """The definition this test item runs under (a parameter where the run names several): cases are drawn and
    built for it, and the implementation is bound to it, while the item runs."""
    from gqa_decode_fuzz.generation import cases  # torch: after the workers start

    run = request.config.stash.get(RUN, None)
    definition = getattr(request, "param", None) or (run.definitions[0] if run is not None else None)
    if definition is None:
        yield None
        return
    with cases.using_definition(definition):
        yield definition


@pytest.fixture(autouse=True)
def suite_limits(request: pytest.FixtureRequest):
    """The run's case-size limits, which the properties' strategies (``strategies.run_sized``) draw within while the
    item runs."""
    from gqa_decode_fuzz.generation import sizes

    run = request.config.stash.get(RUN, None)
    if run is None:
        yield None
        return
    with sizes.using_limits(run.limits):
        yield run.limits


@pytest.fixture(autouse=True)
def hypothesis_shard(request: pytest.FixtureRequest):
    """This property's shard (None when unsharded); applies its share of examples and its seed."""
    shard = getattr(request, "param", None)
    if request.scope != "function" or not shards.is_property(request.function, request.node.path):
        yield shard
        return
    with shards.sharded(
        request.function, examples.property_name(request.node.nodeid), shard=shard,
        profile_max_examples=settings.default.max_examples, max_examples=request.config.option.max_examples,
        forced_seed=request.config.getoption("hypothesis_seed", None),
    ):
        yield shard


@pytest.fixture(autouse=True)
def cuda_context_check(pytestconfig: pytest.Config):
    """After each test on CUDA: a sticky error still pending is charged to that test, then contained."""
    yield
    _suite_run(pytestconfig).guard.check_context()


@pytest.fixture(scope="session")  # Hypothesis refuses function-scoped fixtures
def large_allocation(pytestconfig: pytest.Config) -> Callable:
    """``large_allocation(check, *args)`` runs ``check(*args)``, an example's work that allocates a large share of
    GPU memory (huge page pools), in this GPU's turn among the workers sharing it, once more after the others
    emptied their caches where it ran short, and frees the cached memory for the next worker
    (``SuiteRun.in_memory_turn``). The example's tensors must live in ``check``'s frames."""
    return _suite_run(pytestconfig).in_memory_turn
