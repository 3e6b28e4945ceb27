"""One pytest run of the suite: the ``SuiteRun`` object whose methods are the hooks, with its recorder, guard,
failure claims, knob draws and run report.

``plugin.py`` registers it once the run's implementation is loaded: at configure time, or, in an xdist
controller, once its workers are starting (that process imports torch and the implementation here, not before).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from hypothesis import example
from hypothesis.errors import HypothesisException

from gqa_decode_fuzz.engine import devices, examples, isolation, knobs
from gqa_decode_fuzz.engine.containment import CudaContextLost, Guard, is_sticky_cuda_error
from gqa_decode_fuzz.engine.guarded import guarded_impl
from gqa_decode_fuzz.engine.target import WAIVERS, Target
from gqa_decode_fuzz.generation import cases, stages
from gqa_decode_fuzz.record import casefiles, causes, mps, run_report

from . import gpus, shards
from .shrink_limit import ShrinkLimit, shrink_cut_notes

if TYPE_CHECKING:
    from .run_state import RunState

INFRASTRUCTURE = "gqa-decode infrastructure error"  # a user property: survives xdist's report transport
CLAIM_MARKER = "claim"  # ``property_claim``'s marker: its one argument is the test's claim, as a reference

__all__ = ["CLAIM_MARKER", "INFRASTRUCTURE", "SuiteRun", "UndeclaredClaim", "declared_claim", "release_frames"]


def release_frames(error: BaseException | None) -> None:
    """Clear the locals of the finished frames in ``error``'s traceback and in the errors chained to it.

    A failing example's traceback holds its frames, and they hold its tensors: Hypothesis keeps the exception
    of every failing example it meets while shrinking (in its cache of results), so without this each
    shrink step's page pool stayed alive. Frames still running are left alone (``traceback.clear_frames``).
    """
    seen: set[int] = set()
    pending = [error]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        pending += [error.__cause__, error.__context__]


@dataclass(frozen=True)
class _SeenFailure:
    """An item's last failing example: the recorder as it stood then, and the error in one line."""

    record: casefiles.Recorder
    error: str


class UndeclaredClaim(BaseException):  # noqa: N818 - reads as what happened
    """A property's body called a claim other than the one its test declares (``property_claim``), or none: a
    defect of the test, not of the implementation. A BaseException, so Hypothesis neither shrinks nor retries it."""


def declared_claim(item: pytest.Item) -> str | None:
    """The claim (its reference) a test item declares with ``property_claim`` (the ``claim`` marker), or None."""
    marker = item.get_closest_marker(CLAIM_MARKER)
    return str(marker.args[0]) if marker is not None and marker.args else None


def _check_declared_claims(collector: pytest.Collector, items: object) -> None:
    """Every test function collected from the property suite's files declares its claim, else collection fails
    naming it."""
    if not isinstance(items, list) or not shards.in_suite(collector.path):
        return
    for item in items:
        if isinstance(item, pytest.Function) and declared_claim(item) is None:
            raise pytest.Collector.CollectError(
                f"{item.nodeid}: a property declares the claim its body checks, and this one declares none: put "
                "@property_claim(claims.<its claim>) (gqa_decode_fuzz.properties.claims) above its @given")


def _add_workload_examples(metafunc: pytest.Metafunc, workload_cases: tuple) -> None:
    """A property marked ``workloads(argument)``: each of the run's ``--workloads`` cases an explicit example of it
    (run before anything is generated), given as ``argument``; once per test function."""
    marker = metafunc.definition.get_closest_marker("workloads")
    function = metafunc.function
    if marker is None or not workload_cases or getattr(function, "_gqa_decode_workloads", False):
        return
    (argument,) = marker.args
    for case in workload_cases:
        function = example(**{argument: case})(function)
    function._gqa_decode_workloads = True


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
        said = str(report.longrepr)
        return "stopped" if "stopped:" in said else "unstarted" if run_report.UNSTARTED in said else "skipped"
    return report.outcome


