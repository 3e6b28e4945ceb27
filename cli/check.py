"""gqa-decode-fuzz check TARGET: the property suite's verdict on one implementation, for a loop to call.

TARGET is a FlashInfer-Bench Solution file (``solution.json``), ``path/to/file.py:function`` or
``package.module:function``. The suite runs in a pytest subprocess with the implementation isolated in a child
process of its own, within ``--time-budget``; its run report, root causes and case files are read back from the
folders this command names for it, and each root cause's minimal case is written as a FlashInfer-Bench
workload. Exit status: 0 pass, 1 fail, 2 error (one line on stderr says what). See docs/loops.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gqa_decode_fuzz.engine import solutions, target
from gqa_decode_fuzz.reference import definitions

from . import ERROR, CommandError

HELP = "run the property suite on one implementation and print its verdict (exit 0 pass, 1 fail, 2 error)"
EXIT = {"pass": 0, "fail": 1, "error": ERROR}
PROBE_ALLOWANCE_S = 600  # past --time-budget: the tests in flight (their shrinks: 10 s) and the cause probes (30 s)
_FAILING = ("failed", "crashed")
_DATABASE_ENVS = ("GQA_DECODE_REDIS_URL", "GQA_DECODE_NIGHTLY_REPO")  # shared databases: not replayed by a check
# What reads the verdict back (case files, workloads) imports torch: loaded while the suite runs, not before it.
_VERDICT_MODULE = "gqa_decode_fuzz.cli.workload_export"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``check``."""
    parser.add_argument("target", metavar="TARGET",
                        help="solution.json, path/to/file.py:function or package.module:function")
    parser.add_argument("--definition", help="a built-in definition's name, path/to/definition.json, a comma-"
                        "separated list or all (default: the Solution file's own, else the seed's)")
    parser.add_argument("--time-budget", type=int, default=None, metavar="SECONDS",
                        help="start no property after SECONDS (the one in flight finishes, its shrink cut; the "
                        "root-cause probes keep within SECONDS, or 30 s past it)")
    parser.add_argument("--shrink-limit", type=int, default=None, metavar="SECONDS",
                        help="shrink each failure for at most SECONDS, then report the smallest found by then")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the verdict as JSON here")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed: the same seed, the same examples "
                        "(default 0; the ci profile is derandomized and draws the same examples whatever the seed)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--profile", default="dev", help="Hypothesis profile: dev, ci, gpu, nightly (default dev)")
    parser.add_argument("--examples", type=int, default=None, metavar="N", help="examples per property")
    parser.add_argument("--contract", choices=("auto", "correct", "strict"), default="auto")
    parser.add_argument("--first-failure", action="store_true",
                        help="stop at the first failing property (pytest -x): the fastest fail verdict, one cause")
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPRESSION", help="pytest -k: which properties")
    parser.add_argument("--out", type=Path, default=Path("gqa-decode-check"), metavar="DIR",
                        help="where each check's folder goes: case files, run report, workloads (default "
                             "./gqa-decode-check)")


def _problem(error: Exception) -> CommandError:
    return CommandError(str(error).strip().splitlines()[0])


def _definitions(args: argparse.Namespace, solution: Any) -> list[str]:
    """The definitions the run will test, checked here (an unknown one is exit 2 before pytest starts)."""
    if args.definition is None:
        return [solution.definition if solution is not None else definitions.SEED_NAME]
    try:
        return [definition.name for definition in definitions.select(args.definition, root=Path.cwd())]
    except definitions.DefinitionError as error:
        raise _problem(error) from None


def _target(text: str) -> tuple[str, Any]:
    """TARGET with its file made absolute (the run's folder is not this one), checked for form without importing
    it; and its Solution, where it is one."""
    file, sep, attribute = text.rpartition(":")
    if text.endswith(".json") and ":" not in Path(text).name:
        spec = str(Path(text).resolve())
    elif sep and file.endswith(".py"):
        spec = f"{Path(file).resolve()}:{attribute}"
    else:
        spec = text
    try:
        target.check_spec(spec, root=Path.cwd(), find=False)
        solution = solutions.read_solution(spec) if spec.endswith(".json") else None
    except target.ImplSpecError as error:
        raise _problem(error) from None
    return spec, solution


