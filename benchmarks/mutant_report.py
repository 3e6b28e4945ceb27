"""Run the property suite (ci profile) against every corpus mutant and print one table row per mutant.

Columns: the mutant's defect class, its tier and the definition it runs under (``seed``: the seed's),
killed or not, the property that killed it, examples that property ran up to its
first failing one (explicit @examples included), seconds from the run's first example to its first failing one,
wall and CPU seconds of the whole subprocess (a few seconds of it are
imports; CPU time is the steadier figure on a shared machine), and the size of the
shrunk counterexample (batch, longest sequence).

    python benchmarks/mutant_report.py --device=cpu --jobs=2        # CPU: all but the GPU-only entries
    python benchmarks/mutant_report.py --device=cuda --gpu-only     # GPU: the GPU-only entries
    python benchmarks/mutant_report.py --list                       # the corpus, without running it

Exit status 1 when a selected mutant is not killed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.corpus import MUTANTS, SuiteRun, by_name, run_suite  # noqa: E402

COLUMNS = ("mutant", "class", "tier", "definition", "verdict", "killed by", "examples to 1st failure",
           "s to 1st failure", "wall s",
           "cpu s", "batch", "longest")


def _property_name(node_id: str) -> str:
    return node_id.split("::", 1)[-1]


def _cell(value) -> str:
    return "-" if value is None else str(value).replace("|", "\\|")  # a bare | would split the markdown cell


def _definition(mutant) -> str:
    return mutant.definition or "seed"


def row(run: SuiteRun) -> tuple[str, ...]:
    """One table row for one suite run."""
    return (
        _cell(run.mutant.name), _cell(run.mutant.defect_class), run.mutant.contract, _definition(run.mutant),
        run.verdict, _property_name(run.failed[0]) if run.failed else "-", _cell(run.examples_to_failure),
        _cell(run.first_example_to_failure), f"{run.seconds:.1f}", _cell(run.cpu_seconds), _cell(run.batch),
        _cell(run.longest),
    )


def markdown_table(rows: list[tuple[str, ...]]) -> str:
    """A GitHub-flavoured markdown table with ``COLUMNS`` as its header."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def findings(runs: list[SuiteRun], max_batch: int) -> list[str]:
    """Lines naming every mutant that survived, errored, or shrank to more than ``max_batch`` sequences."""
    notes = []
    for run in runs:
        if not run.killed:
            tail = run.output.strip().splitlines()[-1:] or [""]
            notes.append(f"- {run.mutant.name}: {run.verdict} ({run.mutant.rationale}); last line: {tail[0]}")
        elif run.batch is not None and run.batch > max_batch:
            notes.append(f"- {run.mutant.name}: shrunk only to lengths={run.shrunk_lengths}")
    return notes


def medians(killed: list[SuiteRun]) -> str:
    """The killed runs' medians: seconds from the first example to the first failure, and of the whole run."""
    if not killed:
        return "no kill to take medians of"
    to_failure = [run.first_example_to_failure for run in killed if run.first_example_to_failure is not None]
    first = f"{statistics.median(to_failure):.2f} s" if to_failure else "-"
    return (f"medians over {len(killed)} kills: {first} from the first example to the first failure, "
            f"{statistics.median(run.seconds for run in killed):.1f} s of pytest wall time "
            f"(range {min(run.seconds for run in killed):.1f}-{max(run.seconds for run in killed):.1f} s)")


def corpus_listing() -> str:
    """The corpus as a markdown table: name, class, tier, definition, where it is killed, rationale."""
    lines = ["| mutant | class | tier | definition | killed on | rationale |", "|---|---|---|---|---|---|"]
    lines += [f"| {m.name} | {m.defect_class} | {m.contract} | {_definition(m)} | {'GPU' if m.gpu_only else 'CPU'} | "
              f"{_cell(m.rationale)} |" for m in MUTANTS]
    return "\n".join(lines)


def select(names: list[str], gpu_only: bool, device: str) -> list:
    """The mutants to run: named ones, else the GPU-only ones, else all that the device can kill."""
    if names:
        return [by_name(name) for name in names]
    if gpu_only:
        return [m for m in MUTANTS if m.gpu_only]
    return [m for m in MUTANTS if device == "cuda" or not m.gpu_only]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="MUTANT", help="run only these mutants")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="passed to the suite")
    parser.add_argument("--gpu-only", action="store_true", help="run only the GPU-only mutants")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at the same time (default 1)")
    parser.add_argument("--no-shrink", action="store_true",
                        help="skip shrinking, as tests/test_mutants.py does (faster; counterexamples not minimal)")
    parser.add_argument("--generated-only", action="store_true",
                        help="skip the suite's pinned @examples: what generated examples find alone")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mutant")
    parser.add_argument("--max-batch", type=int, default=2, help="flag killed mutants shrunk to a larger batch")
    parser.add_argument("--markdown", type=Path, help="also write the table and findings to this file")
    parser.add_argument("--list", action="store_true", help="print the corpus (no runs) and exit")
    args = parser.parse_args(argv)
    if args.list:
        print(corpus_listing())
        return 0
    if args.jobs < 1:
        parser.error(f"--jobs={args.jobs}: must be at least 1")
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    mutants = select(args.names, args.gpu_only, device)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gqa-mutants-") as workdir, ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_suite, m, Path(workdir), device=device, shrink=not args.no_shrink,
                               explicit=not args.generated_only, timeout=args.timeout) for m in mutants]
        for future in as_completed(futures):  # progress, in case a long run is cut short
            print(" | ".join(row(future.result())), file=sys.stderr, flush=True)
        runs = [future.result() for future in futures]
    table = markdown_table([row(run) for run in runs])
    killed = sum(run.killed for run in runs)
    summary = (f"{killed} / {len(runs)} killed on {device} in {time.perf_counter() - started:.0f} s wall "
               f"({args.jobs} at a time{', without shrinking' if args.no_shrink else ''}"
               f"{', generated examples only' if args.generated_only else ''})")
    notes = findings(runs, args.max_batch)
    text = "\n".join([table, "", summary, medians([run for run in runs if run.killed]), *notes])
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0 if killed == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
