"""The run report: what each property ran on, and how close to the bound it came.

Each process (an xdist worker, or pytest itself without xdist) tallies every case a
test builds and the worst err/bound Hypothesis was told about (``target``), and
appends one JSON line per test to ``reports/<run>/parts-*.jsonl``. At session end
the controller merges the lines per property (shards together) into
``report.md``, ``report.json`` and one PNG summary.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Tally", "tally", "flush", "observe_case", "write_report", "property_name"]

# Bucket edges (upper bounds, inclusive) and labels: what "covered" means at a glance.
_BUCKETS = {
    "batch": ([0, 1, 4, 16, 64], ["0", "1", "2-4", "5-16", "17-64", ">64"]),
    "length": ([0, 1, 16, 128, 1024, 8192], ["0", "1", "2-16", "17-128", "129-1024", "1025-8192", ">8192"]),
    "pool pages": ([16, 256, 4096, 65536], ["<=16", "17-256", "257-4096", "4097-65536", ">65536"]),
    "worst err/bound": ([0.01, 0.1, 0.5, 1.0], ["<=0.01", "0.01-0.1", "0.1-0.5", "0.5-1", ">1 (fail)"]),
}
DIMENSIONS = ("batch", "length", "empty", "pool pages", "page layout", "pool fill", "scale", "values",
              "q layout", "kv layout", "index layout", "worst err/bound")
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


def property_name(nodeid: str) -> str:
    """The property a test item belongs to: its node id without the shard parameter."""
    return re.sub(r"\[shard\d+of\d+\]$|(?<=\[)shard\d+of\d+-|-shard\d+of\d+(?=\])", "", nodeid)


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

    def add_case(self, case: Any, pool_pages: int | None) -> None:
        lengths = tuple(getattr(case, "lengths", ()))
        self.cases += 1
        self.sequences += len(lengths)
        self.counts["batch"][bucket("batch", len(lengths))] += 1
        for length in lengths:
            self.counts["length"][bucket("length", length)] += 1
        empty = sum(1 for n in lengths if n == 0)
        self.counts["empty"]["none" if not empty else "all" if empty == len(lengths) else "some"] += 1
        if pool_pages is not None:
            self.counts["pool pages"][bucket("pool pages", pool_pages)] += 1
        self.counts["scale"][_scale_kind(getattr(case, "scale", None))] += 1
        for dimension, attribute in (("page layout", "page_layout"), ("pool fill", "pool_fill"), ("values", "values"),
                                     ("q layout", "q_layout"), ("kv layout", "kv_layout"),
                                     ("index layout", "index_layout")):
            if hasattr(case, attribute):
                self.counts[dimension][str(getattr(case, attribute))] += 1

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
                "worst": self.worst, "seconds": self.seconds,
                "counts": {d: dict(c) for d, c in self.counts.items()}}


tally = Tally()


def begin(nodeid: str) -> None:
    """Start counting for a new test item."""
    global tally
    tally = Tally(nodeid=nodeid)


def observe_case(case: Any, inputs: Any) -> None:
    """Count a built case; also label it for ``--hypothesis-show-statistics``."""
    pool = getattr(getattr(inputs, "k_cache", None), "shape", (None,))[0]
    tally.add_case(case, pool)
    try:
        from hypothesis import event
        from hypothesis.control import currently_in_test_context

        if currently_in_test_context():
            lengths = tuple(getattr(case, "lengths", ()))
            event(f"batch {bucket('batch', len(lengths))}")
            event(f"longest sequence {bucket('length', max(lengths, default=0))}")
            event(f"page layout {getattr(case, 'page_layout', '?')}, values {getattr(case, 'values', '?')}")
    except ImportError:  # an old Hypothesis: statistics go without these labels
        pass


def _field(observation: Any, name: str) -> Any:
    return observation.get(name) if isinstance(observation, dict) else getattr(observation, name, None)


def observe_hypothesis(observation: Any) -> None:
    """Hypothesis observability callback: count test cases and the targets they reported."""
    if _field(observation, "type") != "test_case":
        return
    features = _field(observation, "features") or {}
    targets = {k.removeprefix("target:"): float(v) for k, v in features.items()
               if k.startswith("target") and isinstance(v, (int, float))}
    tally.add_observation(str(_field(observation, "status")), targets)


def listen_to_hypothesis() -> bool:
    """Register ``observe_hypothesis``; False where this Hypothesis has no observability callbacks."""
    try:
        from hypothesis.internal.observability import add_observability_callback
    except ImportError:
        return False
    add_observability_callback(observe_hypothesis)
    return True


def flush(directory: Path, worker: str, seconds: float, gpu: str | None = None) -> None:
    """Append the current test's tally to this process's part file, with the worker and its GPU."""
    tally.seconds = seconds
    if not tally.cases:
        return  # built no case: not a property of the suite
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"parts-{worker}-{os.getpid()}.jsonl", "a", encoding="utf-8") as part:
        part.write(json.dumps({**tally.as_json(), "worker": worker, "gpu": gpu}) + "\n")


# ---- the controller's merge -----------------------------------------------------------------


def _lines(directory: Path) -> list[dict]:
    return [json.loads(line) for part in sorted(directory.glob("parts-*.jsonl"))
            for line in part.read_text(encoding="utf-8").splitlines()]


def workers_table(directory: Path) -> list[str]:
    """Markdown rows: each worker's GPU, test items and examples (shows the pinning at a glance)."""
    rows: dict[tuple[str, str], list[int]] = {}
    for item in _lines(directory):
        row = rows.setdefault((item.get("worker", "?"), str(item.get("gpu"))), [0, 0])
        row[0] += 1
        row[1] += item["examples"]
    return ["| worker | GPU (CUDA_VISIBLE_DEVICES) | items | examples |", "|---|---|---:|---:|",
            *(f"| {w} | {g} | {n} | {e} |" for (w, g), (n, e) in sorted(rows.items()))]


