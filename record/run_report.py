"""The run report: the verdict first, then what each property ran on and how close to the bound it came.

Each process (an xdist worker, or pytest itself without xdist) tallies every case a
test builds, every example it runs and the worst err/bound Hypothesis was told about
(``target``), and
appends one JSON line per test item to ``reports/<run>/parts-*.jsonl`` with the
item's outcome, tier, case file and error. At session end the controller merges the
lines per property (shards together) into ``report.md``, ``report.json`` and one PNG
summary; both lead with the verdict (a failing run never looks green). Under MPS the
controller first replays each crash alone (``mps``): a crash whose case passed alone is
merged as an error, not as a crash of its property.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypothesis.errors import HypothesisException

from gqa_decode_fuzz.engine import isolation
from gqa_decode_fuzz.engine.examples import example_targets, property_name
from gqa_decode_fuzz.generation.stages import COLUMNS, SAMPLE_EVERY, StageClock, split_line, summarise, summarise_split
from gqa_decode_fuzz.record import causes, mps
from gqa_decode_fuzz.record.casefiles import replay_command

if TYPE_CHECKING:
    from gqa_decode_fuzz.generation.case_types import Case

__all__ = ["ItemCounter", "Tally", "merge", "verdict_line", "warm_up", "write_report"]

# Bucket edges (upper bounds, inclusive) and labels: what "covered" means at a glance.
_BUCKETS = {
    "batch": ([0, 1, 4, 16, 64], ["0", "1", "2-4", "5-16", "17-64", ">64"]),
    "length": ([0, 1, 16, 128, 1024, 8192], ["0", "1", "2-16", "17-128", "129-1024", "1025-8192", ">8192"]),
    "pool pages": ([16, 256, 4096, 65536], ["<=16", "17-256", "257-4096", "4097-65536", ">65536"]),
    "worst err/bound": ([0.01, 0.1, 0.5, 1.0], ["<=0.01", "0.01-0.1", "0.1-0.5", "0.5-1", ">1 (fail)"]),
}
_BUCKETS["query length"] = _BUCKETS["length"]  # causal prefill: queries per sequence ("length" counts its keys)
DIMENSIONS = ("batch", "length", "query length", "prefill sequence", "empty", "pool pages", "page layout",
              "pool fill", "scale", "values", "q layout", "kv layout", "index layout", "worst err/bound")
_WORST_LABEL = re.compile(r"err/bound|worst", re.IGNORECASE)


def bucket(dimension: str, value: float) -> str:
    """The label of the bucket ``value`` falls in for a numeric dimension."""
    edges, labels = _BUCKETS[dimension]
    return labels[bisect.bisect_left(edges, value)]


def _scale_kind(scale: float | None) -> str:
    if scale is None:
        return "default"
    if scale == 0:
        return "zero"
    if scale < 0:
        return "negative"
    return "tiny (<1e-3)" if scale < 1e-3 else "ordinary (<=1)" if scale <= 1 else "large (>1)"


@dataclass
class Tally:
    """Counts for one test item."""

    nodeid: str = ""
    cases: int = 0
    sequences: int = 0
    examples: int = 0
    failed_examples: int = 0
    worst: float | None = None
    seconds: float = 0.0
    counts: dict[str, Counter] = field(default_factory=lambda: {d: Counter() for d in DIMENSIONS})
    stages: dict[str, Any] = field(default_factory=dict)  # StageClock.take(): a row of ms per sampled example

    def add_case(self, case: Case, pool_pages: int | None) -> None:
        lengths = case.lengths
        self.cases += 1
        self.sequences += len(lengths)
        self.counts["batch"][bucket("batch", len(lengths))] += 1
        for length in lengths:
            self.counts["length"][bucket("length", length)] += 1
        for q_len in getattr(case, "q_lens", ()):
            self.counts["query length"][bucket("query length", q_len)] += 1
        for kind in case.sequence_kinds() if hasattr(case, "sequence_kinds") else ():
            self.counts["prefill sequence"][kind] += 1
        empty = sum(1 for n in lengths if n == 0)
        self.counts["empty"]["none" if not empty else "all" if empty == len(lengths) else "some"] += 1
        if pool_pages is not None:
            self.counts["pool pages"][bucket("pool pages", pool_pages)] += 1
        self.counts["scale"][_scale_kind(case.scale)] += 1
        for dimension, choice in case.choices().items():
            self.counts[dimension][choice] += 1

    def add_observation(self, status: str, targets: dict[str, float]) -> None:
        if status == "gave_up":
            return
        self.examples += 1
        self.failed_examples += status == "failed"
        for label, value in targets.items():
            if _WORST_LABEL.search(label) and math.isfinite(value):
                self.worst = value if self.worst is None else max(self.worst, value)
                self.counts["worst err/bound"][bucket("worst err/bound", value)] += 1

    def as_json(self) -> dict:
        return {"nodeid": self.nodeid, "property": property_name(self.nodeid), "cases": self.cases,
                "sequences": self.sequences, "examples": self.examples, "failed_examples": self.failed_examples,
                "worst": self.worst, "seconds": self.seconds, "stages": self.stages,
                "counts": {d: dict(c) for d, c in self.counts.items()}}


class ItemCounter:
    """Counts what the running test item builds and what Hypothesis reports of it, one item at a time;
    the plugin owns one per process and flushes it to the part file when the item ends."""

    def __init__(self, clock: StageClock | None = None) -> None:
        self.tally = Tally()
        self.clock = clock or StageClock()

    def begin(self, nodeid: str) -> None:
        """Start counting for a new test item."""
        self.tally = Tally(nodeid=nodeid)
        self.clock.begin_item(property_name(nodeid))

    def observe_case(self, case: Case, inputs: Any) -> None:
        """Count a built case; also label it for ``--hypothesis-show-statistics``."""
        pool = getattr(getattr(inputs, "k_cache", None), "shape", (None,))[0]
        self.tally.add_case(case, pool)
        try:
            from hypothesis import event
            from hypothesis.control import currently_in_test_context

            if currently_in_test_context():
                event(f"batch {bucket('batch', case.batch)}")
                event(f"longest sequence {bucket('length', max(case.lengths, default=0))}")
                event(f"page layout {case.page_layout}, values {case.values}")
        except ImportError:  # an old Hypothesis: statistics go without these labels
            pass

    def counting(self, inner: Callable) -> Callable:
        """``inner`` (a Hypothesis test's body, see ``shards.wrapping_examples``) counting each example it runs,
        each that fails and the targets it reported.

        Counted here rather than through Hypothesis's observability callbacks: those describe every
        test case in full and cost more than the rest of the suite's work (docs/gpu.md section 14).
        An example rejected by ``assume`` is not counted.
        """

        @functools.wraps(inner)
        def counted(*args, **kwargs):
            status = "failed"
            try:
                result = inner(*args, **kwargs)
                status = "passed"
                return result
            except HypothesisException:
                status = "gave_up"
                raise
            except Exception:
                raise
            except BaseException:  # a skip (a stopped shard), an interrupt: no verdict on the example
                status = "stopped"
                raise
            finally:
                if status != "stopped":  # the worst err/bound is over passing examples
                    self.tally.add_observation(status, example_targets() if status == "passed" else {})

        return counted

    def flush(self, directory: Path, worker: str, seconds: float, gpu: str | None = None, *,
              outcome: str | None = None, tier: str | None = None, case_file: str | os.PathLike | None = None,
              error: str | None = None, started: float | None = None, definition: str | None = None,
              claim: str | None = None, shrink_cut: str | None = None) -> None:
        """Append the current item's tally to this process's part file, with the worker, its GPU and the outcome.

        ``outcome`` is one of ``OUTCOMES`` (None: inferred at merge from the failing examples); ``tier`` the
        contract tier that ran; ``case_file`` the saved counterexample; ``error`` the failure message (only its
        first line is kept); ``started`` the item's start in epoch seconds (default: now minus ``seconds``);
        ``definition`` the definition it ran under; ``claim`` its property's claim (a reference, ``module:name``);
        ``shrink_cut`` why its failure's shrink was cut short (``runner/shrink_limit.py``), if it was.
        The part file is named by host (``host_tag``), worker and process, so parts of one sweep's hosts never
        collide where they are gathered.
        An item that built no case is not written, unless it has an outcome other than "passed" (a skipped,
        stopped or crashed item may build none).
        """
        tally = self.tally
        tally.seconds, tally.stages = seconds, self.clock.take()
        if not tally.cases and outcome in (None, "passed"):
            return  # built no case: not a property of the suite
        if outcome is not None and outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        line = {**tally.as_json(), "worker": worker, "gpu": gpu, "outcome": outcome, "tier": tier,
                "case_file": None if case_file is None else str(case_file), "error": _first_line(error),
                "started": time.time() - seconds if started is None else started, "host": host_tag(),
                "definition": definition, "claim": claim, "shrink_cut": shrink_cut}
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / f"parts-{host_tag()}-{worker}-{os.getpid()}.jsonl", "a", encoding="utf-8") as part:
            part.write(json.dumps(line) + "\n")


HOST_TAG_ENV = "GQA_DECODE_HOST_TAG"


def host_tag() -> str:
    """This host's name in part files: ``GQA_DECODE_HOST_TAG`` (a CI job's id), else the host name; only letters,
    digits, dots and dashes (a part's file name holds it)."""
    tag = os.environ.get(HOST_TAG_ENV) or socket.gethostname() or "host"
    return re.sub(r"[^A-Za-z0-9.-]+", "-", tag).strip("-") or "host"


# ---- outcomes and verdicts ------------------------------------------------------------------

# "error": no verdict on the kernel: the suite itself could not run the item (it could not allocate its own inputs),
# or, under MPS, the item crashed but its case passed when replayed alone (``mps.COLLATERAL``).
# "unstarted": the run's --time-budget was spent before the item started (``UNSTARTED`` in its skip reason).
OUTCOMES = ("passed", "failed", "crashed", "skipped", "stopped", "error", "unstarted")
UNSTARTED = "not started: the run's --time-budget was spent"
# A property's verdict is the worst of its items' outcomes. A stopped shard counts as failed: it stopped
# because a sibling failed (even when that sibling's line is missing, e.g. its worker died first); as an error
# when the sibling's crash turned out not to be the kernel's (``_finish``).
VERDICTS = ("crashed", "failed", "error", "passed", "skipped")  # worst first: the table's order
_VERDICT_OF = {"crashed": "crashed", "failed": "failed", "stopped": "failed", "error": "error", "passed": "passed",
               "skipped": "skipped", "unstarted": "skipped"}
_FAILING = ("crashed", "failed")
_COLORS = {"crashed": "black", "failed": "tab:red", "error": "tab:orange", "passed": "tab:green",
           "skipped": "tab:gray"}


def _first_line(error: str | None) -> str | None:
    if error is None:
        return None
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else ""


# ---- the controller's merge -----------------------------------------------------------------


def _lines(directory: Path) -> list[dict]:
    return [json.loads(line) for part in sorted(directory.glob("parts-*.jsonl"))
            for line in part.read_text(encoding="utf-8").splitlines() if line.strip()]


def item_outcome(item: dict) -> str:
    """An item's outcome; a line without one (older format) passed only if no example failed."""
    outcome = item.get("outcome")
    if outcome in OUTCOMES:
        return outcome
    return "failed" if item.get("failed_examples", 0) else "passed"


def workers_table(directory: Path) -> list[str]:
    """Markdown rows: each worker's GPU, test items and examples (shows the pinning at a glance)."""
    rows: dict[tuple[str, str], list[int]] = {}
    for item in _lines(directory):
        row = rows.setdefault((item.get("worker", "?"), str(item.get("gpu"))), [0, 0])
        row[0] += 1
        row[1] += item["examples"]
    return ["| worker | GPU (CUDA_VISIBLE_DEVICES) | items | examples |", "|---|---|---:|---:|",
            *(f"| {w} | {g} | {n} | {e} |" for (w, g), (n, e) in sorted(rows.items()))]


def _new_entry() -> dict:
    return {"items": 0, "cases": 0, "sequences": 0, "examples": 0, "failed_examples": 0, "worst": None,
            "seconds": 0.0, "counts": {d: Counter() for d in DIMENSIONS}, "outcomes": Counter(), "tiers": [],
            "failures": [], "collateral": False}


def _add_item(entry: dict, item: dict, collateral: bool = False) -> None:
    """Add one item's line to its property's entry; ``collateral``: a crash whose case passed alone (MPS)."""
    entry["items"] += 1
    for key in ("cases", "sequences", "examples", "failed_examples", "seconds"):
        entry[key] += item.get(key, 0)
    if item.get("worst") is not None:
        entry["worst"] = item["worst"] if entry["worst"] is None else max(entry["worst"], item["worst"])
    for dimension, counts in item.get("counts", {}).items():
        entry["counts"].setdefault(dimension, Counter()).update(counts)
    outcome, error = item_outcome(item), item.get("error")
    if collateral and outcome in _FAILING:
        outcome, error, entry["collateral"] = "error", mps.COLLATERAL, True
    entry["outcomes"][outcome] += 1
    if item.get("tier") and item["tier"] not in entry["tiers"]:
        entry["tiers"].append(item["tier"])
    if outcome in (*_FAILING, "error"):
        entry["failures"].append({"nodeid": item.get("nodeid", ""), "outcome": outcome,
                                  "case_file": item.get("case_file"), "error": error,
                                  "shrink_cut": item.get("shrink_cut")})


def _case_file_size(path: str | None) -> float:
    try:
        return Path(path).stat().st_size if path else math.inf
    except OSError:
        return math.inf


def _chosen_failure(failures: list[dict], verdict: str) -> dict | None:
    """The one failure a property's row shows, with its case file.

    Only failures of the verdict's kind are candidates (a crashed property shows the crash); among those
    with a case file, the smallest file on disk wins (a case file holds the counterexample's tensors, so
    its size grows with the counterexample: the smallest is the easiest to replay and read); ties and
    files that cannot be read fall back to node-id order, so the choice is deterministic.
    """
    candidates = [f for f in failures if f["outcome"] == verdict] or [f for f in failures if f["outcome"] in _FAILING]
    if not candidates:
        return None
    return min(candidates, key=lambda f: (f["case_file"] is None, _case_file_size(f["case_file"]), f["nodeid"]))


def _finish(entry: dict) -> None:
    """Verdict, shard counts, the chosen case file and examples/s, from the summed items."""
    outcomes = entry["outcomes"]
    verdict_of = _VERDICT_OF
    if entry.pop("collateral") and not outcomes["failed"] + outcomes["crashed"]:
        verdict_of = {**_VERDICT_OF, "stopped": "error"}  # they stopped for a crash that was not the kernel's
    entry["verdict"] = next((v for v in VERDICTS if any(verdict_of[o] == v for o in outcomes)), "passed")
    entry["failing_shards"] = outcomes["failed"] + outcomes["crashed"]
    entry["stopped_shards"] = outcomes["stopped"]
    entry["unstarted_shards"] = outcomes["unstarted"]
    chosen = _chosen_failure(entry.pop("failures"), entry["verdict"])
    entry["case_file"] = chosen["case_file"] if chosen else None
    entry["error"] = chosen["error"] if chosen else None
    entry["shrink_cut"] = chosen.get("shrink_cut") if chosen else None
    entry["examples_per_second"] = entry["examples"] / entry["seconds"] if entry["seconds"] > 0 else None
    entry["outcomes"] = dict(outcomes)


def merge(directory: Path) -> dict[str, dict]:
    """Per property: summed counts over its shards and workers, the worst err/bound, and the verdict.

    Each entry also has ``verdict`` (one of ``VERDICTS``), ``failing_shards`` and ``stopped_shards`` (of
    ``items``), ``case_file`` and ``error`` (one per property, see ``_chosen_failure``), ``outcomes``,
    ``tiers`` and ``examples_per_second`` (examples over the seconds summed over its items).
    """
    merged: dict[str, dict] = {}
    if directory.is_dir():
        collateral = {replay.nodeid for replay in _mps(directory)[1] if replay.collateral}
        for item in _lines(directory):
            _add_item(merged.setdefault(item["property"], _new_entry()), item, item.get("nodeid") in collateral)
    for entry in merged.values():
        _finish(entry)
    return merged


def _mps(directory: Path) -> tuple[str | None, list[mps.Replay]]:
    """The MPS control pipe the run joined (None: no MPS) and its crash replays."""
    return mps.load(directory) or (None, [])


def ordered(merged: dict[str, dict]) -> list[str]:
    """Property names, failures first (crashed, failed, passed, skipped), then by name."""
    return sorted(merged, key=lambda name: (VERDICTS.index(merged[name]["verdict"]), name))


def verdict_line(merged: dict[str, dict]) -> str:
    """'FAILED: 3 of 26 properties failed, 1 crashed' or 'PASSED: 26 properties' (skipped ones added, and the
    items a --time-budget left unstarted)."""
    count = Counter(entry["verdict"] for entry in merged.values())
    total, skipped = len(merged), f", {count['skipped']} skipped" if count["skipped"] else ""
    skipped += f", {count['error']} without a verdict (error)" if count["error"] else ""
    unstarted = sum(entry.get("unstarted_shards", 0) for entry in merged.values())
    skipped += f"; {unstarted} items not started (time budget spent)" if unstarted else ""
    bad = [(count[v], v) for v in _FAILING[::-1] if count[v]]  # failed before crashed
    if not bad:
        if count["error"]:
            return f"INCOMPLETE: {count['passed']} of {total} properties passed{skipped}"
        return f"PASSED: {count['passed']} properties{skipped}" if count["passed"] else f"NOTHING RAN{skipped}"
    (first, kind), rest = bad[0], bad[1:]
    return f"FAILED: {first} of {total} properties {kind}" + "".join(f", {n} {v}" for n, v in rest) + skipped


def run_tier(merged: dict[str, dict]) -> str:
    """The contract tier of the run: one name, 'mixed (a, b)', or 'unknown' (older part lines)."""
    tiers = sorted({tier for entry in merged.values() for tier in entry["tiers"]})
    return tiers[0] if len(tiers) == 1 else f"mixed ({', '.join(tiers)})" if tiers else "unknown"


def gpu_throughput(lines: list[dict]) -> dict[str, dict]:
    """Per GPU: workers, items, examples, wall seconds (earliest item start to last end) and examples/s."""
    groups: dict[str, dict] = {}
    for item in lines:
        group = groups.setdefault(str(item.get("gpu") or "none"), {"workers": set(), "items": 0, "examples": 0,
                                                                   "start": math.inf, "end": -math.inf})
        group["workers"].add(item.get("worker", "?"))
        group["items"] += 1
        group["examples"] += item.get("examples", 0)
        if item.get("started") is not None:
            group["start"] = min(group["start"], item["started"])
            group["end"] = max(group["end"], item["started"] + item.get("seconds", 0.0))
    return {gpu: _rate(len(g["workers"]), g["items"], g["examples"], _wall(g["start"], g["end"]))
            for gpu, g in sorted(groups.items())}


def _rate(workers: int, items: int, examples: int, wall: float | None) -> dict:
    return {"workers": workers, "items": items, "examples": examples, "wall": wall,
            "examples_per_second": examples / wall if wall else None}


def _wall(start: float, end: float) -> float | None:
    return end - start if math.isfinite(start) and end > start else None


def run_throughput(lines: list[dict]) -> dict:
    """Run level: examples, wall seconds (earliest start to last end), examples/s, and per GPU."""
    starts = [item["started"] for item in lines if item.get("started") is not None]
    ends = [item["started"] + item.get("seconds", 0.0) for item in lines if item.get("started") is not None]
    examples = sum(item.get("examples", 0) for item in lines)
    wall = _wall(min(starts), max(ends)) if starts else None
    gpus = len({item["gpu"] for item in lines if item.get("gpu")}) or None
    rate = examples / wall if wall else None
    return {"examples": examples, "wall": wall, "gpus": gpus, "examples_per_second": rate,
            "examples_per_second_per_gpu": rate / gpus if rate is not None and gpus else None,
            "stages_ms_per_example": stage_breakdown(lines)}


def stage_breakdown(lines: list[dict]) -> dict | None:
    """Where one worker's time goes, over the examples the stage clocks sampled in ``lines`` (items' part lines):
    per column (``stages.COLUMNS``) count, median, p90, mean and share in ms (``stages.summarise``), the first
    examples of each property in each process apart ("first"), and "busy", a worker's item time per counted
    example (shrinking and rejected examples included), and "split": every example the clocks did not sample,
    split into generation and the rest (``stages.SPLIT``, unsynchronised). None before any sample."""
    steady = [row for item in lines for row in _stage_rows(item, "examples")]
    first = [row for item in lines for row in _stage_rows(item, "first")]
    if not steady and not first:
        return None
    taken = [item.get("stages") or {} for item in lines]
    unsampled = [row for stages in taken for row in stages.get("unsampled", [])]
    sums = [sum(column) for column in zip(*(stages["unsampled_sums"] for stages in taken
                                            if "unsampled_sums" in stages), strict=True)] or [0, 0.0, 0.0]
    examples = sum(item.get("examples", 0) for item in lines)
    busy = 1e3 * sum(item.get("seconds", 0.0) for item in lines) / examples if examples else None
    return {"steady": summarise(steady), "first": summarise(first), "busy_ms_per_example": busy,
            "split": summarise_split(unsampled, sums)}


def _stage_rows(item: dict, kind: str) -> list[list[float]]:
    """The rows of ``kind`` ("examples" or "first") an item's stage clock took, in ``COLUMNS`` order (none from a
    part file written before the clock kept rows)."""
    taken = item.get("stages") or {}
    columns = taken.get("columns")
    if columns is None:
        return []
    order = [columns.index(name) if name in columns else None for name in COLUMNS]
    return [[row[i] if i is not None else 0.0 for i in order] for row in taken.get(kind, [])]


# ---- report.md ------------------------------------------------------------------------------


def _share(counts: Counter, total: int) -> str:
    return ", ".join(f"{label} {100.0 * n / total:.0f}%" for label, n in counts.most_common()) if total else "-"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|")


def _number(value: float | None, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def verdict_table(merged: dict[str, dict]) -> list[str]:
    """Markdown rows, failures first: property, verdict, shards failing, examples, examples/s, worst, case file."""
    rows = ["| property | verdict | shards failing | examples | examples/s | worst err/bound | case file |",
            "|---|---|---:|---:|---:|---:|---|"]
    for name in ordered(merged):
        entry = merged[name]
        verdict = entry["verdict"]
        shards = f"{entry['failing_shards']} of {entry['items']}"
        if entry["stopped_shards"]:
            shards += f" ({entry['stopped_shards']} stopped)"
        if entry.get("unstarted_shards"):
            shards += f" ({entry['unstarted_shards']} not started)"
        case = f"`{_cell(entry['case_file'])}`" if entry["case_file"] else "-"
        rows.append(f"| `{_cell(name)}` | {verdict.upper() if verdict in _FAILING else verdict} | {shards} | "
                    f"{entry['examples']} | {_number(entry['examples_per_second'], '.1f')} | "
                    f"{_number(entry['worst'])} | {case} |")
    return rows


def _failures_list(merged: dict[str, dict]) -> list[str]:
    failing = [name for name in ordered(merged) if merged[name]["verdict"] in _FAILING]
    if not failing:
        return []
    lines = ["", "## Failures", ""]
    for name in failing:
        entry = merged[name]
        stopped = f", {entry['stopped_shards']} stopped early" if entry["stopped_shards"] else ""
        lines.append(f"- `{name}` {entry['verdict']} ({entry['failing_shards']} of {entry['items']} shards failed"
                     f"{stopped}): {entry['error'] or '(no message: the failing shard left no line)'}")
        lines += [f"  - {entry['shrink_cut'].removeprefix('gqa-decode: ')}"] if entry.get("shrink_cut") else []
        lines += _replay_line(entry)
    return lines


def _errors_list(merged: dict[str, dict]) -> list[str]:
    erring = [name for name in ordered(merged) if merged[name]["verdict"] == "error"]
    if not erring:
        return []
    lines = ["", "## Errors (no verdict on the kernel)", ""]
    for name in erring:
        entry = merged[name]
        lines.append(f"- `{name}`: {entry['error'] or 'the suite could not run it (infrastructure error)'}")
        lines += _replay_line(entry)
    return lines


def _replay_line(entry: dict) -> list[str]:
    return [f"  replay: `{replay_command(entry['case_file'])}`"] if entry["case_file"] else []


def _replays_list(replays: list[mps.Replay]) -> list[str]:
    """Each crash replayed alone under MPS: what the replay found, and so what the crash counts as."""
    if not replays:
        return []
    return ["", "## Crashes replayed alone (MPS)", "",
            *(f"- `{r.nodeid}`: {r.status}{' (kept as crashed)' if r.status == mps.UNCONFIRMED else ''}, "
              f"{r.seconds:.1f} s: {r.detail}" for r in replays)]


def _coverage(merged: dict[str, dict]) -> list[str]:
    lines = []
    for name, entry in sorted(merged.items()):
        lines += ["", f"## `{name}`", ""]
        for dimension in DIMENSIONS:
            counts = entry["counts"].get(dimension, Counter())
            if counts:
                lines.append(f"- {dimension}: {_share(counts, sum(counts.values()))}")
        if entry["sequences"]:
            empty = entry["counts"]["length"].get("0", 0)
            lines.append(f"- empty sequences: {100.0 * empty / entry['sequences']:.1f}% of {entry['sequences']}")
    return lines


def _throughput(lines: list[dict]) -> list[str]:
    run = run_throughput(lines)
    per_gpu = gpu_throughput(lines)
    summary = (f"{run['examples']} examples in {_number(run['wall'], '.1f')} s wall: "
               f"{_number(run['examples_per_second'], '.1f')} examples/s")
    if run["gpus"]:
        summary += f", {_number(run['examples_per_second_per_gpu'], '.1f')} per GPU on {run['gpus']} GPUs"
    return ["", "## Throughput", "", summary, "",
            "| GPU | workers | items | examples | wall s | examples/s |", "|---|---:|---:|---:|---:|---:|",
            *(f"| {gpu} | {g['workers']} | {g['items']} | {g['examples']} | {_number(g['wall'], '.1f')} | "
              f"{_number(g['examples_per_second'], '.1f')} |" for gpu, g in per_gpu.items()),
            *_stages(stage_breakdown(lines))]


def _stages(breakdown: dict | None) -> list[str]:
    if breakdown is None:
        return []
    lines = []
    steady, first = breakdown["steady"], breakdown["first"]
    if steady:
        lines += ["", f"Where one worker's time goes: {steady['total']['count']} examples timed (one in {SAMPLE_EVERY} "
                      "at random, the device synchronised at each stage's edges; each property's first example in "
                      "each process apart, below). Generation is Hypothesis's time between examples, other the "
                      "rest of an example outside the stages: the shares add to 100%.", "",
                  "| stage | median ms | p90 ms | mean ms | share |", "|---|---:|---:|---:|---:|",
                  *(_stage_row(name, steady[name]) for name in (*COLUMNS, "total"))]
    if first:
        lines += ["", f"First examples ({first['total']['count']}: compilation, loading): median "
                      f"{first['total']['median']:.1f} ms, p90 {first['total']['p90']:.1f} ms; "
                      + ", ".join(f"{name} {first[name]['share']:.0%}" for name in COLUMNS) + "."]
    split = breakdown.get("split")
    if split:
        lines += ["", split_line(split) + "."]
    busy = breakdown["busy_ms_per_example"]
    if busy:
        lines += ["", f"Busy time per counted example (items' time over their examples, shrinking and first "
                      f"examples included): {busy:.2f} ms, {1e3 / busy:.0f} examples/s per worker."]
    return lines


def _stage_row(name: str, column: dict) -> str:
    return (f"| {name} | {column['median']:.3f} | {column['p90']:.3f} | {column['mean']:.3f} | "
            f"{100 * column['share']:.1f}% |")


def _causes_section(found: dict | None) -> list[str]:
    """'## N distinct failures' and each root cause (``causes.summary_lines``), where properties failed."""
    lines = causes.summary_lines(found)
    if not lines:
        return []
    return [f"## {lines[0]}", "", *lines[1:-1], "", lines[-1], ""]


def _markdown(merged: dict[str, dict], run_id: str, mps_line: str | None, replays: list[mps.Replay],
              found: dict | None = None, isolation_line: str | None = None) -> str:
    """The verdict (run id, tier, verdict line, root causes, isolation, MPS, table, failures, errors, crash
    replays), then coverage."""
    lines = [f"# Run report {run_id}", "", f"Tier: {run_tier(merged)}", "", f"**{verdict_line(merged)}**", "",
             *_causes_section(found),
             *([isolation_line[0].upper() + isolation_line[1:], ""] if isolation_line else []),
             *([mps_line, ""] if mps_line else []), *verdict_table(merged), "",
             "Worst err/bound is over passing examples; a failing example exceeds 1 by definition.",
             *_failures_list(merged), *_errors_list(merged), *_replays_list(replays), *_coverage(merged)]
    return "\n".join(lines) + "\n"


# ---- summary.png ----------------------------------------------------------------------------


def short_name(name: str, width: int = 36) -> str:
    """A property's label on the plot: the test function (with any parameters) without ``test_``, truncated."""
    short = name.rpartition("::")[2].removeprefix("test_")
    return short if len(short) <= width else short[:width - 1] + "…"


def _verdict_panel(axis, merged: dict[str, dict], names: list[str]) -> None:
    """One bar per property drawn (examples run), colored by verdict, with the failing shards written beside it;
    the title counts those not drawn."""
    positions = range(len(names))
    widths = [max(merged[n]["examples"], 1) for n in names]
    axis.barh(positions, widths, color=[_COLORS[merged[n]["verdict"]] for n in names])
    axis.set_yticks(list(positions), [short_name(n) for n in names], fontsize=9)
    axis.set_ylim(len(names) - 0.5, -0.5)
    axis.set_xlim(0, 1.35 * max(widths))
    for position, name, width in zip(positions, names, widths):
        if merged[name]["verdict"] != "passed":
            axis.text(width + 0.01 * max(widths), position, _verdict_label(merged[name]), va="center", fontsize=8,
                      color=_COLORS[merged[name]["verdict"]], fontweight="bold")
    from matplotlib.patches import Patch

    axis.legend(handles=[Patch(color=_COLORS[v], label=v) for v in VERDICTS], loc="lower right", fontsize=8)
    axis.set_xlabel("examples run (color: verdict)")
    hidden = len(merged) - len(names)
    axis.set_title("verdict per property" + (f" (the first {len(names)}; {hidden} more in report.md)" if hidden
                                             else ""), y=1.0)


def _verdict_label(entry: dict) -> str:
    """'FAILED 3/16', 'CRASHED 1/4, 2 stopped', 'skipped': what the bar of a property that did not pass says."""
    if entry["verdict"] not in _FAILING:
        return entry["verdict"]
    label = f"{entry['verdict'].upper()} {entry['failing_shards']}/{entry['items']}"
    return label + (f", {entry['stopped_shards']} stopped" if entry["stopped_shards"] else "")


def _worst_panel(axis, merged: dict[str, dict], names: list[str]) -> None:
    """Worst err/bound of passing examples; a failed property gets a red hatched bar past 1, labelled."""
    worst = [merged[n]["worst"] or 0.0 for n in names]
    top = max([1.25, *(1.1 * w for w in worst)])
    for position, (name, value) in enumerate(zip(names, worst)):
        verdict = merged[name]["verdict"]
        if verdict in _FAILING:
            axis.barh(position, top, color="white", edgecolor=_COLORS[verdict], hatch="//")
            axis.text(top * 0.98, position, verdict, ha="right", va="center", fontsize=8, color=_COLORS[verdict],
                      fontweight="bold", backgroundcolor="white")
        else:
            axis.barh(position, value, color=_COLORS[verdict])
    axis.set_yticks(list(range(len(names))), [""] * len(names))
    axis.set_ylim(len(names) - 0.5, -0.5)
    axis.axvline(1.0, color="black", linestyle="--", linewidth=1)
    axis.set_xlim(0, top)
    axis.set_title("worst err/bound (1 = bound)", y=1.0)


def _coverage_panel(axis, dimension: str, labels: list[str], counts: list[int]) -> None:
    axis.bar(labels, counts, color="tab:blue")
    axis.set_title(f"{dimension} (all properties)", y=1.0)
    axis.tick_params(axis="x", labelrotation=_LABEL_ROTATION, labelsize=8)


# The figure's layout, in inches. Explicit, from the measured label widths: tight_layout measured every
# artist of the figure (and made savefig draw it twice), most of the PNG's time.
_SUPTITLE_BAND = 0.6  # the figure's title, above everything
_NOTE_BAND = 0.3  # a line under the title (MPS), where there is one
_TOP_PANEL_TITLE = 0.3  # an axes' title, above the axes (6 points of pad and the text)
_COVERAGE_TITLE = 0.35
_VERDICT_XAXIS = 0.65  # below the verdict strip: its tick labels and x label
_TICK_SPACE = 0.12  # tick and pad, between an axis and its tick labels
_EDGE = 0.15  # from the figure's edge to the outermost text
_COVERAGE_ROW = 3.2  # height of one row of coverage panels
_LABEL_ROTATION = 30  # the coverage panels' x tick labels, in degrees
# Properties drawn in the verdict strip: a family run has over a thousand, whose strip took 13 s to draw and could
# not be read; report.md lists them all.
MAX_DRAWN = 80


def _fitting_size(renderer, text: str, size: float, room: float) -> float:
    """The largest font size up to ``size`` at which ``text`` fits ``room`` inches. Measured again after each
    shrink: at small sizes glyphs are not proportionally narrower (hinting), so one proportional step can
    overshoot."""
    for _ in range(5):
        wide = _text_size(renderer, [text], size)[0]
        if wide <= room:
            break
        size *= 0.98 * room / wide
    return size


def _text_size(renderer, texts, size: float) -> tuple[float, float]:
    """The widest width and the tallest height among ``texts`` at font size ``size``, in inches."""
    from matplotlib.font_manager import FontProperties

    prop, widest, tallest = FontProperties(size=size), 0.0, 0.0
    for text in texts:
        width, height, _ = renderer.get_text_width_height_descent(text, prop, ismath=False)
        widest, tallest = max(widest, width), max(tallest, height)
    return widest / renderer.dpi, tallest / renderer.dpi


def _coverage_labels(merged: dict[str, dict], dimension: str) -> tuple[list[str], list[int]]:
    """A coverage panel's bars: the labels seen (bucket order for a numeric dimension) and their counts."""
    total = Counter()
    for entry in merged.values():
        total.update(entry["counts"].get(dimension, {}))
    labels = _BUCKETS[dimension][1] if dimension in _BUCKETS else sorted(total)
    labels = [label for label in labels if total.get(label)]
    return labels, [total[label] for label in labels]


def _summary_png(merged: dict[str, dict], path: Path, run_id: str, note: str | None = None) -> None:
    """Verdict strip and worst err/bound on top (height grows with the properties), coverage below; ``note``,
    one line under the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ordered(merged)[:MAX_DRAWN]  # failures first
    shown = [d for d in DIMENSIONS if any(e["counts"].get(d) for e in merged.values())]
    columns = 3
    coverage_rows = math.ceil(len(shown) / columns)
    top_height = max(3.2, 0.3 * len(names) + 1.2)
    band = _SUPTITLE_BAND + (_NOTE_BAND if note else 0.0)
    width, height = 5.0 * columns, band + top_height + _COVERAGE_ROW * coverage_rows
    figure = plt.figure(figsize=(width, height))
    renderer = figure.canvas.get_renderer()

    def axes(left: float, top: float, right: float, bottom: float):
        """An axes placed by its edges in inches (top and bottom from the figure's top edge)."""
        return figure.add_axes((left / width, 1 - bottom / height, (right - left) / width, (bottom - top) / height))

    # Top: the verdict strip (two thirds) beside the worst err/bound (one third), right of the longest name.
    names_width, _ = _text_size(renderer, [short_name(n) for n in names], 9)
    left, right, gap = _EDGE + names_width + _TICK_SPACE, width - 0.35, 0.4
    split = left + 2 * (right - left - gap) / 3
    top, bottom = band + _TOP_PANEL_TITLE, band + top_height - _VERDICT_XAXIS
    _verdict_panel(axes(left, top, split, bottom), merged, names)
    _worst_panel(axes(split + gap, top, right, bottom), merged, names)

    # Below: three columns of coverage panels, room left of each for its counts and below for rotated labels.
    bars = {dimension: _coverage_labels(merged, dimension) for dimension in shown}
    counts_width, _ = _text_size(renderer, [str(max(counts, default=0)) for _, counts in bars.values()], 10)
    label_width, label_height = _text_size(renderer, [label for labels, _ in bars.values() for label in labels], 8)
    angle = math.radians(_LABEL_ROTATION)
    below = label_width * math.sin(angle) + label_height * math.cos(angle) + _TICK_SPACE + 0.15
    inner = counts_width + _TICK_SPACE + 0.1  # left of each panel: its tick labels
    gap = inner + 0.35
    panel = (width - _EDGE - inner - 0.35 - 2 * gap) / columns
    for slot, dimension in enumerate(shown):
        row, column = divmod(slot, columns)
        row_top = band + top_height + _COVERAGE_ROW * row
        panel_left = _EDGE + inner + column * (panel + gap)
        _coverage_panel(axes(panel_left, row_top + _COVERAGE_TITLE, panel_left + panel,
                             row_top + _COVERAGE_ROW - below), dimension, *bars[dimension])
    line = verdict_line(merged)
    figure.suptitle(f"{line}   (tier {run_tier(merged)}, run {run_id}, "
                    f"{sum(e['examples'] for e in merged.values())} examples)", fontsize=14, fontweight="bold",
                    color="tab:green" if line.startswith("PASSED") else "tab:red", y=1 - 0.15 / height)
    if note:  # one line, its font shrunk to the figure's width where it is long (a long pipe path)
        figure.text(0.5, 1 - (_SUPTITLE_BAND - 0.05) / height, note, ha="center", va="top",
                    fontsize=_fitting_size(renderer, note, 10.0, width - 2 * _EDGE))
    figure.savefig(path, dpi=80)
    plt.close(figure)


def warm_up() -> None:
    """Import the plotting library and draw a throwaway figure (fonts, glyph caches): most of a second that
    ``write_report`` then does not spend after the last test. The xdist controller, which idles while its
    workers test, calls this in a thread of its own; ``write_report`` must not run until it returns."""
    try:
        import io

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401 - what _summary_png imports
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch  # noqa: F401 - what _verdict_panel imports
    except ImportError:  # matplotlib missing: write_report says so in the report
        return
    figure = Figure(figsize=(1, 1))
    axis = figure.add_axes((0.2, 0.2, 0.7, 0.7))
    axis.bar(["a"], [1])
    axis.set_title("warm", y=1.0, fontweight="bold")
    FigureCanvasAgg(figure).print_png(io.BytesIO())


def write_report(directory: Path, run_id: str, picture: bool = True) -> Path | None:
    """Merge the part files into report.md, report.json and (``picture``) summary.png; None when no property ran.

    report.json leads with ``causes`` (the run's root causes, where properties failed: ``causes.as_json``),
    then maps each property to its merged entry (as before, plus the verdict fields); run.json holds the
    run-level verdict, tier, throughput and, under MPS, the line saying so (``mps``).
    """
    merged = merge(directory)
    if not merged:
        return None
    lines = _lines(directory)
    pipe, replays = _mps(directory)
    mps_line = mps.report_line(pipe, replays) if pipe else None
    found = causes.load(directory)
    isolation_line = isolation.load(directory)
    (directory / "report.json").write_text(json.dumps(
        {**({"causes": found} if found else {}),
         **{name: {**entry, "counts": {d: dict(c) for d, c in entry["counts"].items()}}
            for name, entry in merged.items()}}, indent=1), encoding="utf-8")
    (directory / "run.json").write_text(json.dumps(
        {"run": run_id, "tier": run_tier(merged), "verdict": verdict_line(merged),
         "throughput": run_throughput(lines), "gpus": gpu_throughput(lines), "mps": mps_line,
         "isolation": isolation_line}, indent=1),
        encoding="utf-8")
    report = directory / "report.md"
    workers = ["", "## Workers", "", *workers_table(directory), *_throughput(lines)]
    try:
        if picture:
            _summary_png(merged, directory / "summary.png", run_id, note=mps_line)
    except ImportError:  # matplotlib missing (a bare GPU image): the report stays, without its picture
        workers += ["", "(no summary.png: matplotlib is not installed)"]
    report.write_text(_markdown(merged, run_id, mps_line, replays, found, isolation_line) + "\n".join(workers)
                      + "\n", encoding="utf-8")
    return report
