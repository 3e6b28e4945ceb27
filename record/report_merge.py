"""Report parts written on many hosts merged into one run report, with one set of root causes.

A sweep on a fleet runs the suite on many hosts (a CI matrix: entries x definitions x shards);
each host writes ``reports/<run>/parts-<host>-<worker>-<pid>.jsonl`` and its case files under
``failures/``. ``merge_reports`` gathers every part file under the directories it is given,
finds each case file where it now lies (by its name: a host's absolute path means nothing on
the merging machine), names each property by its definition where the parts span several (a
host that ran one definition leaves it out of its node ids), and writes the lines into the
output directory as parts of one run. The report is then drawn by the writer one host's run
uses (``run_report.write_report``), and the causes grouped by the same code
(``causes.failures_of_run`` and ``causes.grouped``):

- with an implementation (``impl``), every failure is probed again here, on ``device``: one
  grouping over all hosts' failures, as one host's run does for its own;
- without one, the causes each host's own probes found (its ``causes.json``) are joined where
  their needs agree, and a failure no host grouped is a cause of its own; the report says the
  merge ran no probes.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import torch

from gqa_decode_fuzz.engine import isolation, knobs
from gqa_decode_fuzz.engine.containment import Guard
from gqa_decode_fuzz.engine.examples import property_name
from gqa_decode_fuzz.engine.guarded import guarded_impl
from gqa_decode_fuzz.engine.isolated_impl import load_target_for
from gqa_decode_fuzz.engine.target import DEFAULT_IMPL, resolve_device

from . import causes, run_report
from .casefiles import replay_command

__all__ = ["MergeError", "merge_reports"]

_REQUIRED = ("nodeid", "property", "examples")
_FAILING = ("failed", "crashed")


class MergeError(ValueError):
    """Parts that cannot be merged; the message names the directory, file or line."""


# ---- gathering ------------------------------------------------------------------------------


def part_files(directories: Iterable[Path]) -> list[Path]:
    """Every ``parts-*.jsonl`` under ``directories`` (each once, however the directories overlap)."""
    found: dict[Path, Path] = {}
    for directory in directories:
        if not directory.is_dir():
            raise MergeError(f"DIR={str(directory)!r}: no such directory")
        parts = sorted(directory.rglob("parts-*.jsonl"))
        if not parts:
            raise MergeError(f"DIR={str(directory)!r}: holds no report parts (reports/<run>/parts-*.jsonl)")
        for part in parts:
            found.setdefault(part.resolve(), part)
    return sorted(found.values())


def read_part(path: Path) -> list[dict]:
    """A part file's lines; a line that is not a part line is an error naming the file and line."""
    lines = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as error:
            raise MergeError(f"{path}:{number}: not a JSON line ({error.msg})") from None
        missing = [key for key in _REQUIRED if not isinstance(line, dict) or key not in line]
        if missing:
            raise MergeError(f"{path}:{number}: not a report part line (no {', '.join(missing)})")
        lines.append(line)
    return lines


def case_files(directories: Iterable[Path]) -> dict[str, list[Path]]:
    """The case files (``*.pt``) under ``directories``, by file name."""
    found: dict[str, list[Path]] = {}
    for directory in directories:
        for path in sorted(directory.rglob("*.pt")):
            found.setdefault(path.name, []).append(path.resolve())
    return found


def _relocated(case_file: str | None, part: Path, found: dict[str, list[Path]]) -> str | None:
    """Where a part's case file lies now: found by its name under the merged directories (where two jobs' files
    share a name, the one nearest the part: its own job's folder), else as written."""
    if not case_file:
        return None
    here = found.get(Path(case_file).name)
    if not here:
        return case_file
    part = part.resolve()
    return str(max(here, key=lambda path: len(os.path.commonpath([path, part]))))


_PARAMETERS = re.compile(r"\[(.*)\]$")


def qualified(nodeid: str, definition: str | None) -> str:
    """``nodeid`` naming ``definition`` among its parameters (as a run of several definitions names it)."""
    if not definition:
        return nodeid
    found = _PARAMETERS.search(nodeid)
    if found is None:
        return f"{nodeid}[{definition}]"
    if definition in found[1].split("-"):
        return nodeid
    return f"{nodeid[:found.start()]}[{found[1]}-{definition}]"


class Gathered:
    """The parts under some directories: each line with its case file relocated and its node id qualified by its
    definition where the lines span several; each run directory's own causes; and each line's part file name."""

    def __init__(self, directories: list[Path]) -> None:
        self.files = part_files(directories)
        found = case_files(directories)
        read = {path: read_part(path) for path in self.files}
        definitions = {line.get("definition") for lines in read.values() for line in lines}
        several = len(definitions - {None}) > 1
        self.lines: list[tuple[Path, dict]] = []
        self.renamed: dict[tuple[Path, str], str] = {}  # (run directory, property as its host named it) -> merged
        for path, lines in read.items():
            for line in lines:
                nodeid = qualified(line["nodeid"], line.get("definition")) if several else line["nodeid"]
                merged = {**line, "nodeid": nodeid, "property": property_name(nodeid),
                          "case_file": _relocated(line.get("case_file"), path, found),
                          "worker": f"{line.get('host') or path.parent.name}/{line.get('worker', '?')}"}
                self.renamed[(path.parent, line["property"])] = merged["property"]
                self.lines.append((path, merged))
        self.run_dirs = sorted({path.parent for path in self.files})

    def host_causes(self) -> list[tuple[Path, dict]]:
        """Each run directory's ``causes.json`` (its host's own probes), where it has one."""
        return [(run, saved) for run in self.run_dirs if (saved := causes.load(run))]

    def write_parts(self, out: Path) -> None:
        """The lines as part files of ``out``, one per part file read (names kept; a name met twice numbered)."""
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("parts-*.jsonl"):
            stale.unlink()
        names: dict[Path, str] = {}
        for path in self.files:
            name = path.name
            while name in names.values():
                name = f"{path.stem}-{len(names)}.jsonl"
            names[path] = name
        for path, line in self.lines:
            with open(out / names[path], "a", encoding="utf-8") as part:
                part.write(json.dumps(line) + "\n")