def _pytest_command(args: argparse.Namespace, spec: str, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "gqa_decode_fuzz.properties",
               f"--impl={spec}", "--isolation=on", f"--device={args.device}", f"--contract={args.contract}",
               f"--hypothesis-profile={args.profile}", f"--hypothesis-seed={args.seed}",
               f"--run-report={run_dir / 'reports'}", f"--failures-dir={run_dir / 'failures'}"]
    command += [f"--definition={args.definition}"] if args.definition else []
    command += [f"--time-budget={args.time_budget}"] if args.time_budget else []
    command += [f"--shrink-limit={args.shrink_limit}"] if args.shrink_limit else []
    command += [f"--max-examples={args.examples}"] if args.examples else []
    command += ["-k", args.keyword] if args.keyword else []
    command += ["-x", "--report-picture=off"] if args.first_failure else []  # the fastest verdict: no drawing
    return command + list(args.passthrough)


def _environment(run_dir: Path) -> dict[str, str]:
    """This environment with an example database of the check's own (empty: the same seed, the same examples)."""
    env = {name: value for name, value in os.environ.items() if name not in _DATABASE_ENVS}
    env["GQA_DECODE_DATABASE_DIR"] = str(run_dir / "database")
    return env


def _run_suite(args: argparse.Namespace, spec: str, run_dir: Path) -> int:
    """Run the suite; pytest's exit status. The verdict's reader is imported meanwhile (torch: seconds)."""
    limit = (args.time_budget or 0) + PROBE_ALLOWANCE_S if args.time_budget else None
    with open(run_dir / "pytest.log", "w", encoding="utf-8") as log:
        # in the caller's folder, as pytest run there: a target's own imports resolve as they do for the caller
        with subprocess.Popen(_pytest_command(args, spec, run_dir), env=_environment(run_dir), stdout=log,
                              stderr=subprocess.STDOUT, text=True) as suite:
            try:
                importlib.import_module(_VERDICT_MODULE)
                return suite.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                suite.kill()
                raise CommandError(f"the suite ran past --time-budget plus {PROBE_ALLOWANCE_S} s and was stopped; "
                                   f"its output: {run_dir / 'pytest.log'}") from None
            except BaseException:  # Ctrl-C or a failed import: the suite does not outlive this command
                suite.kill()
                raise


def _report_dir(run_dir: Path) -> Path | None:
    found = [path for path in (run_dir / "reports").glob("*") if (path / "report.json").is_file()]
    return found[0] if len(found) == 1 else None


def _usage_error(run_dir: Path) -> str:
    """The message pytest gave for a run it refused (``ERROR: ...``), else the log's last line."""
    lines = [line for line in (run_dir / "pytest.log").read_text(encoding="utf-8").splitlines() if line.strip()]
    said = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR: ")]
    return said[0] if said else (lines[-1] if lines else "pytest said nothing")


def _causes(report: dict, entries: dict, trace_set: Path) -> list[dict]:
    """Per root cause (``causes.json``; a failing property without one is a cause of its own): summary, the
    properties it fails, its case file, replay command, error, whether its shrink was cut, and the minimal case as
    a workload."""
    found = (report.get("causes") or {}).get("causes")
    if found is None:
        found = [{"summary": entry.get("error") or "failed", "properties": [name],
                  "representative": {"case_file": entry.get("case_file"), "error": entry.get("error"),
                                     "case": None, "definition": None}}
                 for name, entry in entries.items() if entry["verdict"] in _FAILING]
    from gqa_decode_fuzz.record.casefiles import replay_command  # both imported while the suite ran (_run_suite)

    from .workload_export import export

    result = []
    for cause in found:
        rep = cause["representative"]
        case_file = rep.get("case_file")
        workload = export(case_file, trace_set) if case_file else {"omitted": "no case file was saved"}
        cut = next((entry.get("shrink_cut") for entry in entries.values()
                    if case_file and entry.get("case_file") == case_file), None)
        result.append({"summary": cause["summary"], "properties": cause["properties"], "case": rep.get("case"),
                       "definition": rep.get("definition") or workload.get("line", {}).get("definition"),
                       "error": rep.get("error"), "shrink_cut": cut, "case_file": case_file,
                       "replay": replay_command(case_file) if case_file else None, "workload": workload})
    return result


