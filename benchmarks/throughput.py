"""Examples per second: where the time of one example goes, and how the suite scales over GPUs.

    python benchmarks/throughput.py stages  [--device cuda] [--examples 400] [--case-sizes large] [--out DIR]
    python benchmarks/throughput.py syncs   [--examples 400] [--case-sizes large] [--out DIR]
    python benchmarks/throughput.py launches [--examples 400] [--case-sizes large] [--out DIR]
    python benchmarks/throughput.py draws   [--examples 1000] [--workers 12] [--case-sizes large] [--out DIR]
    python benchmarks/throughput.py scaling [--gpus 1,2] [--workers-per-gpu auto|4,8,16] [--max-examples N]
                                            [--mps auto,off] [--shards auto,4] [--warm-workers on,off] [--repeat 2]
                                            [--no-warmup] [--out DIR]
    python benchmarks/throughput.py startup [--device cpu|cuda|auto] [--workers 2|auto] [--repeat 5]
                                            [--select EXPRESSION] [--report] [--out DIR] [-- PYTEST_ARGS]
    python benchmarks/throughput.py isolation [--device cpu|cuda] [--workers 0|2|auto] [--max-examples N]
                                              [--isolation on,off] [--repeat 2] [--impl T] [--out DIR]

``stages`` runs default-size examples in this process and times each stage of every
example, the suite's own stages (``properties.stages``): generation (Hypothesis drawing a
case), build (tensors from the case, on the device), kernel (the implementation), oracle
(float64 ``attend``) and checks (the comparison against the bound), the device
synchronised at each stage's edges.

``syncs`` counts the host synchronisations of the same examples on CUDA (torch's sync debug
mode: read-backs and blocking copies; explicit ``torch.cuda.synchronize`` calls are not counted) by the
line of this repository that made them. Where several processes share a GPU, each one waits for a
turn on the device, so these, more than the kernels launched, bound examples/s per GPU.

``launches`` counts, per example and stage, the host's calls that hand the GPU work (torch's
profiler): kernel launches (Triton's included), graph launches (one each, however many
kernels the graph holds), copies and fills. Under time-slicing each is a turn on the device. It also
prints the device's busy time per example and stage (the kernels, copies and fills those calls gave it, timed by
the profiler) and the busiest kernels by name: where workers share a GPU that is busy most of the time, that
time, summed over the workers, is what bounds examples/s.

``draws`` times generation's floor: Hypothesis drawing the suite's decode cases (``--case-sizes``, default
large) into an empty body, ``--examples`` per process, in one process and in ``--workers`` processes at once
(one thread each, as the suite's workers on a shared CPU). No GPU is used. Compare it with the plain run's
generation (the line under its stage table): what lies above the floor is the suite's own work between examples.

``scaling`` runs the property suite with a fixed number of examples per property
(``--max-examples``), once on the first GPU and once on the first two
(``CUDA_VISIBLE_DEVICES`` with ``-n auto``, ``--workers-per-gpu`` as given, default
``auto``), and prints examples/s per GPU and the ratio, counting the whole pytest
process and counting the tests alone (first test to last, without the start-up). After the last
run's stage table it prints a worker's ms per example three ways and the properties that took most
of the items' time (seconds, examples, ms per example): where the slow examples' tail lies.
Targets (issue 12): 500 examples/s per H200 with the plain ``-n auto
--hypothesis-profile=gpu``, 1.9x on two. Both modes print a table and, with ``--out``,
write it as JSON. ``scaling`` measures whatever GPU sharing the machine has: time-sliced
by default, side by side when an MPS daemon runs (docs/workers.md).

``startup`` runs ``pytest properties -n WORKERS`` ``--repeat`` times with
``benchmarks/startup_probe.py`` loaded and a single quick property selected (``--select``,
a ``-k`` expression), and prints where the time before the first test goes: the xdist
controller up to starting its workers (and which of torch, Triton, Hypothesis it had imported
by then), the workers' start, import, configure and collection (the slowest worker's), and
xdist's wait (first test less the first worker's collection); then where the time after the last
test goes (the workers' session end and exit, xdist waiting for their processes, the run report
with ``--report``, the controller's own exit); medians over the runs, seconds from the command's
start. Arguments after ``--`` go to pytest.

``isolation`` runs ``pytest PATHS -n WORKERS`` once per ``--isolation`` value (each ``--repeat`` times, after
one warm-up run) with the implementation in a child process (``on``) or in-process (``off``), and prints
examples/s of the whole command and of the tests alone, each as a ratio to the first value's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
from gqa_decode_fuzz.engine.target import DEFAULT_IMPL  # noqa: E402 - after the path; imports no torch
from gqa_decode_fuzz.generation import stages  # noqa: E402 - imports neither torch nor triton
from gqa_decode_fuzz.runner import gpus as gpu_slots  # noqa: E402 - imports neither torch nor triton

STAGES = ("generation", *stages.STAGES)


# ---- stages ---------------------------------------------------------------------------------


def measure_stages(device, impl, limits, examples: int, clock: stages.StageClock | None = None) -> dict[str, float]:
    """Seconds spent in each stage over ``examples`` examples, plus the wall time.

    The stages are the suite's own (``properties.stages``), timed in every example here (or by ``clock``).
    """
    import torch
    from hypothesis import HealthCheck, Phase, given, settings

    from gqa_decode_fuzz.generation.cases import build
    from gqa_decode_fuzz.generation.strategies import decode_cases
    from gqa_decode_fuzz.properties.checks import run_and_check

    if clock is None:
        clock = stages.StageClock(every=1, synchronize=torch.cuda.synchronize if device.type == "cuda" else None)
    kernel = stages.timed("kernel", impl)

    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=decode_cases(limits=limits))
    def one_example(case):
        run_and_check(kernel, build(case, device), str(case))

    one_example.hypothesis.inner_test = clock.timing(one_example.hypothesis.inner_test)
    stages.install(clock)
    clock.begin_item("benchmark")
    start = time.perf_counter()
    try:
        one_example()
    finally:
        stages.uninstall()
    wall = time.perf_counter() - start
    taken = clock.take()
    return {"examples": len(taken["examples"]), "wall": wall, "summary": stages.summarise(taken["examples"]),
            "first": taken["first"]}


def _stages_table(spent: dict) -> list[str]:
    """Median, p90 and share per column of the timed examples (the first one apart), and examples/s."""
    summary = spent["summary"] or {}
    lines = [f"{'stage':<12}{'median ms':>11}{'p90 ms':>9}{'share':>8}"]
    for name in (*stages.COLUMNS, "total"):
        if name in summary:
            column = summary[name]
            lines.append(f"{name:<12}{column['median']:>11.3f}{column['p90']:>9.3f}{100 * column['share']:>7.1f}%")
    rate = spent["examples"] / spent["wall"] if spent["wall"] else float("nan")
    lines.append(f"{spent['examples']} examples in {spent['wall']:.2f} s -> {rate:.1f} examples/s")
    return lines


def _warmed_up(options, device_type: str):
    """The device, the implementation and the default-size limits, after a few examples (compilation,
    the allocators) that no measurement should count."""
    os.environ.setdefault("TRITON_INTERPRET", "1" if device_type == "cpu" else "0")
    import torch

    from gqa_decode_fuzz.engine.target import load_target
    from gqa_decode_fuzz.reference.definitions import SEED
    from gqa_decode_fuzz.runner.profiles import CASE_SIZES

    device = torch.device(device_type)
    impl = load_target(options.impl, root=ROOT).serving(SEED)  # the suite's argument order, as the tests call it
    limits = CASE_SIZES[options.case_sizes or ("large" if device.type == "cuda" else "small")]
    measure_stages(device, impl, limits, min(options.examples, 5))
    return device, impl, limits


def run_stages(options) -> dict:
    import torch

    device, impl, limits = _warmed_up(options, options.device)
    spent = measure_stages(device, impl, limits, options.examples)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
    print(f"stages on {name}, {options.impl}, case sizes {limits}")
    print("\n".join(_stages_table(spent)))
    if device.type == "cuda":  # what one worker keeps: its allocator's peak and its oracle graphs' pool
        spent["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
        print(f"peak memory reserved by torch's allocator: {spent['peak_reserved_gib']:.2f} GiB")
    return {"device": name, "impl": options.impl, "limits": str(limits), **spent,
            "examples_per_second": spent["examples"] / spent["wall"] if spent["wall"] else None}


def run_syncs(options) -> dict:
    import traceback
    import warnings

    import torch

    device, impl, limits = _warmed_up(options, "cuda")
    where: Counter = Counter()

    def record(*_args, **_kwargs) -> None:
        ours = [f for f in traceback.extract_stack() if f.filename.startswith(str(ROOT)) and f.name != "record"]
        frame = next((f for f in reversed(ours) if "benchmarks" not in f.filename), None)
        where[f"{Path(frame.filename).relative_to(ROOT)}:{frame.lineno}" if frame else "(outside the repo)"] += 1

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            spent = measure_stages(device, impl, limits, options.examples)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    count = spent["examples"]
    print(f"host synchronisations per example on {torch.cuda.get_device_name(device)}, {options.impl}, {limits}")
    for line, syncs in where.most_common():
        print(f"{syncs / count:>8.2f}  {line}")
    print(f"{sum(where.values()) / count:>8.2f}  in all ({count} examples)")
    return {"examples": count, "syncs_per_example": {line: n / count for line, n in where.items()}}


# Host calls that hand the device work: each is a turn on a GPU shared by time-slicing.
_SUBMISSIONS = {
    "cudaLaunchKernel": "kernels", "cudaLaunchKernelExC": "kernels", "cuLaunchKernel": "kernels",
    "cuLaunchKernelEx": "kernels", "cudaGraphLaunch": "graphs", "cudaMemcpyAsync": "copies",
    "cudaMemsetAsync": "fills",
}
_KINDS = ("kernels", "graphs", "copies", "fills")


class _LabelledClock(stages.StageClock):
    """Marks every stage of every example as a profiler range named ``stage:<name>`` (times nothing)."""

    def stage(self, name: str):
        from torch.profiler import record_function

        return record_function(f"stage:{name}")


def _stage_of(event) -> str:
    """The outermost ``stage:`` range around a profiler event (a nested stage counts toward its outer one)."""
    label, parent = "generation", event.cpu_parent
    while parent is not None:
        if parent.name.startswith("stage:"):
            label = parent.name.removeprefix("stage:")
        parent = parent.cpu_parent
    return label


def run_launches(options) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    device, impl, limits = _warmed_up(options, "cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        spent = measure_stages(device, impl, limits, options.examples, clock=_LabelledClock(every=1))
    count = spent["examples"] or 1
    table = {stage: Counter() for stage in STAGES}
    for event in profiler.events():
        kind = _SUBMISSIONS.get(event.name)
        if kind:
            table.setdefault(_stage_of(event), Counter())[kind] += 1
    busy_by_stage, busy_by_kernel = _device_busy(profiler.events())
    print(f"submissions to the device per example on {torch.cuda.get_device_name(device)}, {options.impl}, "
          f"{limits} ({count} examples; a graph launch counts one), and the device's busy time they gave it")
    print(f"{'stage':<12}" + "".join(f"{kind:>9}" for kind in _KINDS) + f"{'in all':>9}{'busy us':>9}")
    for stage, kinds in [*table.items(), ("in all", sum(table.values(), Counter()))]:
        busy = sum(busy_by_kernel.values()) if stage == "in all" else busy_by_stage.get(stage, 0.0)
        print(f"{stage:<12}" + "".join(f"{kinds[kind] / count:>9.2f}" for kind in _KINDS)
              + f"{sum(kinds.values()) / count:>9.2f}{busy / count:>9.1f}")
    print("the device's busiest work, microseconds per example (kernels, copies and fills by name):")
    for name, busy in busy_by_kernel.most_common(25):
        print(f"{busy / count:>9.1f}  {name}")
    return {"examples": count, "per_example": {stage: {k: n / count for k, n in kinds.items()}
                                               for stage, kinds in table.items()},
            "busy_us_per_example": {stage: busy / count for stage, busy in busy_by_stage.items()},
            "busiest_us_per_example": {name: busy / count for name, busy in busy_by_kernel.most_common(25)}}


def _device_busy(events) -> tuple[Counter, Counter]:
    """Microseconds the device spent on the profiled work: per outermost stage (its range's device time, which
    counts the kernels launched inside it; what no stage launched counts as generation) and per kernel name."""
    from torch.autograd import DeviceType

    by_stage: Counter = Counter()
    by_kernel: Counter = Counter()
    for event in events:
        if event.device_type == DeviceType.CUDA:
            if not event.name.startswith("stage:"):  # a stage's range also shows on the device's timeline
                by_kernel[event.name[:90]] += event.device_time_total
        elif event.name.startswith("stage:") and _stage_of(event) == "generation":  # an outermost stage's range
            by_stage[event.name.removeprefix("stage:")] += event.device_time_total
    by_stage["generation"] = max(0.0, sum(by_kernel.values()) - sum(by_stage.values()))
    return by_stage, by_kernel


# ---- draws ----------------------------------------------------------------------------------


def draw_floor(sizes: str, examples: int) -> float:
    """Milliseconds per example of Hypothesis drawing the suite's decode cases of ``sizes`` into an empty body,
    with the gpu profile's phases but no database and no target: generation's floor in one process."""
    from hypothesis import HealthCheck, Phase, given, settings

    from gqa_decode_fuzz.generation.strategies import decode_cases
    from gqa_decode_fuzz.runner.profiles import CASE_SIZES

    drawn = []

    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=decode_cases(limits=CASE_SIZES[sizes]))
    def empty_body(case):
        drawn.append(case.batch)

    empty_body()  # a warm-up: the strategies built, the imports done
    drawn.clear()
    start = time.perf_counter()
    empty_body()
    return 1e3 * (time.perf_counter() - start) / len(drawn)


def run_draws(options) -> dict:
    """``draw_floor`` in ``--workers`` processes at once (one thread each, as the suite's workers), then alone."""
    import multiprocessing

    sizes = options.case_sizes or "large"
    workers = os.cpu_count() if options.workers == "auto" else int(options.workers)
    os.environ["OMP_NUM_THREADS"] = "1"
    context = multiprocessing.get_context("spawn")
    rows = []
    for processes in sorted({1, workers}):
        with context.Pool(processes) as pool:
            rows.append((processes, pool.starmap(draw_floor, [(sizes, options.examples)] * processes)))
    print(f"generation's floor: Hypothesis drawing decode cases ({sizes} sizes) into an empty body, "
          f"{options.examples} examples per process")
    print(f"{'processes':>10}{'median ms':>11}{'min ms':>8}{'max ms':>8}")
    for processes, spent in rows:
        print(f"{processes:>10}{median(spent):>11.3f}{min(spent):>8.3f}{max(spent):>8.3f}")
    return {"sizes": sizes, "examples": options.examples, "ms_per_example": {str(n): ms for n, ms in rows}}


# ---- scaling --------------------------------------------------------------------------------


def _suite_run(gpus: int, options, report_root: Path, max_examples: int | None, workers_per_gpu: str,
               mps: str = "auto", shards: str = "auto", warm: str = "on") -> dict:
    """One pytest run of the property suite on the first ``gpus`` GPUs; examples counted by its run report."""
    # The suite's options come from the command line only; the oracle's graph, warm-up and Pareto front switches
    # pass, to compare with them off (or, for the front, on).
    passed = ("GQA_DECODE_ORACLE_GRAPHS", "GQA_DECODE_WARM_UP", "GQA_DECODE_PARETO_FRONT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GQA_DECODE_", "PYTEST_XDIST_")) or k in passed}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(gpus))
    if max_examples is not None:
        env["GQA_DECODE_MAX_EXAMPLES"] = str(max_examples)
    report_dir = report_root / f"gpus{gpus}-{time.time_ns()}"
    command = [sys.executable, "-m", "pytest", *options.paths, "-n", "auto", "-q", "-rfE", "-p", "no:cacheprovider",
               f"--workers-per-gpu={workers_per_gpu}", f"--mps={mps}", f"--shards={shards}", f"--warm-workers={warm}",
               f"--hypothesis-profile={options.profile}", f"--run-report={report_dir}",
               f"--failures-dir={report_root / 'failures'}", f"--impl={options.impl}"]
    run = _pytest_run(command, env, report_dir)
    report = run.pop("report")
    return {"gpus": gpus, **run, "examples_per_second_per_gpu": run["examples_per_second"] / gpus,
            "stages_ms_per_example": report.get("throughput", {}).get("stages_ms_per_example"),
            "workers": gpus * _per_gpu(workers_per_gpu, gpus), "mps": mps, "shards": shards, "warm": warm}