# ---- causes ---------------------------------------------------------------------------------


def failures(gathered: Gathered, isolated: bool = True, knobs: tuple[str, ...] = ()) -> list[causes.Failure]:
    """The merged run's failures, as one host's run finds its own (``causes.failures_of_run``): the failing lines'
    case files, the smallest first, stand for the run's case-file index."""
    failing = [line for _, line in gathered.lines if run_report.item_outcome(line) in _FAILING]
    index = sorted(({"nodeid": line["nodeid"], "path": line["case_file"], "error": line.get("error") or "",
                     "claim": line.get("claim")}
                    for line in failing if line.get("case_file")),
                   key=lambda entry: (_size(entry["path"]), entry["nodeid"]))
    return causes.failures_of_run(index, [line["nodeid"] for line in failing], isolated=isolated, knobs=knobs)


def _size(path: str) -> float:
    try:
        return os.path.getsize(path)
    except OSError:
        return float("inf")


NOT_PROBED = ("not run by merge-reports (no --impl): the causes are each host's own probes', joined where their "
              "needs agree")


def joined_host_causes(gathered: Gathered, found: list[causes.Failure]) -> dict:
    """Without probes: the hosts' own causes, renamed as merged, one cause per distinct list of needs; a failure
    that no host grouped is a cause of its own (``causes.grouped`` with a prober that runs none)."""
    joined: list[dict] = []
    by_needs: dict[tuple, dict] = {}
    for run, saved in gathered.host_causes():
        for cause in saved["causes"]:
            cause = _renamed(cause, run, gathered)
            key = tuple(cause["needs"])
            if key and key in by_needs:
                _join(by_needs[key], cause, run)
                continue
            joined.append(cause)
            if key:
                by_needs[key] = cause
    grouped = {prop for cause in joined for prop in cause["properties"]}
    rest = [failure for failure in found if failure.prop not in grouped]
    idle = causes.Prober(impl=None, device=None, contract="", stopped=NOT_PROBED)
    alone = causes.grouped(rest, idle)["causes"] if rest else []
    return {"causes": joined + alone,
            "probes": {"tried": [], "used": 0, "limit": 0, "seconds": 0.0, "seconds_limit": 0.0,
                       "stopped": NOT_PROBED}}


def _renamed(cause: dict, run: Path, gathered: Gathered) -> dict:
    def name(prop: str) -> str:
        return gathered.renamed.get((run, prop), prop)

    return {**cause, "properties": [name(prop) for prop in cause["properties"]],
            "representative": {**cause["representative"], "property": name(cause["representative"]["property"])},
            "members": [{**member, "property": name(member["property"])} for member in cause["members"]]}


def _join(into: dict, other: dict, run: Path) -> None:
    """``other`` (another host's cause with the same needs) joins ``into``."""
    why = f"the same needs, found by the probes of run {run.name}"
    for failure in [other["representative"], *other["members"]]:
        if failure["property"] not in into["properties"]:
            into["properties"].append(failure["property"])
            into["members"].append({**failure, "joined": why})


def probed_causes(gathered: Gathered, impl_spec: str, device: str, contract: str) -> dict:
    """Every failure probed again here through ``impl_spec`` on ``device``, as a run probes its own: the
    implementation loaded as the suite loads it (in a child process unless it is this project's kernel)."""
    where = resolve_device(device)
    isolated = isolation.isolated("auto", impl_spec, DEFAULT_IMPL)
    target = load_target_for(impl_spec, Path.cwd(), where.type, isolated=isolated)
    guard = Guard(where, save=lambda message: None, nodeid=lambda: None, in_worker=False, replay=replay_command)
    impl = guarded_impl(target, guard, lambda args, kwargs: None, knobs.KnobDraws(target.knobs), isolated=isolated)
    release = torch.cuda.empty_cache if where.type == "cuda" else (lambda: None)
    found = failures(gathered, isolated, tuple(target.knobs))
    prober = causes.Prober(impl, where, contract, budget=causes.Budget.for_failures(len(found)), release=release,
                           knob_defaults=knobs.defaults(target.knobs))
    try:
        return causes.grouped(found, prober)
    finally:
        if callable(getattr(target.function, "close", None)):
            target.function.close()


# ---- the merge ------------------------------------------------------------------------------


def merge_reports(directories: list[Path], out: Path, *, impl: str | None = None, device: str = "auto",
                  probe: bool = True, run_id: str | None = None) -> Path:
    """Merge the parts under ``directories`` into one report in ``out`` (report.md, report.json, summary.png,
    causes.json, and the merged parts); return report.md's path. ``impl``: probe the failures again through it on
    ``device`` (``probe=False``: group them as the hosts did, as without ``impl``)."""
    gathered = Gathered(directories)
    run_id = run_id or "merged-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    gathered.write_parts(out)
    (out / causes.FILE_NAME).unlink(missing_ok=True)
    contract = run_report.run_tier(run_report.merge(out))
    found = failures(gathered)
    if found:
        saved = (probed_causes(gathered, impl, device, contract if contract in ("correct", "strict") else "correct")
                 if impl and probe
                 else joined_host_causes(gathered, found))
        causes.save(out, saved)
    report = run_report.write_report(out, run_id)
    if report is None:
        raise MergeError(f"the parts under {', '.join(map(str, directories))} hold no property")
    return report
