"""``gqa-decode-fuzz merge-reports DIR...``: report parts written on many hosts merged into one report.

Each DIR is searched for report parts (``reports/<run>/parts-*.jsonl``) and case files, as a sweep's
jobs upload them. The merged run report (report.md, report.json, summary.png) goes to ``--out``, with
one set of root causes: probed again here with ``--impl`` on ``--device`` (run it where a GPU is), else
the hosts' own causes joined where their needs agree, and the report says no probes ran.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import CommandError

HELP = "merge report parts of many hosts into one report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``merge-reports``."""
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                        help="a folder holding report parts and case files (a job's downloaded artifact)")
    parser.add_argument("--out", type=Path, default=Path("reports/merged"), metavar="DIR",
                        help="where the merged report goes (default: reports/merged)")
    parser.add_argument("--impl", default=None, metavar="TARGET",
                        help="the implementation the parts ran: its failures are probed again into root causes "
                             "(default: none, the hosts' own causes are joined)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="where the probes run (with --impl; default auto: cuda when available)")
    parser.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                        help="with --impl, probe the failures (--no-probe: join the hosts' causes instead)")
    parser.add_argument("--run-id", default=None, help="the merged run's name (default: merged-<time>)")


def run(args: argparse.Namespace) -> int:
    """Merge; 0 once the report is written, 2 (one line on stderr) for parts that cannot be merged."""
    # here, not at the top: building the command line loads every subcommand, and this one imports torch
    from gqa_decode_fuzz.record import report_merge

    try:
        report = report_merge.merge_reports(args.dirs, args.out, impl=args.impl, device=args.device,
                                            probe=args.probe, run_id=args.run_id)
    except report_merge.MergeError as error:
        raise CommandError(str(error)) from None
    verdict = next((line for line in report.read_text(encoding="utf-8").splitlines() if line.startswith("**")), "")
    print(f"{verdict.strip('*')}\nreport: {report} (report.json, summary.png beside it)")
    return 0
