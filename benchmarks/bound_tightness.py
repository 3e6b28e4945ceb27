"""How tight is the error bound? A report, not a test.

Runs an implementation (default: the project's kernel) on many random cases and
prints, per value regime, the distribution of each case's worst err/bound ratio for
the output and for the LSE. A correct implementation stays below 1 everywhere; a
bound that is not slack puts the 99.9th percentile above 0.1 (docs/tolerance.md).

    python benchmarks/bound_tightness.py                      # CPU: Triton interpreter, 2,000 cases
    python benchmarks/bound_tightness.py --examples 10000     # one GPU: about 3 minutes
    python benchmarks/bound_tightness.py --impl tests/impls/torch_float32.py:run --out reports/
    python benchmarks/bound_tightness.py --summarize run1/cases.csv run2/cases.csv

Cases are drawn from a seeded generator (not Hypothesis), over every value regime
of ``properties.cases``, with ragged batches, empty sequences, block-edge and long
lengths and a spread of scales. ``--out DIR`` also writes one CSV row per case.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
BLOCK_EDGES = (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257)
SPECIAL_SCALES = (0.0, 1e-6, -0.0883883476, 8.0, 64.0)
# Per device: (examples, longest sequence, largest batch).
DEVICE_DEFAULTS = {"cpu": (2000, 512, 2), "cuda": (10000, 4096, 4)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="kernel:run", help="'package.module:function' or 'path/file.py:function'")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--examples", type=int, default=None, help="cases to run (default: 2000 cpu, 10000 cuda)")
    parser.add_argument("--max-len", type=int, default=None, help="longest sequence (default: 512 cpu, 4096 cuda)")
    parser.add_argument("--max-batch", type=int, default=None, help="largest batch (default: 2 cpu, 4 cuda)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the case generator")
    parser.add_argument("--out", type=Path, default=None, help="directory for per-case results (cases.csv)")
    parser.add_argument("--summarize", type=Path, nargs="+", default=None, metavar="CSV",
                        help="run nothing: print the table for the cases.csv files of earlier runs")
    args = parser.parse_args(argv)
    for name in ("examples", "max_len", "max_batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}={value} must be at least 1")
    return args


def random_length(rng: random.Random, max_len: int) -> int:
    """Tokens in one sequence: empty, short, at a block edge, anywhere, or long."""
    kind = rng.random()
    if kind < 0.05:
        return 0
    if kind < 0.35:
        return rng.randint(1, min(64, max_len))
    if kind < 0.55:
        return min(rng.choice(BLOCK_EDGES), max_len)
    if kind < 0.85:
        return rng.randint(1, max_len)
    return rng.randint(max(1, max_len // 2), max_len)


def random_scale(rng: random.Random) -> float | None:
    """sm_scale: the default, ordinary, or special (0, tiny, negative, large)."""
    kind = rng.random()
    if kind < 0.4:
        return None
    if kind < 0.85:
        return rng.uniform(0.02, 0.5)
    return rng.choice(SPECIAL_SCALES)


def random_case(rng: random.Random, regimes: list[str], max_len: int, max_batch: int):
    """One DecodeCase; the regime cycles so every regime gets its share."""
    from gqa_decode_fuzz.generation.cases import DecodeCase

    lengths = tuple(random_length(rng, max_len) for _ in range(rng.randint(1, max_batch)))
    return DecodeCase(
        lengths=lengths, page_layout="shuffled", spare_pages=rng.randint(0, 64), pool_fill="nan",
        scale=random_scale(rng), values=rng.choice(regimes), seed=rng.randrange(2**32),
    )


def worst_ratios(output, lse, reference) -> tuple[float, float]:
    """The case's worst err/bound for output and LSE, as the property suite's comparison computes them."""
    from gqa_decode_fuzz.reference import check_against_reference

    output_check, lse_check = check_against_reference(output, lse, reference)
    return output_check.worst_ratio, lse_check.worst_ratio


def summarize(ratios: list[float]) -> list[str]:
    """Percentiles and max of a list of ratios, formatted."""
    values = torch.tensor(ratios, dtype=torch.float64)
    cells = [f"{torch.quantile(values, p / 100.0).item():.3g}" for p in PERCENTILES]
    return [*cells, f"{values.max().item():.3g}", str(int((values > 1).sum()))]


def print_table(results: list[dict]) -> None:
    """One row per regime and one for all cases: output, LSE, and either (the case's verdict)."""
    header = ["regime", "cases", "quantity", *[f"p{p:g}" for p in PERCENTILES], "max", "> 1"]
    rows = []
    regimes = sorted({r["regime"] for r in results})
    for regime in [*regimes, "all"]:
        chosen = [r for r in results if regime in ("all", r["regime"])]
        for quantity in ("output", "lse", "either"):
            ratios = [max(r["output"], r["lse"]) if quantity == "either" else r[quantity] for r in chosen]
            rows.append([regime, str(len(chosen)), quantity, *summarize(ratios)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths)))


FIELDS = ["index", "regime", "output", "lse", "case"]


def read_results(paths: list[Path]) -> list[dict]:
    """Rows of earlier runs' cases.csv files, ratios as floats."""
    results = []
    for path in paths:
        with open(path, newline="") as handle:
            results += [{**row, "output": float(row["output"]), "lse": float(row["lse"])}
                        for row in csv.DictReader(handle)]
    return results


def report(results: list[dict]) -> None:
    """The table, and the case closest to its bound."""
    print_table(results)
    worst = max(results, key=lambda r: max(r["output"], r["lse"]))
    print(f"worst case: output {worst['output']:.3g}, lse {worst['lse']:.3g}: {worst['case']}")


def run_cases(args: argparse.Namespace, device: torch.device, writer) -> list[dict]:
    """Run the implementation and the oracle on ``args.examples`` random cases; one result row per case."""
    from gqa_decode_fuzz.engine.target import load_impl
    from gqa_decode_fuzz.generation.cases import VALUE_REGIMES, build
    from gqa_decode_fuzz.reference import attend

    impl = load_impl(args.impl, root=ROOT)
    rng, regimes, results, start = random.Random(args.seed), list(VALUE_REGIMES), [], time.perf_counter()
    for index in range(args.examples):
        case = random_case(rng, regimes, args.max_len, args.max_batch)
        inputs = build(case, device)
        output, lse = impl(*inputs)
        output_ratio, lse_ratio = worst_ratios(output, lse, attend(*inputs))
        results.append({"index": index, "regime": case.values, "output": output_ratio, "lse": lse_ratio,
                        "case": repr(case)})
        if writer:
            writer.writerow(results[-1])
        if (index + 1) % 250 == 0:
            print(f"{index + 1} cases, {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        report(read_results(args.summarize))
        return 0
    from gqa_decode_fuzz.engine.target import DeviceError, resolve_device

    try:
        device = resolve_device(args.device)  # before any Triton kernel is imported
    except DeviceError as error:
        raise SystemExit(str(error)) from None
    examples, max_len, max_batch = DEVICE_DEFAULTS[device.type]
    args.examples, args.max_len = args.examples or examples, args.max_len or max_len
    args.max_batch = args.max_batch or max_batch
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        writer = None
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            writer = csv.DictWriter(stack.enter_context(open(args.out / "cases.csv", "w", newline="")), FIELDS)
            writer.writeheader()
        results = run_cases(args, device, writer)
    print(f"impl={args.impl} device={device} examples={args.examples} max_len={args.max_len} "
          f"max_batch={args.max_batch} seed={args.seed} time={time.perf_counter() - start:.0f}s")
    report(results)
    return 0

if __name__ == "__main__":
    sys.exit(main())