def merge(directory: Path) -> dict[str, dict]:
    """Per property: summed counts over its shards and workers, and the worst err/bound."""
    merged: dict[str, dict] = {}
    if directory.is_dir():
        for item in _lines(directory):
            entry = merged.setdefault(item["property"], {
                "items": 0, "cases": 0, "sequences": 0, "examples": 0, "failed_examples": 0, "worst": None,
                "seconds": 0.0, "counts": {d: Counter() for d in DIMENSIONS}})
            entry["items"] += 1
            for key in ("cases", "sequences", "examples", "failed_examples", "seconds"):
                entry[key] += item[key]
            if item["worst"] is not None:
                entry["worst"] = item["worst"] if entry["worst"] is None else max(entry["worst"], item["worst"])
            for dimension, counts in item["counts"].items():
                entry["counts"].setdefault(dimension, Counter()).update(counts)
    return merged


def _share(counts: Counter, total: int) -> str:
    return ", ".join(f"{label} {100.0 * n / total:.0f}%" for label, n in counts.most_common()) if total else "-"


def _markdown(merged: dict[str, dict], run_id: str) -> str:
    lines = [f"# Run report {run_id}", "",
             "Worst err/bound is over passing examples; a failing example exceeds 1 by definition.", "",
             "| property | examples | cases built | failing examples | worst err/bound | seconds |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, entry in sorted(merged.items()):
        worst = "n/a" if entry["worst"] is None else f"{entry['worst']:.3g}"
        lines.append(f"| `{name}` | {entry['examples']} | {entry['cases']} | {entry['failed_examples']} | "
                     f"{worst} | {entry['seconds']:.1f} |")
    for name, entry in sorted(merged.items()):
        lines += ["", f"## `{name}`", ""]
        for dimension in DIMENSIONS:
            counts = entry["counts"].get(dimension, Counter())
            if counts:
                lines.append(f"- {dimension}: {_share(counts, sum(counts.values()))}")
        if entry["sequences"]:
            empty = entry["counts"]["length"].get("0", 0)
            lines.append(f"- empty sequences: {100.0 * empty / entry['sequences']:.1f}% of {entry['sequences']}")
    return "\n".join(lines) + "\n"


def _summary_png(merged: dict[str, dict], path: Path, run_id: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [d for d in DIMENSIONS if any(e["counts"].get(d) for e in merged.values())]
    columns = 3
    rows = 1 + math.ceil(len(shown) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.2 * rows), squeeze=False)
    names = sorted(merged)
    short = [name.rpartition("::")[2][:40] for name in names]
    overview = axes[0][0]
    overview.barh(short, [merged[n]["examples"] for n in names], color="tab:blue")
    overview.set_title("examples per property")
    worst = axes[0][1]
    worst.barh(short, [merged[n]["worst"] or 0.0 for n in names], color="tab:red")
    worst.axvline(1.0, color="black", linestyle="--", linewidth=1)
    worst.set_title("worst err/bound (1 = bound)")
    for axis in axes[0][1:2]:
        axis.tick_params(labelleft=False)
    axes[0][2].axis("off")
    axes[0][2].text(0, 0.5, f"run {run_id}\n{len(names)} properties\n"
                    f"{sum(merged[n]['examples'] for n in names)} examples", fontsize=12, va="center")
    for slot, dimension in enumerate(shown):
        axis = axes[1 + slot // columns][slot % columns]
        total = Counter()
        for entry in merged.values():
            total.update(entry["counts"].get(dimension, {}))
        labels = (_BUCKETS[dimension][1] if dimension in _BUCKETS else sorted(total))
        labels = [label for label in labels if total.get(label)]
        axis.bar(labels, [total[label] for label in labels], color="tab:green")
        axis.set_title(f"{dimension} (all properties)")
        axis.tick_params(axis="x", labelrotation=30, labelsize=8)
    for slot in range(len(shown), (rows - 1) * columns):
        axes[1 + slot // columns][slot % columns].axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def write_report(directory: Path, run_id: str) -> Path | None:
    """Merge the part files into report.md, report.json and summary.png; None when no property ran."""
    merged = merge(directory)
    if not merged:
        return None
    (directory / "report.json").write_text(json.dumps(
        {name: {**entry, "counts": {d: dict(c) for d, c in entry["counts"].items()}}
         for name, entry in merged.items()}, indent=1), encoding="utf-8")
    report = directory / "report.md"
    workers = ["", "## Workers", "", *workers_table(directory)]
    try:
        _summary_png(merged, directory / "summary.png", run_id)
    except ImportError:  # matplotlib missing (a bare GPU image): the report stays, without its picture
        workers += ["", "(no summary.png: matplotlib is not installed)"]
    report.write_text(_markdown(merged, run_id) + "\n".join(workers) + "\n", encoding="utf-8")
    return report
