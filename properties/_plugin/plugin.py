"""The suite's pytest plugin: options, then one ``SuiteRun`` object per run that owns its state.

Loaded by the repository's conftest.py (``pytest_plugins``) or, when the suite is
installed, by its ``pytest11`` entry point. A failing example travels one line, each
stage owned by one module:

  strategy (``strategies``) -> builder (``cases``) -> guarded call (``containment``) ->
  oracle, bound and comparison (``reference``) -> verdict (``SuiteRun.pytest_runtest_makereport``)
  -> case file (``casefiles``) -> run report (``run_report``) -> replay (``properties.repro``).

Under MPS (``gpus.mps_control_pipe``) a crash is believed only once its case file, replayed alone
at the end of the run, faults again (``mps``).
"""

from __future__ import annotations

from . import gpus

# An xdist worker claims its GPU before anything can initialise CUDA in this process.
PIN = gpus.pin_this_worker()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402
from xdist import get_xdist_worker_id, is_xdist_controller, is_xdist_worker  # noqa: E402

from .. import cases, stages  # noqa: E402
from ..strategies import SizeLimits  # noqa: E402
from . import casefiles, knobs, mps, profiles, run_report, shards  # noqa: E402
from .containment import CudaContextLost, Guard, is_sticky_cuda_error  # noqa: E402
from .target import (  # noqa: E402
    DEFAULT_IMPL,
    WAIVERS,
    DeviceError,
    ImplSpecError,
    Target,
    load_target,
    resolve_device,
)

PROPERTY_SUITE = Path(__file__).resolve().parent.parent
RUN_ID_ENV = "GQA_DECODE_RUN_ID"
CLAIMS_DIR_ENV = "GQA_DECODE_CLAIMS_DIR"
CONTRACTS = ("auto", "correct", "strict")

profiles.register_profiles()
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
    ("--device", "GQA_DECODE_DEVICE", "auto", str, ("auto", "cpu", "cuda"), None,
     "where the kernel runs: cuda, cpu (Triton interpreter), or auto (cuda when available)"),
    ("--contract", "GQA_DECODE_CONTRACT", "auto", str, CONTRACTS, None,
     "claims to hold the implementation to: correct (what every correct implementation must do), strict "
     "(also this project's kernel's promises: bitwise determinism, named errors); auto: strict for the "
     "project's kernel, correct for any other --impl"),
    ("--case-sizes", "GQA_DECODE_CASE_SIZES", None, str, tuple(profiles.CASE_SIZES), None,
     "size limits of generated cases; default small on cpu, large on cuda"),
    ("--workers-per-gpu", gpus.WORKERS_PER_GPU_ENV, "auto", count_or_auto, None, "N",
     "xdist workers per visible GPU under -n auto; auto: two cores per worker, at most 8 (the measured knee)"),
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


@dataclass(frozen=True)
class RunState:
    """What this run tests, where, to which tier, and where its failures and report go."""

    target: Target
    device: torch.device
    contract: str  # "correct" or "strict"
    sizes: str
    limits: SizeLimits
    run_id: str
    failures_dir: Path
    failures_budget: casefiles.ArtifactBudget
    report_dir: Path | None  # None: no run report
    worker: str | None  # the xdist worker id, None outside xdist workers


RUN = pytest.StashKey[RunState]()
WORKER_DEVICE_KEY = "gqa_decode_device"  # xdist workerinput: the device the controller resolved
SUITE_RUN = "gqa-decode-run"  # the name the SuiteRun object is registered under
INFRASTRUCTURE = "gqa-decode infrastructure error"  # a user property: survives xdist's report transport
_active: RunState | None = None  # for test modules, which build their strategies when imported


def current_run() -> RunState:
    """The run being configured or collected; fails clearly outside pytest."""
    if _active is None:
        raise RuntimeError("the property suite's run state is set by its pytest plugin; run it through pytest")
    return _active


def _xdist_role(config: pytest.Config) -> SimpleNamespace:
    """What xdist's helpers (written for a request or session) need: an object with ``.config``."""
    return SimpleNamespace(config=config)


def _tier(option: str, spec: str) -> str:
    if option != "auto":
        return option
    return "strict" if spec == DEFAULT_IMPL else "correct"