def _verdict(returncode: int, entries: dict) -> str:
    if any(entry["verdict"] in _FAILING for entry in entries.values()):
        return "fail"
    if returncode == 0 and entries and all(entry["verdict"] in ("passed", "skipped") for entry in entries.values()):
        return "pass"
    return "error"


def _result(args, definitions: list[str], run_dir: Path, returncode: int, seconds: float) -> dict:
    """What the run's report says, as the JSON ``--json`` writes."""
    directory = _report_dir(run_dir)
    if directory is None:
        raise CommandError(f"the suite wrote no run report (pytest exit {returncode}): {_usage_error(run_dir)}")
    report = json.loads((directory / "report.json").read_text(encoding="utf-8"))
    run = json.loads((directory / "run.json").read_text(encoding="utf-8"))
    entries = {name: entry for name, entry in report.items() if name != "causes"}
    verdict = _verdict(returncode, entries)
    return {
        "verdict": verdict, "target": args.target, "definitions": definitions, "seed": args.seed,
        "profile": args.profile, "device": args.device, "tier": run["tier"], "summary": run["verdict"],
        "examples": sum(entry["examples"] for entry in entries.values()),
        "properties": {v: sum(entry["verdict"] == v for entry in entries.values())
                       for v in ("passed", "failed", "crashed", "error", "skipped")},
        "unstarted": sum(entry.get("unstarted_shards", 0) for entry in entries.values()),
        "seconds": round(seconds, 2), "pytest_exit": returncode, "report": str(directory / "report.md"),
        "log": str(run_dir / "pytest.log"),
        "causes": _causes(report, entries, run_dir / "trace_set") if verdict == "fail" else [],
    }


def screen(result: dict) -> list[str]:
    """The verdict in a screenful: the line, then each root cause with its replay and workload."""
    lines = [f"{result['verdict'].upper()}: {result['summary']} ({result['examples']} examples, "
             f"{result['seconds']} s, tier {result['tier']}, definition {', '.join(result['definitions'])})"]
    if result["unstarted"]:
        lines.append(f"  {result['unstarted']} items not started: the time budget was spent")
    for number, cause in enumerate(result["causes"][:8], 1):
        lines.append(f"{number}. {cause['summary']} ({len(cause['properties'])} properties)")
        if cause["replay"]:
            lines.append(f"   replay: {cause['replay']}")
        workload = cause["workload"]
        lines.append(f"   workload: {workload.get('jsonl', 'none')} (uuid {workload['uuid']})" if "uuid" in workload
                     else f"   workload: none ({workload['omitted']})")
    if len(result["causes"]) > 8:
        lines.append(f"... {len(result['causes']) - 8} more causes in the JSON")
    lines.append(f"report: {result['report']}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Check the target; print the verdict, write ``--json`` (``{"verdict": "error", "error": ...}`` where the
    check could not run); the exit status of the verdict."""
    try:
        result = _check(args)
    except CommandError as error:
        _write_json(args.json, {"verdict": "error", "error": str(error), "target": args.target})
        raise
    _write_json(args.json, result)
    print("\n".join(screen(result)))
    return EXIT[result["verdict"]]


def _write_json(path: Path | None, result: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def _check(args: argparse.Namespace) -> dict:
    spec, solution = _target(args.target)
    definitions = _definitions(args, solution)
    for flag, seconds in (("--time-budget", args.time_budget), ("--shrink-limit", args.shrink_limit)):
        if seconds is not None and seconds < 1:
            raise CommandError(f"{flag}={seconds}: expected a positive number of seconds")
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="check-", dir=args.out)).resolve()
    start = time.monotonic()
    returncode = _run_suite(args, spec, run_dir)
    # 2 is pytest's "interrupted", which -x under xdist also gives once a property fails
    stopped_at_first = args.first_failure and returncode == 2
    if returncode not in (0, 1) and not stopped_at_first:  # refused, interrupted, internal error, none
        raise CommandError(f"pytest exit {returncode}: {_usage_error(run_dir)}")
    return _result(args, definitions, run_dir, returncode, time.monotonic() - start)
