"""Examples per second: where the time of one example goes, and how the suite scales over GPUs.

    python benchmarks/throughput.py stages  [--device cuda] [--examples 400] [--case-sizes large] [--out DIR]
    python benchmarks/throughput.py scaling [--gpus 1,2] [--max-examples 300] [--out DIR]

``stages`` runs default-size examples in this process and times each stage of one
example: generation (Hypothesis drawing a case), build (tensors from the case, on the
device), kernel (the implementation, synchronised), oracle (float64 ``attend``) and
checks (the comparison against the bound). Target: 250 examples/s per H200.

``scaling`` runs the property suite under the nightly profile with a fixed number of
examples per property (``--max-examples``), once on the first GPU and once on the first
two (``CUDA_VISIBLE_DEVICES`` with ``-n auto``: one pinned worker per GPU), and prints
examples/s and the ratio. Target: 1.8x on two GPUs. Both modes print a table and, with
``--out``, write it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
STAGES = ("generation", "build", "kernel", "oracle", "checks")


# ---- stages ---------------------------------------------------------------------------------


def _synchronizer(device):
    import torch

    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def measure_stages(device, impl, limits, examples: int) -> dict[str, float]:
    """Seconds spent in each stage over ``examples`` examples, plus the wall time."""
    from hypothesis import HealthCheck, Phase, given, settings

    from properties.cases import build
    from properties.strategies import decode_cases
    from reference import attend, check_against_reference

    sync = _synchronizer(device)
    spent = dict.fromkeys(STAGES, 0.0)

    def timed(stage, function, *args):
        start = time.perf_counter()
        result = function(*args)
        sync()
        spent[stage] += time.perf_counter() - start
        return result

    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=decode_cases(limits=limits))
    def one_example(case):
        inputs = timed("build", build, case, device)
        output, lse = timed("kernel", impl, *inputs)
        reference = timed("oracle", attend, *inputs)
        timed("checks", check_against_reference, output, lse, reference)
        spent["examples"] = spent.get("examples", 0) + 1

    start = time.perf_counter()
    one_example()
    wall = time.perf_counter() - start
    spent["generation"] = wall - sum(spent[s] for s in STAGES[1:])  # Hypothesis: drawing, engine
    spent["wall"] = wall
    return spent


def _stages_table(spent: dict[str, float]) -> list[str]:
    count = spent["examples"]
    lines = [f"{'stage':<12}{'ms/example':>12}{'share':>8}"]
    for stage in STAGES:
        lines.append(f"{stage:<12}{1e3 * spent[stage] / count:>12.2f}{100 * spent[stage] / spent['wall']:>7.1f}%")
    lines.append(f"{'total':<12}{1e3 * spent['wall'] / count:>12.2f}   -> {count / spent['wall']:.1f} examples/s")
    return lines


def run_stages(options) -> dict:
    os.environ.setdefault("TRITON_INTERPRET", "1" if options.device == "cpu" else "0")
    import torch

    from properties._plugin.profiles import CASE_SIZES
    from properties._plugin.target import load_impl

    device = torch.device(options.device)
    impl = load_impl(options.impl, root=ROOT)
    limits = CASE_SIZES[options.case_sizes or ("large" if device.type == "cuda" else "small")]
    measure_stages(device, impl, limits, min(options.examples, 5))  # warm-up: compilation, allocator
    spent = measure_stages(device, impl, limits, options.examples)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
    print(f"stages on {name}, {options.impl}, case sizes {limits}")
    print("\n".join(_stages_table(spent)))
    return {"device": name, "impl": options.impl, "limits": str(limits), **spent,
            "examples_per_second": spent["examples"] / spent["wall"]}


# ---- scaling --------------------------------------------------------------------------------


def _suite_run(gpus: int, options, report_root: Path, max_examples: int) -> dict:
    """One pytest run of the property suite on the first ``gpus`` GPUs; examples counted by the run report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GQA_DECODE_", "PYTEST_XDIST_"))}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(gpus))
    env["GQA_DECODE_MAX_EXAMPLES"] = str(max_examples)
    report_dir = report_root / f"gpus{gpus}"
    command = [sys.executable, "-m", "pytest", *options.paths, "-n", "auto", "-q", "-p", "no:cacheprovider",
               f"--workers-per-gpu={options.workers_per_gpu}",
               f"--hypothesis-profile={options.profile}", f"--run-report={report_dir}",
               f"--failures-dir={report_root / 'failures'}", f"--impl={options.impl}"]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    reports = sorted(report_dir.glob("*/report.json"))
    merged = json.loads(reports[-1].read_text()) if reports else {}
    examples = sum(entry["examples"] for entry in merged.values())
    tail = result.stdout.strip().splitlines()[-1:] or ["(no output)"]
    return {"gpus": gpus, "exit": result.returncode, "summary": tail[0], "wall_s": wall, "examples": examples,
            "examples_per_second": examples / wall if wall else 0.0,
            "busy_s": sum(entry["seconds"] for entry in merged.values())}


def run_scaling(options) -> dict:
    gpu_counts = [int(g) for g in options.gpus.split(",")]
    root = Path(options.out or tempfile.mkdtemp(prefix="gqa-scaling-")) / "scaling"
    if options.warmup:  # compile the kernel into every worker's Triton cache first
        _suite_run(max(gpu_counts), options, root / "warmup", 2)
    runs = [_suite_run(gpus, options, root, options.max_examples) for gpus in gpu_counts]
    base = runs[0]["examples_per_second"] or 1.0
    print(f"{options.profile} profile, {options.max_examples} examples per property, -n auto on the first N GPUs, "
          f"{options.workers_per_gpu} workers per GPU")
    print(f"{'GPUs':>5}{'examples':>10}{'wall s':>9}{'ex/s':>9}{'ratio':>7}  pytest")
    for run in runs:
        print(f"{run['gpus']:>5}{run['examples']:>10}{run['wall_s']:>9.1f}{run['examples_per_second']:>9.1f}"
              f"{run['examples_per_second'] / base:>7.2f}  {run['summary']}")
    return {"profile": options.profile, "max_examples": options.max_examples,
            "workers_per_gpu": options.workers_per_gpu, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("stages", "scaling"))
    parser.add_argument("--impl", default="kernel:run", help="implementation under test (as --impl)")
    parser.add_argument("--out", default=None, help="directory for the JSON results")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda", help="stages: where to run")
    parser.add_argument("--examples", type=int, default=400, help="stages: examples to time")
    parser.add_argument("--case-sizes", choices=("small", "large"), default=None, help="stages: case size limits")
    parser.add_argument("--gpus", default="1,2", help="scaling: GPU counts to compare, first is the baseline")
    parser.add_argument("--max-examples", type=int, default=300, help="scaling: examples per property")
    parser.add_argument("--profile", default="nightly", help="scaling: Hypothesis profile")
    parser.add_argument("--workers-per-gpu", type=int, default=1, help="scaling: pinned xdist workers per GPU")
    parser.add_argument("--paths", nargs="+", default=["properties"], help="scaling: test paths")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="scaling: skip the warm-up run")
    options = parser.parse_args(argv)
    if options.examples < 1 or options.max_examples < 1:
        parser.error("--examples and --max-examples must be positive")
    result = run_stages(options) if options.mode == "stages" else run_scaling(options)
    if options.out:
        Path(options.out).mkdir(parents=True, exist_ok=True)
        (Path(options.out) / f"{options.mode}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