def _solution_record(target: Target) -> dict | None:
    """What a case file keeps of a Solution file under test: enough to rebuild it and to tell it changed."""
    solution = target.solution
    return None if solution is None else {"path": str(solution.path), "sha256": solution.sha256,
                                          "name": solution.name}


def _progress(line: str) -> None:
    """A line on the controller's stderr at the run's end, before pytest's summary (which waits for it)."""
    print(line, file=sys.__stderr__, flush=True)


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


def on_a_shared_gpu(impl: Callable) -> Callable:
    """``impl`` whose running out of GPU memory, on a GPU that several workers share, is the run's limit
    (``cases.SuiteOutOfMemory``, an infrastructure error), not the implementation's failure: the other workers'
    examples hold memory there."""

    @functools.wraps(impl)
    def call(*args, **kwargs):
        try:
            return impl(*args, **kwargs)
        except Exception as error:
            if not cases.is_out_of_memory(error):
                raise
            raise cases.SuiteOutOfMemory(
                f"the GPU, which this run's workers share, ran out of memory in the implementation's call "
                f"(fewer --workers-per-gpu leave it more): {str(error).splitlines()[0][:400]}") from error

    return call


def _short_of_memory(error: BaseException) -> bool:
    return isinstance(error, cases.SuiteOutOfMemory) or cases.is_out_of_memory(error)


def _wait_for_released_memory(device: torch.device, settle_s: float = 0.5, most_s: float = 10.0) -> None:
    """Until the GPU's free memory has stopped growing for ``settle_s`` (the other workers empty their caches as
    their running examples end), at most ``most_s``."""
    step = 64 * 2**20  # less growth than this is noise: another worker's allocation or release
    start = grown = time.monotonic()
    most_free = torch.cuda.mem_get_info(device)[0]
    while (now := time.monotonic()) - grown < settle_s and now - start < most_s:
        time.sleep(0.02)
        free = torch.cuda.mem_get_info(device)[0]
        if free > most_free + step:
            most_free, grown = free, now


