"""pytest plugin of the suite, in one place: options, Hypothesis profiles, device choice,
GPU workers and shards, case files and crash containment, the run report, markers, fixtures.

The helpers live in ``properties/`` (workers, failures, containment, run_report); this
file holds every hook and fixture.
"""

from __future__ import annotations

import os

from properties import workers

# An xdist worker claims its GPU before anything can initialise CUDA in this process.
PIN = workers.pin_this_worker()

import datetime  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import Phase, settings  # noqa: E402

from properties import cases, containment, failures, profiles, run_report  # noqa: E402
from properties import session as suite  # noqa: E402
from properties.impl import DEFAULT_IMPL, ImplSpecError, load_impl  # noqa: E402

ROOT = Path(__file__).resolve().parent
PROPERTY_SUITE = ROOT / "properties"
RUN_ID_ENV = "GQA_DECODE_RUN_ID"

profiles.register_profiles()
# The hypothesis plugin's --hypothesis-profile, when given, overrides this at configure time.
settings.load_profile(profiles.default_profile())

# Every case a test builds is recorded (for its case file) and counted (for the run report).
cases.add_build_observer(failures.recorder.note_build)
cases.add_build_observer(run_report.observe_case)

_OPTIONS = (
    # flag, environment variable, default, choices, metavar, help
    ("--impl", "GQA_DECODE_IMPL", DEFAULT_IMPL, None, "TARGET",
     "implementation under test: 'package.module:function' or 'path/to/file.py:function'"),
    ("--device", "GQA_DECODE_DEVICE", "auto", ("auto", "cpu", "cuda"), None,
     "where the kernel runs: cuda, cpu (Triton interpreter), or auto (cuda when available)"),
    ("--case-sizes", "GQA_DECODE_CASE_SIZES", None, tuple(profiles.CASE_SIZES), None,
     "size limits of generated cases; default small on cpu, large on cuda"),
    ("--workers-per-gpu", workers.WORKERS_PER_GPU_ENV, "1", None, "N",
     "xdist workers per visible GPU under -n auto (default 1)"),
    ("--shards", "GQA_DECODE_SHARDS", "auto", None, "N",
     "split each property into N items with a share of the examples each; auto: one per xdist worker"),
    ("--max-examples", "GQA_DECODE_MAX_EXAMPLES", None, None, "N",
     "examples per property instead of the profile's, shared among its shards"),
    ("--failures-dir", "GQA_DECODE_FAILURES_DIR", "failures", None, "DIR",
     "where failing examples are saved as case files"),
    ("--run-report", "GQA_DECODE_REPORT_DIR", "reports", None, "DIR",
     "where the run report goes, one folder per run; 'none' for no report"),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gqa-decode", "GQA paged-decode property suite")
    for flag, env, default, choices, metavar, text in _OPTIONS:
        group.addoption(
            flag, dest=flag.lstrip("-").replace("-", "_"), default=os.environ.get(env, default),
            choices=choices, metavar=metavar, help=f"{text} (env {env})",
        )


def _positive(config: pytest.Config, name: str) -> int | None:
    value = getattr(config.option, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise pytest.UsageError(f"--{name.replace('_', '-')}={value!r}: expected a positive whole number")
    return number


def _resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device=cuda but torch sees no CUDA device; try --device=cpu")
    return torch.device(choice)


def _worker(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput else None


def _is_controller(config: pytest.Config) -> bool:
    """The xdist controller: it starts workers and runs no test."""
    return _worker(config) is None and getattr(config.option, "dist", "no") != "no"


def _run_paths(config: pytest.Config, run_id: str) -> tuple[Path, Path | None]:
    failures_dir = config.rootpath / config.option.failures_dir
    report = config.option.run_report
    return failures_dir, None if report == "none" else config.rootpath / report / run_id


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped when the kernel runs in the interpreter")
    device = _resolve_device(config.option.device)
    if device.type == "cpu":
        # Must precede the import of any @triton.jit module; the compatibility layer then serves any
        # Triton kernel under test, whoever wrote it, not only ours.
        os.environ["TRITON_INTERPRET"] = "1"
        from kernel._interpreter_compat import install

        install()
    sizes = config.option.case_sizes or ("small" if device.type == "cpu" else "large")
    try:
        impl = load_impl(config.option.impl, root=ROOT)
        config.gqa_shards = workers.shard_count(config.option.shards)
    except (ImplSpecError, ValueError) as error:
        raise pytest.UsageError(str(error)) from None
    config.gqa_max_examples = _positive(config, "max_examples")
    per_gpu = _positive(config, "workers_per_gpu")
    worker = _worker(config)
    # The controller names the run and its workers inherit the name; a worker then drops it, so that a
    # pytest it starts (tests/ does) is a run of its own.
    run_id = os.environ.pop(RUN_ID_ENV, None) if worker else None
    run_id = run_id or datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + str(os.getpid())
    failures_dir, report_dir = _run_paths(config, run_id)
    suite.configure(suite.Session(
        impl_spec=config.option.impl, impl=impl, device=device, sizes=sizes, limits=profiles.CASE_SIZES[sizes],
        run_id=run_id, failures_dir=failures_dir, report_dir=report_dir, worker=worker,
    ))
    config.gqa_slots_dir = None
    if _is_controller(config):
        os.environ[RUN_ID_ENV] = run_id
        if device.type == "cuda":
            config.gqa_slots_dir = workers.export_gpus(workers.visible_gpu_ids(torch.cuda.device_count()), per_gpu)
    else:
        for name in (workers.GPU_IDS_ENV, workers.SLOTS_DIR_ENV):
            os.environ.pop(name, None)
        run_report.listen_to_hypothesis()


def pytest_unconfigure(config: pytest.Config) -> None:
    slots_dir = getattr(config, "gqa_slots_dir", None)
    if slots_dir is not None:
        for lock in slots_dir.glob("*.lock"):
            lock.unlink(missing_ok=True)
        slots_dir.rmdir()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: --workers-per-gpu workers per visible GPU; the core count without CUDA."""
    return workers.auto_worker_count(config.option.device, _positive(config, "workers_per_gpu") or 1)


def _profile_name() -> str:
    # get_current_profile_name() is recent; the GPU image may carry an older Hypothesis.
    getter = getattr(settings, "get_current_profile_name", None)
    return getter() if getter else getattr(settings, "_current_profile", "?")


def pytest_report_header(config: pytest.Config) -> list[str]:
    current = suite.current()
    return [
        f"gqa-decode: impl={current.impl_spec} device={current.device} case-sizes={current.sizes} "
        f"hypothesis-profile={_profile_name()} shards={config.option.shards} run={current.run_id}"
    ]


# ---- shards ---------------------------------------------------------------------------------


def _in_property_suite(path: Path) -> bool:
    return Path(path).resolve().is_relative_to(PROPERTY_SUITE)


def _is_property(function, path: Path) -> bool:
    return getattr(function, "is_hypothesis_test", False) and _in_property_suite(path)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    count = metafunc.config.gqa_shards
    function = metafunc.function
    if count < 2 or not _is_property(function, metafunc.definition.path):
        return
    if Phase.generate not in function._hypothesis_internal_use_settings.phases:
        return  # a replay-only profile: every shard would replay the same database entries
    shards = [workers.Shard(index, count) for index in range(count)]
    metafunc.parametrize("hypothesis_shard", shards, indirect=True, ids=str)


@pytest.fixture(autouse=True)
def hypothesis_shard(request: pytest.FixtureRequest):
    """This property's shard (None when unsharded); applies its share of examples and its seed."""
    shard = getattr(request, "param", None)
    config = request.config
    if request.scope != "function" or not _is_property(request.function, request.node.path):
        yield shard
        return
    with workers.sharded(
        request.function, run_report.property_name(request.node.nodeid), shard=shard,
        profile_max_examples=settings.default.max_examples, max_examples=config.gqa_max_examples,
        forced_seed=config.getoption("hypothesis_seed", None),
    ):
        yield shard


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item):
    """Shards share their property's example-database key, so an example saved by any shard, under
    any shard count, replays in every later run (Hypothesis keys parametrized items by node id)."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "hypothesis_shard" in callspec.params:
        inner = item.obj.hypothesis.inner_test
        name = run_report.property_name(item.nodeid)
        if "[" in name:  # parametrized apart from the shard: keep that part of the key
            inner._hypothesis_internal_add_digest = name.encode()
        elif hasattr(inner, "_hypothesis_internal_add_digest"):
            del inner._hypothesis_internal_add_digest
    yield


# ---- case files, crash containment, run report -------------------------------------------------


def _save_case(error: str, *, hypothesis_output: str = "", device_readable: bool = True) -> Path:
    current = suite.current()
    return failures.save_case(
        current.failures_dir, error=error, impl_spec=current.impl_spec, device=current.device,
        profile=_profile_name(), run_id=current.run_id, hypothesis_output=hypothesis_output,
        device_readable=device_readable,
    )


def _save_after_fault(error: str) -> Path:
    return _save_case(error, device_readable=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if suite.current().device.type == "cuda":
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (kernel runs in the Triton interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    failures.recorder.begin(item.nodeid)
    run_report.begin(item.nodeid)
    item.gqa_started = time.perf_counter()


def _record_failure(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
    error = call.excinfo.value
    current = suite.current()
    if isinstance(error, containment.CudaContextLost):  # saved already, by the guard
        item.session.shouldstop = f"the CUDA context was lost in {item.nodeid}; later tests would fail spuriously"
        report.sections.append(("gqa-decode case file", str(error).partition("\n")[2]))
        return
    sticky = containment.is_sticky_cuda_error(error)
    if sticky and current.worker:
        containment.contain(error, save=_save_after_fault, in_worker=True)  # does not return
    hypothesis_output = str(getattr(item, "hypothesis_report_information", ""))
    path = _save_case(call.excinfo.exconly(), hypothesis_output=hypothesis_output, device_readable=not sticky)
    report.sections.append(("gqa-decode case file", f"{path}\nreplay: {failures.replay_command(path)}"))
    if sticky:
        item.session.shouldstop = f"the CUDA context was lost in {item.nodeid}; later tests would fail spuriously"


def _gpu(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    return PIN.gpu if PIN is not None and PIN.gpu else os.environ.get("CUDA_VISIBLE_DEVICES", "all visible")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and report.failed and failures.recorder.used:
        _record_failure(item, call, report)
    current = suite.current()
    if call.when == "teardown" and current.report_dir is not None and _is_property(getattr(item, "obj", None),
                                                                                   item.path):
        seconds = time.perf_counter() - getattr(item, "gqa_started", time.perf_counter())
        run_report.flush(current.report_dir, current.worker or "main", seconds, gpu=_gpu(current.device))


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    """A worker died running ``crashitem``: add the case file it saved, if any, to the crash report."""
    current = suite.current()
    saved = [entry for entry in failures.runs_index(current.failures_dir, current.run_id)
             if entry["nodeid"] == crashitem]
    for entry in saved:
        report.longrepr = (f"{report.longrepr}\n{entry['error']}\ncase file {entry['path']}\n"
                           f"replay: {failures.replay_command(entry['path'])}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    current = suite.current()
    if current.worker or current.report_dir is None or not current.report_dir.is_dir():
        return
    session.config.gqa_report = run_report.write_report(current.report_dir, current.run_id)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    current = suite.current()
    saved = failures.runs_index(current.failures_dir, current.run_id)
    if saved:
        terminalreporter.write_sep("=", "gqa-decode: failures saved as case files")
        for entry in saved:
            terminalreporter.write_line(f"{entry['nodeid']}\n    {failures.replay_command(entry['path'])}")
    report = getattr(config, "gqa_report", None)
    if report is not None:
        terminalreporter.write_sep("-", "gqa-decode run report")
        table = [line for line in report.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
        for line in table[:2] + table[2:22]:
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"report: {report} (summary.png beside it)")


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device the kernel under test runs on."""
    return suite.current().device


@pytest.fixture(scope="session")
def impl():
    """The implementation under test (``--impl``), behind the recording and crash-containment guard."""
    current = suite.current()
    return containment.guarded(
        current.impl, device=current.device, save=_save_after_fault, in_worker=current.worker is not None
    )


@pytest.fixture(autouse=True)
def cuda_context_check():
    """After each test on CUDA: a sticky error still pending is charged to that test, then contained."""
    yield
    current = suite.current()
    containment.check_context(current.device, save=_save_after_fault, in_worker=current.worker is not None)