def _run_state(config: pytest.Config) -> RunState:
    option = config.option
    # An xdist worker takes the device its controller resolved --device to. Resolving ``auto`` itself, it would
    # go to the CPU interpreter, silently, whenever CUDA failed to start in it (under MPS a GPU whose faulted
    # processes are still exiting refuses new ones): it must fail instead.
    controllers_device = getattr(config, "workerinput", {}).get(WORKER_DEVICE_KEY)
    try:
        device = resolve_device(controllers_device or option.device)
        target = load_target(option.impl, root=config.rootpath)
    except (DeviceError, ImplSpecError) as error:
        where = "xdist worker on the run's device: " if controllers_device else ""
        raise pytest.UsageError(f"{where}{error}") from None
    role = _xdist_role(config)
    worker = get_xdist_worker_id(role) if is_xdist_worker(role) else None
    # The controller names the run and its workers inherit the name; a worker then drops it, so that a
    # pytest it starts (tests/ does) is a run of its own.
    run_id = os.environ.pop(RUN_ID_ENV, None) if worker else None
    run_id = run_id or datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + str(os.getpid())
    sizes = option.case_sizes or ("small" if device.type == "cpu" else "large")
    report = option.run_report
    return RunState(
        target=target, device=device, contract=_tier(option.contract, option.impl), sizes=sizes,
        limits=profiles.CASE_SIZES[sizes], run_id=run_id, failures_dir=config.rootpath / option.failures_dir,
        failures_budget=casefiles.ArtifactBudget(option.failures_budget * 2**20),
        report_dir=None if report == "none" else config.rootpath / report / run_id, worker=worker,
    )


def pytest_configure(config: pytest.Config) -> None:
    global _active
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped when the kernel runs in the interpreter")
    config.addinivalue_line("markers", "strict: a claim of the strict tier only (--contract=strict)")
    config.addinivalue_line("markers", "empty_sequences: a claim about empty sequences; skipped for an "
                                       "implementation that waives empty_sequences")
    config.addinivalue_line("markers", "input_validation: a claim about calls the contract forbids; skipped "
                                       "for an implementation that waives input_validation")
    state = _run_state(config)
    config.stash[RUN] = state
    _active = state
    config.pluginmanager.register(SuiteRun(config, state), SUITE_RUN)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _active
    _active = None


def _is_property(function: object, path: Path) -> bool:
    return shards.is_hypothesis_test(function) and Path(path).resolve().is_relative_to(PROPERTY_SUITE)


def _in_suite(config: pytest.Config, location: str) -> bool:
    """Whether a test item's file (its report's location, relative to the root directory) is a property's."""
    return (config.rootpath / location).resolve().is_relative_to(PROPERTY_SUITE)


def _infrastructure_error(report: pytest.TestReport) -> bool:
    return any(name == INFRASTRUCTURE for name, _ in getattr(report, "user_properties", ()))


def _stop_session(item: pytest.Item) -> None:
    item.session.shouldstop = f"the CUDA context was lost in {item.nodeid}; later tests would fail spuriously"


def _outcome(report: pytest.TestReport) -> str:
    """The run report's word for a test phase's result; "stopped" for a shard that gave way to a sibling,
    "error" where the suite itself could not run it."""
    if _infrastructure_error(report):
        return "error"
    if report.skipped:
        return "stopped" if "stopped:" in str(report.longrepr) else "skipped"
    return report.outcome