class SuiteRun:
    """One pytest run of the suite: its recorder, guard, shards and report; hooks and fixtures as methods."""

    def __init__(self, config: pytest.Config, state: RunState, pin: gpus.Pin | None) -> None:
        self.config, self.state, self.pin = config, state, pin
        self.recorder = casefiles.Recorder()
        self.report_path: Path | None = None
        self.started: dict[str, float] = {}
        self.outcomes: dict[str, dict] = {}  # per item: outcome, case file, error (for the run report)
        self.guard = Guard(state.device, save=self._save_after_fault, nodeid=lambda: self.recorder.nodeid,
                           in_worker=state.plan.worker is not None, replay=casefiles.replay_command)
        self.shard_count = shards.resolved_shard_count(config.option.shards)
        self.claims = shards.FailureClaims(state.plan.claims_dir)
        self.knob_draws = knobs.KnobDraws(state.target.knobs)
        self.shrink_limit = ShrinkLimit(config.option.shrink_limit, state.plan.deadline)
        self.report_warm_up: threading.Thread | None = None
        self.report_writer: _InThread | None = None
        self.mps_pipe = devices.mps_control_pipe()
        self.crashes: dict[str, str | None] = {}  # crashes under MPS this process reports: node id -> case file
        self.replays: list[mps.Replay] = []
        self.failed_nodeids: list[str] = []  # every failing item this process heard of (its own, or its workers')
        self.unstarted = 0  # items this process heard of that the --time-budget left unstarted
        self.causes: dict | None = None  # the run's failures grouped into root causes (``causes``)
        self.probing = False  # replaying claims after the run: a fault then saves no case file
        self.seen_failure: _SeenFailure | None = None  # the running item's last failing example
        self.reported_records: dict[int, casefiles.Recorder] = {}  # id of a reported example's error -> its record
        self.declared_claim: str | None = None  # the running item's claim, where it is a property
        self.claim_called = False  # whether the running example has called a claim
        cases.add_build_observer(self.recorder.note_build)
        cases.add_claim_observer(self.recorder.note_claim)
        cases.add_claim_observer(self.check_claim)
        # What each test item builds, how far it got and where its time went.
        synchronize = torch.cuda.synchronize if state.device.type == "cuda" else None
        self.counter = run_report.ItemCounter(stages.StageClock(synchronize=synchronize))
        stages.install(self.counter.clock)
        cases.add_build_observer(self.counter.observe_case)
        self.is_controller = state.plan.controller
        # The implementation's child process (``isolated_impl``), where it runs in one.
        self.isolated = state.target.function if state.plan.isolated and not state.plan.controller else None
        # Whether other workers share this one's GPU (read before the GPU ids go): then memory is everyone's.
        self.shares_gpu = state.device.type == "cuda" and gpus.shares_its_gpu(pin)
        if not self.is_controller:
            for name in (gpus.GPU_IDS_ENV, gpus.SLOTS_DIR_ENV):
                os.environ.pop(name, None)

    def guarded_impl(self) -> Callable:
        """The implementation under test as the ``impl`` fixture gives it: its calls recorded, its knobs drawn,
        its faults contained, its time counted as the kernel stage."""
        impl = guarded_impl(self.state.target, self.guard, self.recorder.note_call, self.knob_draws,
                            isolated=self.state.plan.isolated)
        return on_a_shared_gpu(impl) if self.shares_gpu else impl

    # ---- session -------------------------------------------------------------------------------

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.isolated is not None:
            self.isolated.close()
        cases.remove_build_observer(self.recorder.note_build)
        cases.remove_claim_observer(self.recorder.note_claim)
        cases.remove_claim_observer(self.check_claim)
        cases.remove_build_observer(self.counter.observe_case)
        stages.uninstall()

    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        """A test the suite could not run (its own allocation failed) counts as an error, not a failure."""
        if report.failed and _infrastructure_error(report):
            return "error", "E", ("ERROR (infrastructure)", {"red": True})
        return None

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        reasons = {
            "gpu": "needs a CUDA device (kernel runs in the Triton interpreter)" if self.state.device.type != "cuda"
            else None,
            "strict": "a strict-tier claim (--contract=strict)" if self.state.plan.contract != "strict" else None,
            "destination_passing": "the implementation returns its results (not destination-passing)"
            if not self.state.target.destination_passing_style else None,
            **{name: f"the implementation waives {name}: {WAIVERS[name]}" if name in self.state.target.waives
               else None for name in WAIVERS},
        }
        self._deselect_other_op_types(config, items)
        items.sort(key=_plainest_first)
        for item in items:
            for marker, reason in reasons.items():
                if reason and item.get_closest_marker(marker):  # not item.keywords: a parameter's id is one too
                    item.add_marker(pytest.mark.skip(reason=reason))
            definition = self._definition_of(item)
            if item.get_closest_marker("paged") and not definition.paged:
                item.add_marker(pytest.mark.skip(reason=f"pages of one token in {definition.name}"))
            if item.get_closest_marker("pool") and definition.prefill and not definition.page_size:
                item.add_marker(pytest.mark.skip(reason=f"ragged K and V in {definition.name}: no page pool"))

    def _deselect_other_op_types(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """A property runs under the definitions of its op type: prefill properties (the ``prefill`` marker) under
        prefill definitions, the others under decode ones; the rest are deselected."""
        kept, dropped = [], []
        for item in items:
            prefill_item = item.get_closest_marker("prefill") is not None
            on_property = shards.in_suite(item.path)
            mismatched = on_property and prefill_item != self._definition_of(item).prefill
            (dropped if mismatched else kept).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    @pytest.hookimpl(wrapper=True)
    def pytest_pycollect_makeitem(self, collector: pytest.Collector, name: str, obj: object):
        items = yield
        _check_declared_claims(collector, items)
        return items

    def check_claim(self, case: object, draws: dict, claim: str) -> None:
        """A claim observer: the running property calls the claim it declares, else ``UndeclaredClaim``."""
        self.claim_called = True
        declared = self.declared_claim
        if declared is not None and claim != declared:
            raise UndeclaredClaim(f"{self.recorder.nodeid} declares @property_claim({declared}) but its body calls "
                                  f"the claim {claim}: declare the claim it checks")

    def _definition_of(self, item: pytest.Item):
        """The definition ``item`` runs under: its parameter where the run names several, else the run's one."""
        callspec = getattr(item, "callspec", None)
        chosen = callspec.params.get("suite_definition") if callspec is not None else None
        return chosen or self.state.definitions[0]

    # ---- shards --------------------------------------------------------------------------------

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        function = metafunc.function
        if not shards.is_property(function, metafunc.definition.path):
            return
        _add_workload_examples(metafunc, self.state.workload_cases)
        chosen = self.state.definitions
        if len(chosen) > 1:
            metafunc.parametrize("suite_definition", chosen, indirect=True, ids=[d.name for d in chosen])
        if self.shard_count < 2:
            return
        if not shards.generates_examples(function):
            return
        metafunc.parametrize("hypothesis_shard", [examples.Shard(i, self.shard_count) for i in range(self.shard_count)],
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
        # Innermost: an out-of-memory error is the run's before ``remembering`` could take it for a failure.
        sharing = shards.wrapping_examples(item, self.sharing_memory) if self.shares_gpu else contextlib.nullcontext()
        with sharing, shards.wrapping_examples(item, self.remembering), \
                shards.wrapping_examples(item, self.counter.counting), \
                self.claims.watching(item) if sharded else contextlib.nullcontext(), \
                shards.wrapping_examples(item, self.requiring_a_claim) if self.declared_claim \
                else contextlib.nullcontext(), \
                shards.wrapping_examples(item, self.guard.shielding), \
                shards.wrapping_examples(item, self.isolated.wrapping) if self.isolated else contextlib.nullcontext(), \
                shards.wrapping_examples(item, self.counter.clock.timing), \
                self.shrink_limit.applied(item):  # the clock outside the rest (they count as "other"); then this
            yield

    def requiring_a_claim(self, example: Callable) -> Callable:
        """``example`` (one example of a property) that must call a claim: an example that ends without one judged
        by hand what its declared claim, which the cause probes replay, may not (``UndeclaredClaim``). An
        ``assume``, a skip or a failure ends an example before this asks."""

        @functools.wraps(example)
        def required(*args, **kwargs):
            self.claim_called = False
            result = example(*args, **kwargs)
            if not self.claim_called:
                raise UndeclaredClaim(f"{self.recorder.nodeid} declares @property_claim({self.declared_claim}) but "
                                      "an example of its body called no claim: check through the claim it declares")
            return result

        return required

    def remembering(self, example: Callable) -> Callable:
        """``example`` (one Hypothesis example) that, when it fails, remembers it (the smallest failure seen so far,
        should the suite run out of memory later in the shrink) and, unless Hypothesis is about to report it,
        releases the tensors its traceback holds before the next example is built."""

        @functools.wraps(example)
        def remembered(*args, **kwargs):
            try:
                return example(*args, **kwargs)
            except Exception as error:
                failed = not isinstance(error, HypothesisException)  # not assume() and its kin
                if failed:
                    self.seen_failure = _SeenFailure(copy.copy(self.recorder), f"{type(error).__name__}: {error}")
                if not examples.final_example():
                    release_frames(error)
                elif failed:  # Hypothesis reports this one (several, for failing @examples)
                    self.reported_records[id(error)] = self.seen_failure.record
                raise

        return remembered

    def sharing_memory(self, example: Callable) -> Callable:
        """``example`` (one Hypothesis example) on a GPU that other workers share: running out of memory anywhere
        in it is the run's limit (``cases.SuiteOutOfMemory``; their examples hold memory there), and afterwards
        torch's cache is emptied when little of the GPU's memory is free or a huge example waits for it."""

        @functools.wraps(example)
        def shared(*args, **kwargs):
            try:
                return example(*args, **kwargs)
            except Exception as error:
                if not cases.is_out_of_memory(error):
                    raise
                raise cases.SuiteOutOfMemory(
                    f"the GPU, which this run's workers share, ran out of memory in the suite's work on a case "
                    f"(fewer --workers-per-gpu leave it more): {str(error).splitlines()[0][:400]}") from error
            finally:
                self._release_cache_if_short()

        return shared

    def _release_cache_if_short(self) -> None:
        devices.release_cache_if_short(self.state.device, wanted=gpus.memory_wanted(self.pin))

    def in_memory_turn(self, check: Callable, *args) -> object:
        """``check(*args)``, an example's work that needs a large share of the GPU's memory (huge page pools), in
        this GPU's memory turn: the workers sharing it run such work one at a time. Where it runs short, it asks
        the others to empty their caches (``gpus.wanting_memory``), waits for that memory and runs once more.
        Its tensors must live in ``check``'s frames, which a failure's traceback keeps: they are cleared before
        the cache is emptied for the next worker."""
        with gpus.memory_turn(self.pin):
            try:
                try:
                    return check(*args)
                except BaseException as error:
                    if not (self.shares_gpu and _short_of_memory(error)):
                        raise
                    release_frames(error)
                    torch.cuda.empty_cache()
                with gpus.wanting_memory(self.pin):
                    _wait_for_released_memory(self.state.device)
                    return check(*args)
            except BaseException as error:
                release_frames(error)
                raise
            finally:
                with contextlib.suppress(RuntimeError):  # a lost context must not replace the test's own error
                    torch.cuda.empty_cache()

    # ---- one test ------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.state.warming is not None:
            self.state.warming.wait()
        self.seen_failure, self.reported_records = None, {}
        self.declared_claim = declared_claim(item) if shards.in_suite(item.path) else None
        self.recorder.begin(item.nodeid, self.declared_claim)
        self.counter.begin(item.nodeid)
        if self.isolated is not None and self.isolated.share is not None:
            self.isolated.share.begin_item()
        self.started[item.nodeid] = time.perf_counter()
        deadline = self.state.plan.deadline
        if deadline is not None and time.time() > deadline and shards.in_suite(item.path):
            pytest.skip(f"{run_report.UNSTARTED} before it started")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        if call.when == "call" and report.failed and call.excinfo.errisinstance(cases.SuiteOutOfMemory):
            if self.seen_failure is not None:  # a failure came first: it is what the user sees, with its case file
                self._report_seen_failure(item, call, report)
            else:  # the suite's own allocation, not the kernel: an infrastructure error, no case file
                report.user_properties.append((INFRASTRUCTURE, call.excinfo.exconly()))
        elif call.when == "call" and report.failed:
            self._record_failure(item, call, report)
        if call.excinfo is not None and not self.config.getoption("usepdb", False):
            release_frames(call.excinfo.value)  # reported: its tensors (pytest keeps it as sys.last_value) can go
        if report.skipped or call.when == "call":
            self.outcomes.setdefault(item.nodeid, {}).update(outcome=_outcome(report))
        if call.when == "teardown" and self.state.report_dir is not None and shards.is_property(
                getattr(item, "obj", None), item.path):
            seconds = time.perf_counter() - self.started.pop(item.nodeid, time.perf_counter())
            self.counter.flush(self.state.report_dir, self.state.plan.worker or "main", seconds, gpu=self._gpu(),
                             tier=self.state.plan.contract, definition=self._definition_of(item).name,
                             claim=declared_claim(item), **self.outcomes.pop(item.nodeid, {}))

    def _record_failure(self, item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
        error = call.excinfo.value
        lost = isinstance(error, CudaContextLost) or self.guard.lost is not None
        if lost:  # saved already, by the guard; whatever was raised after the fault is that fault
            _stop_session(item)
            report.sections.append(("gqa-decode case file", (self.guard.lost or str(error)).partition("\n")[2]))
            return
        sticky = is_sticky_cuda_error(error)
        if sticky and self.state.plan.worker:
            self.guard.contain(error)  # does not return
        obj = getattr(item, "obj", None)
        if not self.recorder.used or not (shards.is_hypothesis_test(obj) or shards.in_suite(item.path)):
            return  # case files are for properties and the suite's own tests, not for unit tests that build a case
        cut = shrink_cut_notes(error)  # the case file and the run report say it too
        path = self._save_case("\n".join([call.excinfo.exconly(), *cut]),
                               str(getattr(item, "hypothesis_report_information", "")),
                               device_readable=not sticky, record=self._reported_record(error))
        self.outcomes[item.nodeid] = {"case_file": path, "error": call.excinfo.exconly(),
                                      "shrink_cut": cut[0] if cut else None}
        shown = f"{path}\nreplay: {casefiles.replay_command(path)}" if path else self._budget_note()
        report.sections.append(("gqa-decode case file", shown))
        if sticky:
            _stop_session(item)

    def _reported_record(self, error: BaseException) -> casefiles.Recorder | None:
        """The record of the example whose error Hypothesis raised (the first, where several failing ``@example``s
        are raised as a group), rather than of the last example built; None when it is not known."""
        while getattr(error, "exceptions", None):  # an exception group (the backport's too, before Python 3.11)
            error = error.exceptions[0]
        return self.reported_records.get(id(error))

    def _report_seen_failure(self, item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
        """The item's last failing example as its failure, saved as a case file, where the suite ran out of memory
        while Hypothesis was shrinking it: an infrastructure error never hides a failure seen first."""
        seen = self.seen_failure
        stopped = call.excinfo.exconly().splitlines()[0]
        text = (f"{seen.error}\n\nThe failing example found last, {seen.record.case}, is the smallest one seen: "
                f"Hypothesis was shrinking it when the suite could not allocate a case's inputs ({stopped}).")
        path = self._save_case(seen.error, text, record=seen.record)
        self.outcomes[item.nodeid] = {"case_file": path, "error": seen.error}
        report.longrepr = text
        shown = f"{path}\nreplay: {casefiles.replay_command(path)}" if path else self._budget_note()
        report.sections.append(("gqa-decode case file", shown))

    def _budget_note(self) -> str:
        return (f"not saved: the run's case files reached --failures-budget="
                f"{self.state.failures_budget.max_bytes // 2**20} MB")

    def _save_case(self, error: str, hypothesis_output: str = "", device_readable: bool = True,
                   record: casefiles.Recorder | None = None) -> Path | None:
        state = self.state
        if not state.failures_budget.allows(state.failures_dir, state.plan.run_id):
            return None
        return casefiles.save_case(
            state.failures_dir, record or self.recorder, error=error, impl_spec=state.target.spec, device=state.device,
            profile=shards.profile_name(), run_id=state.plan.run_id, hypothesis_output=hypothesis_output,
            device_readable=device_readable, solution=_solution_record(state.target),
        )

    def _save_after_fault(self, error: str) -> Path | None:
        """The crashing shard claims its property (its siblings stop instead of crashing too) and saves the
        case; None when a sibling crashed first and reports it."""
        nodeid = self.recorder.nodeid or ""
        if self.probing:  # a probe of the run's causes: its case file is the failure's own, saved already
            return None
        prop = examples.property_name(nodeid)
        if not self.claims.claim(prop, nodeid) and self.claims.owner(prop) != nodeid:
            return None
        path = self._save_case(error, device_readable=False)
        if path is None:
            raise RuntimeError(self._budget_note())
        if self.state.plan.worker is None:  # without xdist this process reports its own crash
            self.crashes[nodeid] = str(path)
        return path

    def _isolation_line(self) -> str:
        option = self.config.option
        line = isolation.mode_line(self.state.plan.isolated, option.isolation, option.sanitize)
        if self.isolated is not None and (self.isolated.restarts or self.isolated.share):
            line += f" ({self.isolated.calls} calls, {self.isolated.restarts} child restarts" + (
                f", drawn examples sanitized/plain {self.isolated.share.counts['sanitized']}/"
                f"{self.isolated.share.counts['plain']}" if self.isolated.share else "") + ")"
        return line

    def _gpu(self) -> str | None:
        if self.state.device.type != "cuda":
            return None
        pinned = self.pin.gpu if self.pin is not None else None
        return pinned or os.environ.get("CUDA_VISIBLE_DEVICES", "all visible")

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched) -> None:
        """A worker died running ``crashitem``: add the case file it saved, if any, to the crash report."""
        owner = self.claims.owner(examples.property_name(crashitem))
        if owner is not None and owner != crashitem:  # a sibling shard crashed first: it reports the property
            report.outcome = "skipped"
            report.longrepr = (str(crashitem), 0, f"Skipped: stopped: crashed too, but {owner} crashed first and "
                                                  "reports this property")
            self._report_crash(crashitem, "stopped")
            return
        saved = [entry for entry in casefiles.runs_index(self.state.failures_dir, self.state.plan.run_id)
                 if entry["nodeid"] == crashitem]
        for entry in saved:
            report.longrepr = (f"{report.longrepr}\n{entry['error']}\ncase file {entry['path']}\n"
                               f"replay: {casefiles.replay_command(entry['path'])}")
        if mps.crashed_under_mps(report):  # to be replayed alone, where the run was under MPS
            self.crashes[crashitem] = saved[0]["path"] if saved else None
        self._report_crash(crashitem, "crashed", saved[0] if saved else None)

    def _report_crash(self, nodeid: str, outcome: str, saved: dict | None = None) -> None:
        """The run report's line for an item whose worker died (its worker wrote none)."""
        if self.state.report_dir is None:
            return
        self.counter.begin(nodeid)
        self.counter.flush(self.state.report_dir, "controller", 0.0, outcome=outcome, tier=self.state.plan.contract,
                         case_file=saved["path"] if saved else None,
                         error=saved["error"] if saved else "the worker running it died")

    # ---- the end -------------------------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Note every failing property, and count every item the --time-budget left unstarted, that this process
        hears of (its own items, or its xdist workers')."""
        if report.failed and report.when in ("call", "???") and not _infrastructure_error(report) \
                and shards.in_suite(self.config.rootpath / report.location[0]):
            self.failed_nodeids.append(report.nodeid)
        if report.skipped and _outcome(report) == "unstarted":
            self.unstarted += 1

    def _failures(self) -> list:
        """The run's failures, each with its case file (``causes.Failure``), as the report's process sees them."""
        state = self.state
        return causes.failures_of_run(casefiles.runs_index(state.failures_dir, state.plan.run_id), self.failed_nodeids,
                                      isolated=state.plan.isolated, knobs=tuple(state.target.knobs))

    def _find_causes(self, failures: list) -> dict:
        """``failures`` grouped into root causes by probing (``causes``), in the process that reports the run,
        within what the --time-budget has left (``causes.Budget.for_failures``). No probes once the CUDA context
        is lost."""
        state = self.state
        release = self._release_after_probe if state.device.type == "cuda" else (lambda: None)
        deadline = state.plan.deadline
        budget = causes.Budget.for_failures(len(failures), None if deadline is None else deadline - time.time())
        prober = causes.Prober(self.guarded_impl(), state.device, state.plan.contract, budget=budget, release=release,
                               knob_defaults=knobs.defaults(state.target.knobs))
        if self.guard.lost is not None:
            prober.stopped = "the CUDA context was lost in this process"
        self.probing = True
        try:
            return causes.grouped(failures, prober)
        finally:
            self.probing = False

    def _release_after_probe(self) -> None:
        """Where the GPU is short of memory, what a probe left: the cache, and the cycles of older generations
        (the probe itself collects only the young ones). Not after every probe: each then gave its memory back to
        the driver and took it again."""
        if devices.release_cache_if_short(self.state.device):
            gc.collect()
            torch.cuda.empty_cache()

    def pytest_runtest_logstart(self, nodeid: str, location: tuple) -> None:
        """The xdist controller's first property started on a worker: warm the run report's plotting up in a
        thread, while the controller idles, rather than after the last test (``run_report.warm_up``)."""
        if (self.report_warm_up is None and self.is_controller and self.state.report_dir is not None
                and self.picture and shards.in_suite(self.config.rootpath / location[0])):
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
        if self.mps_pipe and self.crashes and not self.state.plan.worker and not interrupted:
            self._replay_crashes()
        self._write_report(probe=not interrupted)

    def _replay_crashes(self) -> None:
        """Replay each crash alone (``mps``): on the GPUs the run used, one lane each, or where this process
        runs without xdist."""
        lanes = [gpu for gpu in os.environ.get(gpus.GPU_IDS_ENV, "").split(",") if gpu] or [None]
        self.replays = mps.replay_crashes(self.crashes, device=self.state.device.type, root=self.config.rootpath,
                                          lanes=lanes)

    def _write_report(self, probe: bool = True) -> None:
        if self.report_warm_up is not None:
            self.report_warm_up.join()  # matplotlib is not thread-safe: the report draws once it is done
        if self.state.plan.worker:
            return
        directory = self.state.report_dir
        writable = directory is not None and directory.is_dir()
        started = time.monotonic()
        failures = self._failures() if probe else []  # Ctrl-C: the user wants out, not minutes of probes
        if failures and writable:  # the verdicts first: a run stopped while probing still leaves its report
            self._save_report(directory, picture=False)  # drawn once, below: a second or more per drawing
        self.causes = None
        if failures:  # where a long run's end goes, while it goes (the terminal summary waits for the probes)
            _progress(f"\ngqa-decode: {len(failures)} failing properties (their variants) read and the verdicts "
                      f"written in {time.monotonic() - started:.1f} s; grouping them into root causes")
            started = time.monotonic()
            self.causes = self._find_causes(failures)
            probes = self.causes["probes"]
            _progress(f"gqa-decode: grouped in {time.monotonic() - started:.1f} s ({probes['used']} probes, "
                      f"{probes['seconds']} s of at most {probes['seconds_limit']:.0f} s)")
        if writable:
            self._save_report(directory, picture=self.picture)

    @property
    def picture(self) -> bool:
        """Whether the run report draws summary.png (``--report-picture``)."""
        return self.config.option.report_picture == "on"

    def _save_report(self, directory: Path, picture: bool = True) -> None:
        """report.md and its files as they stand (the verdicts; the root causes once probed); summary.png too
        where ``picture``."""
        if self.mps_pipe:
            mps.save(directory, self.mps_pipe, self.replays)
        if self.causes is not None:
            causes.save(directory, self.causes)
        isolation.save(directory, self._isolation_line())
        self.report_path = run_report.write_report(directory, self.state.plan.run_id, picture=picture)

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        state = self.state
        names = ", ".join(d.name for d in state.definitions)
        terminalreporter.write_sep("-", f"gqa-decode: contract tier {state.plan.contract}, impl {state.target.spec}, "
                                        f"definition {names}")
        terminalreporter.write_line(self._isolation_line())
        if self.unstarted:
            terminalreporter.write_line(f"gqa-decode: {self.unstarted} items not started: the run's --time-budget of "
                                        f"{config.option.time_budget} s was spent")
        for said in state.target.declarations():
            terminalreporter.write_line(f"declared by the implementation: {said}")
        found = causes.summary_lines(self.causes)
        if found:
            terminalreporter.write_sep("=", f"gqa-decode: {found[0]} (root causes, grouped by probing)")
            for line in found[1:]:
                terminalreporter.write_line(line)
        saved = casefiles.runs_index(state.failures_dir, state.plan.run_id)
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


# The op types' plain properties (output and LSE within the bound): run first, so that under -x the first failure
# of a kernel that is simply wrong is named by the plainest claim, not by a corruption whose next call it fails.
_PLAIN_PROPERTY_FILES = ("test_decode.py", "test_prefill.py")


def _plainest_first(item: pytest.Item) -> bool:
    """Sort key (stable): the plain property files' items before the rest, each file's order kept."""
    return not (item.path.name in _PLAIN_PROPERTY_FILES and shards.in_suite(item.path))