def _per_gpu(option: str, gpus: int) -> int:
    """Workers per GPU as the run resolves ``--workers-per-gpu``; the report's count of the workers that sent it a
    part once read 7 for 8."""
    return gpu_slots.workers_per_gpu(option if option == "auto" else int(option), gpus)


def _pytest_run(command: list[str], env: dict[str, str], report_dir: Path) -> dict:
    """Run one pytest command of the suite: its exit status, last line, failing items and what they raised (a
    correct kernel fails nothing: any such line is the suite's or the machine's), wall time, and what its run
    report (``report``, the run.json) counted."""
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    reports = sorted(report_dir.glob("*/run.json"))
    report = json.loads(reports[-1].read_text()) if reports else {}
    merged = reports[-1].with_name("report.json") if reports else None
    properties = json.loads(merged.read_text()) if merged is not None and merged.is_file() else {}
    throughput = report.get("throughput", {})
    examples = throughput.get("examples", 0)
    lines = result.stdout.splitlines()
    failures = [line[:300] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    raised = list(dict.fromkeys(line[:300] for line in lines  # each distinct error line once
                                if re.match(r"E\s+[\w.]+(Error|Exception|Lost|Memory)\w*:", line)))
    tail = result.stdout.strip().splitlines()[-1:] or ["(no output)"]
    return {"exit": result.returncode, "summary": tail[0], "failures": failures[:12] + raised[:8], "wall_s": wall,
            "examples": examples, "examples_per_second": examples / wall if wall else 0.0,
            "tests_wall_s": throughput.get("wall"), "report": report,
            "properties": {name: {"seconds": entry.get("seconds", 0.0), "examples": entry.get("examples", 0)}
                           for name, entry in properties.items() if isinstance(entry, dict)}}


def _tests_rate(run: dict) -> float:
    """Examples/s between the run's first and last test: the whole process less its start and end."""
    return run["examples"] / run["tests_wall_s"] if run["tests_wall_s"] else float("nan")


def _worker_time_line(run: dict, steady: dict) -> str:
    """A worker's milliseconds per example three ways, each containing the last: its share of the tests' wall
    (between items too: pytest's and xdist's own work), its items' own time (``busy``: within items, between
    examples too: Hypothesis's engine, shrinking, first examples) and the timed examples' mean."""
    busy = (run["stages_ms_per_example"] or {}).get("busy_ms_per_example")
    wall = 1e3 * run["workers"] * run["tests_wall_s"] / run["examples"] if run["tests_wall_s"] and run["examples"] \
        else float("nan")
    return (f"a worker's ms per example: {wall:.2f} of the tests' wall, {busy or float('nan'):.2f} inside items, "
            f"{steady['total']['mean']:.2f} the timed examples' mean ({steady['total']['median']:.2f} median)")


def _slowest_properties(run: dict, count: int = 6) -> list[str]:
    """The properties that took most of the items' time in ``run`` (their shards' seconds summed over workers):
    where the tail of slow examples lies, which a median per stage does not show."""
    spent = sorted(run["properties"].items(), key=lambda item: -item[1]["seconds"])
    total = sum(entry["seconds"] for _, entry in spent) or float("nan")
    lines = [f"the items' {total:.1f} s by property, the {min(count, len(spent))} slowest:"]
    for name, entry in spent[:count]:
        per_example = 1e3 * entry["seconds"] / entry["examples"] if entry["examples"] else float("nan")
        lines.append(f"  {100 * entry['seconds'] / total:5.1f}%  {entry['seconds']:7.2f} s  {entry['examples']:>6} ex  "
                     f"{per_example:8.2f} ms/ex  {name[:110]}")
    return lines


def run_scaling(options) -> dict:
    gpu_counts = [int(g) for g in options.gpus.split(",")]
    root = Path(options.out or tempfile.mkdtemp(prefix="gqa-scaling-")) / "scaling"
    per_gpu = options.workers_per_gpu.split(",")
    if options.warmup:  # compile the kernel into every worker's Triton cache first
        _suite_run(max(gpu_counts), options, root / "warmup", 2, per_gpu[0])
    # Repeats go round the whole list, so that each configuration's runs are interleaved with the others'.
    runs = [_suite_run(gpus, options, root, options.max_examples, workers, mps, shards, warm)
            for _ in range(options.repeat) for gpus in gpu_counts for workers in per_gpu
            for mps in options.mps.split(",") for shards in options.shards.split(",")
            for warm in options.warm_workers.split(",")]
    base = runs[0]["examples_per_second"] or 1.0
    per_property = options.max_examples if options.max_examples is not None else "the profile's"
    print(f"{options.profile} profile, {per_property} examples per property, -n auto on the first N GPUs, "
          f"--workers-per-gpu={options.workers_per_gpu}; wall is the whole pytest process, start-up included")
    print(f"{'GPUs':>5}{'workers':>8}{'mps':>5}{'shards':>7}{'warm':>5}{'examples':>10}{'wall s':>9}{'start s':>8}"
          f"{'ex/s':>9}{'per GPU':>9}{'ratio':>7}{'tests ex/s':>11}{'ratio':>7}  pytest")
    tests_base = _tests_rate(runs[0]) or 1.0
    for run in runs:
        start_up = run["wall_s"] - run["tests_wall_s"] if run["tests_wall_s"] else float("nan")
        print(f"{run['gpus']:>5}{run['workers']:>8}{run['mps']:>5}{run['shards']:>7}{run['warm']:>5}{run['examples']:>10}"
              f"{run['wall_s']:>9.1f}{start_up:>8.1f}"
              f"{run['examples_per_second']:>9.1f}{run['examples_per_second_per_gpu']:>9.1f}"
              f"{run['examples_per_second'] / base:>7.2f}{_tests_rate(run):>11.1f}{_tests_rate(run) / tests_base:>7.2f}"
              f"  {run['summary']}")
        for line in run["failures"]:  # a correct kernel fails nothing: any line here is the suite's or the machine's
            print(f"      {line}")
    for run in runs[-1:]:
        steady = (run["stages_ms_per_example"] or {}).get("steady")
        if steady:
            print(f"stages of the last run, one worker, medians over {steady['total']['count']} timed examples: "
                  + ", ".join(f"{name} {steady[name]['median']:.3f} ms ({100 * steady[name]['share']:.0f}%)"
                              for name in (*stages.COLUMNS, "total")))
            print(_worker_time_line(run, steady))
        split = (run["stages_ms_per_example"] or {}).get("split")
        if split:
            print(stages.split_line(split))
        print(*_slowest_properties(run), sep="\n")
    return {"profile": options.profile, "max_examples": options.max_examples,
            "workers_per_gpu": options.workers_per_gpu, "runs": runs}


# ---- isolation ------------------------------------------------------------------------------


def _isolation_run(options, isolation: str, report_root: Path, max_examples: int | None) -> dict:
    """One pytest run of the suite with ``--isolation=isolation``; examples counted by its run report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GQA_DECODE_", "PYTEST_XDIST_"))}
    if max_examples is not None:
        env["GQA_DECODE_MAX_EXAMPLES"] = str(max_examples)
    report_dir = report_root / f"{isolation}-{time.time_ns()}"
    command = [sys.executable, "-m", "pytest", *options.paths, "-n", options.workers, "-q", "-rfE",
               "-p", "no:cacheprovider", f"--device={options.device}", f"--isolation={isolation}",
               f"--impl={options.impl}", f"--hypothesis-profile={options.profile}", f"--run-report={report_dir}",
               f"--failures-dir={report_root / 'failures'}", *options.pytest_args]
    run = _pytest_run(command, env, report_dir)
    del run["report"]
    return {"isolation": isolation, **run}


def run_isolation(options) -> dict:
    root = Path(options.out or tempfile.mkdtemp(prefix="gqa-isolation-")) / "isolation"
    modes = options.isolation.split(",")
    _isolation_run(options, modes[0], root / "warmup", 2)  # Triton's cache, the page cache
    runs = [_isolation_run(options, mode, root, options.max_examples) for _ in range(options.repeat) for mode in modes]
    base, tests_base = runs[0]["examples_per_second"] or 1.0, _tests_rate(runs[0]) or 1.0
    print(f"--impl={options.impl} --device={options.device} -n {options.workers}, {options.profile} profile, "
          f"{options.max_examples or 'the profile'} examples per property; wall is the whole pytest process")
    print(f"{'isolation':>10}{'examples':>10}{'wall s':>9}{'ex/s':>9}{'ratio':>7}{'tests ex/s':>11}{'ratio':>7}"
          "  pytest")
    for run in runs:
        print(f"{run['isolation']:>10}{run['examples']:>10}{run['wall_s']:>9.1f}{run['examples_per_second']:>9.1f}"
              f"{run['examples_per_second'] / base:>7.2f}{_tests_rate(run):>11.1f}{_tests_rate(run) / tests_base:>7.2f}"
              f"  {run['summary']}")
        for line in run["failures"]:  # a correct kernel fails nothing: any line here is the suite's or the machine's
            print(f"      {line}")
    return {"impl": options.impl, "device": options.device, "workers": options.workers, "runs": runs}


# ---- startup --------------------------------------------------------------------------------

# (process, phase, event, the row it is timed from as (process, event)): "at" is a median over the runs of the
# event's time from the command's start (for "workers", the slowest worker's in each run; for "first worker", the
# fastest's), "took" the median time since the row named (the command's start for None). Events are
# startup_probe.py's.
STARTUP_ROWS = (
    ("controller", "python and pytest imported", "probe loaded", None),
    ("controller", "conftest.py and plugins imported", "configure start", ("controller", "probe loaded")),
    ("controller", "configured", "configure end", ("controller", "configure start")),
    ("controller", "starts the workers", "spawn start", ("controller", "configure end")),
    ("controller", "all workers started", "spawn end", ("controller", "spawn start")),
    ("controller", "its collection step done", "collection end", ("controller", "spawn end")),
    ("workers", "python and pytest imported", "probe loaded", ("controller", "spawn start")),
    ("workers", "conftest.py and plugins imported", "configure start", ("workers", "probe loaded")),
    ("workers", "configured", "configure end", ("workers", "configure start")),
    ("workers", "collected", "collection finish", ("workers", "configure end")),
    ("first worker", "collected", "collection finish", ("controller", "spawn start")),
    ("xdist", "first test (wait: since the first worker)", "first test start", ("first worker", "collection finish")),
)
# The end, from the last test (the controller's) to the command's exit: the workers' session end, unconfigure and exit
# handlers (the slowest worker's), the controller hearing the last of them finish, xdist waiting for their
# processes to exit (their interpreters' teardown), the run report, and the controller's own unconfigure, exit
# handlers and interpreter teardown ("exited", timed by the benchmark).
END_ROWS = (
    ("controller", "last test ends", "last test end", None),
    ("workers", "session finished", "sessionfinish end", ("controller", "last test end")),
    ("workers", "unconfigured", "unconfigure end", ("workers", "sessionfinish end")),
    ("workers", "exit handlers reached", "exit", ("workers", "unconfigure end")),
    ("controller", "heard the last worker finish", "worker down", ("controller", "last test end")),
    ("controller", "worker processes gone (xdist)", "workers exited", ("controller", "worker down")),
    ("controller", "session finished (report joined)", "sessionfinish end", ("controller", "workers exited")),
    ("controller", "unconfigured", "unconfigure end", ("controller", "sessionfinish end")),
    ("controller", "exit handlers reached", "exit", ("controller", "unconfigure end")),
    ("controller", "exited", "process exit", ("controller", "exit")),
)


def _startup_run(options, log: Path) -> dict:
    """One probed pytest run: each process's events in seconds from the command's start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GQA_DECODE_", "PYTEST_XDIST_"))}
    env.update(STARTUP_PROBE_LOG=str(log), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    log.unlink(missing_ok=True)
    report = str(log.parent / "reports") if options.report else "none"
    command = [sys.executable, "-m", "pytest", "-p", "benchmarks.startup_probe", *options.paths, "-n",
               str(options.workers), f"--device={options.device}", "-k", options.select, "--max-examples=1", "-q",
               "-p", "no:cacheprovider", f"--run-report={report}", f"--impl={options.impl}", *options.pytest_args]
    start = time.time()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    exited = time.time() - start
    if result.returncode != 0:
        output = result.stdout[-2000:] + result.stderr[-2000:]
        raise SystemExit(f"{' '.join(command)} exited {result.returncode}:\n{output}")
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    run: dict[str, dict[str, float]] = {"controller": {}, "workers": {}, "first worker": {}, "xdist": {}}
    imported_at_spawn: list[str] | None = None
    for line in lines:
        t = line["t"] - start
        if line["role"] == "controller":
            run["controller"].setdefault(line["event"], t)
            run["xdist"].setdefault(line["event"], t)
            if line["event"] == "spawn start":
                imported_at_spawn = line["imported"]
        else:  # the slowest worker, and the fastest
            run["workers"][line["event"]] = max(t, run["workers"].get(line["event"], t))
            run["first worker"][line["event"]] = min(t, run["first worker"].get(line["event"], t))
        if line["event"] in ("last test end", "worker down"):  # the last one
            run[line["role"] if line["role"] == "controller" else "workers"][line["event"]] = t
    run["controller"]["process exit"] = exited
    return {"times": run, "imported_at_spawn": imported_at_spawn, "exit_s": exited}


def run_startup(options) -> dict:
    log = Path(options.out or tempfile.mkdtemp(prefix="gqa-startup-")) / "startup-probe.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    _startup_run(options, log)  # warm: bytecode and Triton caches
    runs = [_startup_run(options, log) for _ in range(options.repeat)]
    print(f"pytest {' '.join(options.paths)} -n {options.workers} --device={options.device} -k {options.select!r}: "
          f"medians of {options.repeat} runs, seconds from the command's start")
    print(f"{'process':<14}{'phase':<44}{'at s':>7}{'took s':>8}")
    rows, seen = [], {}
    end = "the end; took s: since the same process's row above (the workers' first: since the last test)"
    for table, title in ((STARTUP_ROWS, None), (END_ROWS, end)):
        if title:
            print(f"-- {title}")
        for process, name, event, since in table:
            times = [run["times"][process].get(event) for run in runs]
            if any(t is None for t in times):
                continue  # without xdist, or an event this run has not got
            origin = seen.get(since, [0.0] * len(runs))
            seen[process, event] = times
            rows.append({"process": process, "phase": name, "event": event, "times": times,
                         "at_s": median(times), "took_s": median([t - o for t, o in zip(times, origin)])})
            print(f"{process:<14}{name:<44}{rows[-1]['at_s']:>7.2f}{rows[-1]['took_s']:>8.2f}")
    ends = [run["times"]["controller"]["process exit"] - run["times"]["controller"]["last test end"]
            for run in runs if "last test end" in run["times"]["controller"]]
    if ends:
        print(f"last test to exit: median {median(ends):.2f} s (runs: {', '.join(f'{t:.2f}' for t in ends)})")
    spawns = {tuple(run["imported_at_spawn"] or ()) for run in runs}
    print("imported by the controller when it starts the workers: "
          + "; ".join(", ".join(names) or "none of torch, triton, hypothesis, numpy" for names in spawns))
    return {"workers": options.workers, "device": options.device, "select": options.select, "rows": rows,
            "imported_at_spawn": [run["imported_at_spawn"] for run in runs],
            "exit_s": [run["exit_s"] for run in runs]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("stages", "syncs", "launches", "draws", "scaling", "startup",
                                         "isolation"))
    parser.add_argument("--impl", default=DEFAULT_IMPL,
                        help="implementation under test (as --impl; default the suite's own kernel, which runs "
                             "in-process as in the plain command: any other spelling of it is isolated)")
    parser.add_argument("--out", default=None, help="directory for the JSON results")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default=None,
                        help="stages: where to run (default cuda); startup: --device (default auto)")
    parser.add_argument("--examples", type=int, default=400,
                        help="stages, syncs, launches: examples to run; draws: per process")
    parser.add_argument("--case-sizes", choices=("small", "large"), default=None,
                        help="stages, syncs, draws: case size limits")
    parser.add_argument("--gpus", default="1,2", help="scaling: GPU counts to compare, first is the baseline")
    parser.add_argument("--max-examples", type=int, default=None,
                        help="scaling: examples per property (default: the profile's)")
    parser.add_argument("--profile", default="gpu", help="scaling, isolation: Hypothesis profile")
    parser.add_argument("--workers-per-gpu", default="auto",
                        help="scaling: pinned xdist workers per GPU, or auto; a comma-separated list compares them")
    parser.add_argument("--mps", default="auto",
                        help="scaling: the suite's --mps (auto: an MPS server of the run's own where workers share a "
                             "GPU; off: time-sliced); a comma-separated list compares them")
    parser.add_argument("--shards", default="auto",
                        help="scaling: the suite's --shards (auto: one per worker); a comma-separated list compares "
                             "them")
    parser.add_argument("--warm-workers", default="on",
                        help="scaling: the suite's --warm-workers values to compare (on: workers forked from a server "
                             "with torch imported; kept: from such a server kept between runs, reused from the "
                             "second run on; off: fresh interpreters)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="scaling: runs per GPU count (default 1; the first may be cold); startup: runs (5)")
    parser.add_argument("--paths", nargs="+", default=["properties"], help="scaling, startup: test paths")
    parser.add_argument("--workers", default="2",
                        help="startup, isolation: -n (a number or auto); draws: processes at once")
    parser.add_argument("--select", default="test_batch_zero_gives_empty_results",
                        help="startup: -k expression; a quick test, so that the runs end soon after it starts")
    parser.add_argument("--report", action="store_true",
                        help="startup: write the run report (under --out or a temporary folder), not --run-report=none")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="scaling: skip the warm-up run")
    parser.add_argument("--isolation", default="on,off", help="isolation: the --isolation values to compare")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:cut])
    options.pytest_args = argv[cut + 1:]  # startup: more pytest arguments, after --
    options.device = options.device or ("auto" if options.mode in ("startup", "isolation") else "cuda")
    options.repeat = options.repeat or (5 if options.mode == "startup" else 1)
    if options.mode == "stages" and options.device == "auto":
        parser.error("stages: --device is cpu or cuda")
    if options.examples < 1 or (options.max_examples or 1) < 1 or options.repeat < 1:
        parser.error("--examples, --max-examples and --repeat must be positive")
    modes = {"stages": run_stages, "syncs": run_syncs, "launches": run_launches, "scaling": run_scaling,
             "startup": run_startup, "isolation": run_isolation, "draws": run_draws}
    result = modes[options.mode](options)
    if options.out:
        Path(options.out).mkdir(parents=True, exist_ok=True)
        (Path(options.out) / f"{options.mode}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