def _as_declared(target: Target, function: Callable) -> Callable:
    """``function`` whose LSE is None exactly when the target declares ``returns_lse = False``, and whose
    empty sequences' rows read as the contract's (0, -inf) when it waives ``empty_sequences``."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        output, lse = function(*args, **kwargs)
        if target.returns_lse and lse is None:
            raise AssertionError(f"{target.spec} returned lse=None; an implementation without a final LSE "
                                 "declares returns_lse = False")
        lse = lse if target.returns_lse else None
        if "empty_sequences" in target.waives and isinstance(output, torch.Tensor):
            indptr = kwargs["kv_indptr"] if "kv_indptr" in kwargs else args[3]
            empty = (indptr[1:] == indptr[:-1]).to(output.device)
            output = torch.where(empty[:, None, None], 0.0, output).to(output.dtype)
            lse = None if lse is None else torch.where(empty[:, None], -math.inf, lse)
        return output, lse

    return call


class _InThread:
    """``function()`` run in a thread of its own; ``join`` waits for it and raises what it raised."""

    def __init__(self, function: Callable[[], None], name: str) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            try:
                function()
            except BaseException as error:  # noqa: BLE001 - raised again in join
                self.error = error

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


class SuiteRun:
    """One pytest run of the suite: its recorder, guard, shards and report; hooks and fixtures as methods."""

    def __init__(self, config: pytest.Config, state: RunState) -> None:
        self.config, self.state = config, state
        self.recorder = casefiles.Recorder()
        self.slots_dir: Path | None = None
        self.own_claims_dir: Path | None = None
        self.report_path: Path | None = None
        self.started: dict[str, float] = {}
        self.outcomes: dict[str, dict] = {}  # per item: outcome, case file, error (for the run report)
        self.guard = Guard(state.device, save=self._save_after_fault, nodeid=lambda: self.recorder.nodeid,
                           in_worker=state.worker is not None, replay=casefiles.replay_command)
        self.shard_count = shards.resolved_shard_count(config.option.shards)
        self.claims = shards.FailureClaims(self._claims_dir(config))
        self.knob_draws = knobs.KnobDraws(state.target.knobs)
        self.report_warm_up: threading.Thread | None = None
        self.report_writer: _InThread | None = None
        self.mps_pipe = gpus.mps_control_pipe()
        self.crashes: dict[str, str | None] = {}  # crashes this process reports: node id -> case file, if saved
        self.replays: list[mps.Replay] = []
        cases.add_build_observer(self.recorder.note_build)
        # What each test item builds, how far it got and where its time went.
        synchronize = torch.cuda.synchronize if state.device.type == "cuda" else None
        self.counter = run_report.ItemCounter(stages.StageClock(synchronize=synchronize))
        stages.install(self.counter.clock)
        cases.add_build_observer(self.counter.observe_case)
        self.is_controller = is_xdist_controller(_xdist_role(config))
        if self.is_controller:
            os.environ[RUN_ID_ENV] = state.run_id
            if state.device.type == "cuda":
                ids = gpus.visible_gpu_ids(torch.cuda.device_count())
                self.slots_dir = gpus.export_gpus(ids, gpus.workers_per_gpu(config.option.workers_per_gpu, len(ids)))
        else:
            for name in (gpus.GPU_IDS_ENV, gpus.SLOTS_DIR_ENV):
                os.environ.pop(name, None)
            gpus.share_cores()

    def _claims_dir(self, config: pytest.Config) -> Path:
        inherited = os.environ.get(CLAIMS_DIR_ENV) if is_xdist_worker(_xdist_role(config)) else None
        if inherited:
            return Path(inherited)
        self.own_claims_dir = Path(tempfile.mkdtemp(prefix="gqa-decode-claims-"))
        if is_xdist_controller(_xdist_role(config)):
            os.environ[CLAIMS_DIR_ENV] = str(self.own_claims_dir)
        return self.own_claims_dir

    # ---- session -------------------------------------------------------------------------------

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        cases.remove_build_observer(self.recorder.note_build)
        cases.remove_build_observer(self.counter.observe_case)
        stages.uninstall()
        for directory, pattern in ((self.slots_dir, "*.lock"), (self.own_claims_dir, "*")):
            if directory is not None:
                for path in directory.glob(pattern):
                    path.unlink(missing_ok=True)
                directory.rmdir()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """xdist controller: every worker runs on the device this run resolved (see ``_run_state``)."""
        node.workerinput[WORKER_DEVICE_KEY] = self.state.device.type

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        state = self.state
        return [f"gqa-decode: impl={state.target.spec} contract={state.contract} "
                f"device={state.device} case-sizes={state.sizes} hypothesis-profile={shards.profile_name()} "
                f"shards={config.option.shards} run={state.run_id}",
                *(f"gqa-decode: the implementation declares {said}" for said in state.target.declarations()),
                *([mps.header_line(self.mps_pipe)] if self.mps_pipe else [])]

    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        """A test the suite could not run (its own allocation failed) counts as an error, not a failure."""
        if report.failed and _infrastructure_error(report):
            return "error", "E", ("ERROR (infrastructure)", {"red": True})
        return None

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        reasons = {
            "gpu": "needs a CUDA device (kernel runs in the Triton interpreter)" if self.state.device.type != "cuda"
            else None,
            "strict": "a strict-tier claim (--contract=strict)" if self.state.contract != "strict" else None,
            **{name: f"the implementation waives {name}: {WAIVERS[name]}" if name in self.state.target.waives
               else None for name in WAIVERS},
        }
        for item in items:
            for marker, reason in reasons.items():
                if reason and marker in item.keywords:
                    item.add_marker(pytest.mark.skip(reason=reason))

    # ---- shards --------------------------------------------------------------------------------

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        function = metafunc.function
        if self.shard_count < 2 or not _is_property(function, metafunc.definition.path):
            return
        if not shards.generates_examples(function):
            return
        metafunc.parametrize("hypothesis_shard", [shards.Shard(i, self.shard_count) for i in range(self.shard_count)],
                             indirect=True, ids=str)

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item):
        if not shards.is_hypothesis_test(getattr(item, "obj", None)):
            yield
            return
        callspec = getattr(item, "callspec", None)
        sharded = callspec is not None and "hypothesis_shard" in callspec.params
        if sharded:
            shards.share_database_key(item)
        with shards.wrapping_examples(item, self.counter.counting), \
                self.claims.watching(item) if sharded else contextlib.nullcontext(), \
                shards.wrapping_examples(item, self.guard.shielding):
            yield

    # ---- one test ------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.recorder.begin(item.nodeid)
        self.counter.begin(item.nodeid)
        self.started[item.nodeid] = time.perf_counter()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        if call.when == "call" and report.failed and call.excinfo.errisinstance(cases.SuiteOutOfMemory):
            # The suite's own allocation, not the kernel: an infrastructure error, no case file.
            report.user_properties.append((INFRASTRUCTURE, call.excinfo.exconly()))
        elif call.when == "call" and report.failed:
            self._record_failure(item, call, report)
        if report.skipped or call.when == "call":
            self.outcomes.setdefault(item.nodeid, {}).update(outcome=_outcome(report))
        if call.when == "teardown" and self.state.report_dir is not None and _is_property(
                getattr(item, "obj", None), item.path):
            seconds = time.perf_counter() - self.started.pop(item.nodeid, time.perf_counter())
            self.counter.flush(self.state.report_dir, self.state.worker or "main", seconds, gpu=self._gpu(),
                             tier=self.state.contract, **self.outcomes.pop(item.nodeid, {}))

    def _record_failure(self, item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
        error = call.excinfo.value
        lost = isinstance(error, CudaContextLost) or self.guard.lost is not None
        if lost:  # saved already, by the guard; whatever was raised after the fault is that fault
            _stop_session(item)
            report.sections.append(("gqa-decode case file", (self.guard.lost or str(error)).partition("\n")[2]))
            return
        sticky = is_sticky_cuda_error(error)
        if sticky and self.state.worker:
            self.guard.contain(error)  # does not return
        if not self.recorder.used or not shards.is_hypothesis_test(getattr(item, "obj", None)):
            return  # case files are for the suite's properties, not for unit tests that build a case
        path = self._save_case(call.excinfo.exconly(), str(getattr(item, "hypothesis_report_information", "")),
                               device_readable=not sticky)
        self.outcomes[item.nodeid] = {"case_file": path, "error": call.excinfo.exconly()}
        shown = f"{path}\nreplay: {casefiles.replay_command(path)}" if path else self._budget_note()
        report.sections.append(("gqa-decode case file", shown))
        if sticky:
            _stop_session(item)

    def _budget_note(self) -> str:
        return (f"not saved: the run's case files reached --failures-budget="
                f"{self.state.failures_budget.max_bytes // 2**20} MB")

    def _save_case(self, error: str, hypothesis_output: str = "", device_readable: bool = True) -> Path | None:
        state = self.state
        if not state.failures_budget.allows(state.failures_dir, state.run_id):
            return None
        return casefiles.save_case(
            state.failures_dir, self.recorder, error=error, impl_spec=state.target.spec, device=state.device,
            profile=shards.profile_name(), run_id=state.run_id, hypothesis_output=hypothesis_output,
            device_readable=device_readable,
        )

    def _save_after_fault(self, error: str) -> Path | None:
        """The crashing shard claims its property (its siblings stop instead of crashing too) and saves the
        case; None when a sibling crashed first and reports it."""
        nodeid = self.recorder.nodeid or ""
        prop = shards.property_name(nodeid)
        if not self.claims.claim(prop, nodeid) and self.claims.owner(prop) != nodeid:
            return None
        path = self._save_case(error, device_readable=False)
        if path is None:
            raise RuntimeError(self._budget_note())
        if self.state.worker is None:  # without xdist this process reports its own crash
            self.crashes[nodeid] = str(path)
        return path

    def _gpu(self) -> str | None:
        if self.state.device.type != "cuda":
            return None
        return PIN.gpu if PIN is not None and PIN.gpu else os.environ.get("CUDA_VISIBLE_DEVICES", "all visible")

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched) -> None:
        """A worker died running ``crashitem``: add the case file it saved, if any, to the crash report."""
        owner = self.claims.owner(shards.property_name(crashitem))
        if owner is not None and owner != crashitem:  # a sibling shard crashed first: it reports the property
            report.outcome = "skipped"
            report.longrepr = (str(crashitem), 0, f"Skipped: stopped: crashed too, but {owner} crashed first and "
                                                  "reports this property")
            self._report_crash(crashitem, "stopped")
            return
        saved = [entry for entry in casefiles.runs_index(self.state.failures_dir, self.state.run_id)
                 if entry["nodeid"] == crashitem]
        for entry in saved:
            report.longrepr = (f"{report.longrepr}\n{entry['error']}\ncase file {entry['path']}\n"
                               f"replay: {casefiles.replay_command(entry['path'])}")
        self.crashes[crashitem] = saved[0]["path"] if saved else None
        self._report_crash(crashitem, "crashed", saved[0] if saved else None)

    def _report_crash(self, nodeid: str, outcome: str, saved: dict | None = None) -> None:
        """The run report's line for an item whose worker died (its worker wrote none)."""
        if self.state.report_dir is None:
            return
        self.counter.begin(nodeid)
        self.counter.flush(self.state.report_dir, "controller", 0.0, outcome=outcome, tier=self.state.contract,
                         case_file=saved["path"] if saved else None,
                         error=saved["error"] if saved else "the worker running it died")

    # ---- the end -------------------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str, location: tuple) -> None:
        """The xdist controller's first property started on a worker: warm the run report's plotting up in a
        thread, while the controller idles, rather than after the last test (``run_report.warm_up``)."""
        if (self.report_warm_up is None and self.is_controller and self.state.report_dir is not None
                and _in_suite(self.config, location[0])):
            self.report_warm_up = threading.Thread(target=run_report.warm_up, name="gqa-decode-report-warm-up",
                                                   daemon=True)
            self.report_warm_up.start()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """A completed run under xdist: every worker has finished its session (and its part file), so the
        report is drawn in a thread while xdist's own ``pytest_sessionfinish`` waits a second or two for the
        worker processes to exit, not after it; unless crashes wait to be replayed (MPS), which needs them
        gone."""
        if self.is_controller and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and not (
                self.mps_pipe and self.crashes):
            self.report_writer = _InThread(self._write_report, "gqa-decode-report")

    @pytest.hookimpl(trylast=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_after_workers(self, session: pytest.Session, exitstatus: int) -> None:
        """The report, once xdist has shut its workers down: waits for the thread above, or writes it here
        (without xdist; an interrupted run, -x or Ctrl-C, whose workers' items in flight belong in it; a run
        whose crashes are replayed first, under MPS)."""
        if self.report_writer is not None:
            self.report_writer.join()
            return
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED and not session.shouldstop  # Ctrl-C: no replays
        if self.mps_pipe and self.crashes and not self.state.worker and not interrupted:
            self._replay_crashes()
        self._write_report()

    def _replay_crashes(self) -> None:
        """Replay each crash alone (``mps``): on the GPUs the run used, one lane each, or where this process
        runs without xdist."""
        lanes = [gpu for gpu in os.environ.get(gpus.GPU_IDS_ENV, "").split(",") if gpu] or [None]
        self.replays = mps.replay_crashes(self.crashes, device=self.state.device.type, root=self.config.rootpath,
                                          lanes=lanes)

    def _write_report(self) -> None:
        if self.report_warm_up is not None:
            self.report_warm_up.join()  # matplotlib is not thread-safe: the report draws once it is done
        directory = self.state.report_dir
        if self.state.worker or directory is None or not directory.is_dir():
            return
        if self.mps_pipe:
            mps.save(directory, self.mps_pipe, self.replays)
        self.report_path = run_report.write_report(directory, self.state.run_id)

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        state = self.state
        terminalreporter.write_sep("-", f"gqa-decode: contract tier {state.contract}, impl {state.target.spec}")
        for said in state.target.declarations():
            terminalreporter.write_line(f"declared by the implementation: {said}")
        saved = casefiles.runs_index(state.failures_dir, state.run_id)
        if saved:
            terminalreporter.write_sep("=", "gqa-decode: failures saved as case files")
            for entry in saved:
                terminalreporter.write_line(f"{entry['nodeid']}\n    {casefiles.replay_command(entry['path'])}")
        if self.replays:
            terminalreporter.write_sep("=", "gqa-decode: crashes replayed alone (MPS: one process's GPU fault "
                                            "reaches every process on its GPU)")
            for replay in self.replays:
                said = f"ERROR (not a crash of this property): {replay.nodeid}\n    {mps.COLLATERAL}" \
                    if replay.collateral else f"CRASHED: {replay.nodeid}\n    {replay.status}: {replay.detail}"
                terminalreporter.write_line(said)
            if any(replay.collateral for replay in self.replays):
                terminalreporter.write_line("pytest still counts every crash as failed: the crashed properties "
                                            "were cut short, so the run cannot pass.")
        if self.report_path is not None:
            terminalreporter.write_sep("-", "gqa-decode run report")
            table = [line for line in self.report_path.read_text(encoding="utf-8").splitlines()
                     if line.startswith("|")]
            for line in table[:22]:
                terminalreporter.write_line(line)
            terminalreporter.write_line(f"report: {self.report_path} (summary.png beside it)")


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
    return pytestconfig.stash[RUN].contract


@pytest.fixture(scope="session")
def impl(pytestconfig: pytest.Config) -> Callable:
    """The implementation under test (``--impl``): records its calls, draws its knobs, contains faults."""
    run = _suite_run(pytestconfig)
    function = _as_declared(run.state.target, run.knob_draws.applied_to(run.state.target.function))
    return stages.timed("kernel", run.guard.wrap(function, run.recorder.note_call))


@pytest.fixture(autouse=True)
def hypothesis_shard(request: pytest.FixtureRequest):
    """This property's shard (None when unsharded); applies its share of examples and its seed."""
    shard = getattr(request, "param", None)
    if request.scope != "function" or not _is_property(request.function, request.node.path):
        yield shard
        return
    with shards.sharded(
        request.function, shards.property_name(request.node.nodeid), shard=shard,
        profile_max_examples=settings.default.max_examples, max_examples=request.config.option.max_examples,
        forced_seed=request.config.getoption("hypothesis_seed", None),
    ):
        yield shard


@pytest.fixture(autouse=True)
def cuda_context_check(pytestconfig: pytest.Config):
    """After each test on CUDA: a sticky error still pending is charged to that test, then contained."""
    yield
    _suite_run(pytestconfig).guard.check_context()


@pytest.fixture(scope="session")  # stateless, and Hypothesis refuses function-scoped fixtures
def large_allocation():
    """A context for one example that allocates a large share of GPU memory (huge page pools): waits for
    this GPU's turn among the workers sharing it, then frees the cached memory for the next worker."""

    @contextlib.contextmanager
    def turn():
        with gpus.memory_turn(PIN):
            try:
                yield
            finally:
                with contextlib.suppress(RuntimeError):  # a lost context must not replace the test's own error
                    torch.cuda.empty_cache()

    return turn
