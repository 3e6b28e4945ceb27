"""A short digest of run reports, for summaries that must come back small from a GPU machine.

    python benchmarks/report_digest.py reports-*/*/        # one block per run report folder

Per run: the verdict line, each root cause (what it needs, how many properties, its minimal case and replay, the
definitions its properties ran under and why its members joined, counted), and
per definition the examples of passing properties, how many properties the time budget left unstarted, and the
properties that did not pass; then one line over all definitions (a findings table's row), and where the items'
time went: the share of it that the properties that did not pass took (a failing property shrinks, so a widely
failing kernel's run covers fewer items in its budget).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

_DEFINITION = re.compile(r"gqa_\w+?(?=[\]\-]|$)")  # any op type's definition
RUN_DEFINITION = "the run's definition"  # a property or case that names none


def _definition(prop: str) -> str:
    found = _DEFINITION.search(prop.partition("[")[2])
    return found.group(0) if found else f"({RUN_DEFINITION})"


def _counted(values) -> str:
    """``values`` as "value (count)", the commonest first: a cause's hundreds of members in one line."""
    return "; ".join(f"{value} ({count})" for value, count in Counter(values).most_common())


def digest(folder: Path) -> list[str]:
    """The digest of one run report folder, as markdown lines."""
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    verdict = next((line for line in (folder / "report.md").read_text(encoding="utf-8").splitlines()
                    if line.startswith("**")), "(no verdict line)")
    lines = [f"### {folder}", "", verdict, ""]
    found = report.get("causes") or {}
    for n, cause in enumerate(found.get("causes", []), 1):
        rep = cause["representative"]
        lines += [f"{n}. {cause['summary']} ({len(cause['properties'])} properties)",
                  f"   case: {rep.get('case', '')[:400]} under {rep.get('definition') or RUN_DEFINITION}",
                  f"   error: {(rep.get('error') or '')[:300]}",
                  f"   replay: {rep.get('replay')}",
                  f"   definitions: {_counted(_definition(prop) for prop in cause['properties'])}"]
        if cause.get("members"):
            lines.append(f"   joined: {_counted(member.get('joined') or '?' for member in cause['members'])}")
    if found.get("probes"):
        probes = found["probes"]
        lines.append(f"probes: {probes['used']} of {probes['limit']}, {probes['seconds']} s; "
                     f"stopped: {probes['stopped']}")
    per_definition: dict[str, dict] = defaultdict(lambda: {"examples": 0, "passed": 0, "unstarted": 0, "other": []})
    seconds = {"all": 0.0, "not passed": 0.0}
    for prop, entry in report.items():
        if not isinstance(entry, dict) or "verdict" not in entry:
            continue
        spent = entry.get("seconds") or 0.0
        seconds["all"] += spent
        if entry["verdict"] not in ("passed", "skipped"):
            seconds["not passed"] += spent
        row = per_definition[_definition(prop)]
        unstarted = entry.get("unstarted_shards") or 0
        if entry["verdict"] == "passed":
            row["passed"] += 1
            row["examples"] += entry["examples"]
        elif entry["verdict"] == "skipped" and unstarted and unstarted == entry.get("items"):
            row["unstarted"] += 1  # the time budget ran out before any of its shards: counted, not named
        elif entry["verdict"] != "skipped" or unstarted:
            name = prop.rpartition("::")[2].split("[")[0].removeprefix("test_")
            row["other"].append(f"{name} {entry['verdict']}" + (
                f" ({unstarted} of {entry['items']} not started)" if unstarted else ""))
    lines += ["", "| definition | properties passed | their examples | not started | not passed |",
              "|---|---:|---:|---:|---|"]
    for name in sorted(per_definition):
        row = per_definition[name]
        lines.append(f"| {name} | {row['passed']} | {row['examples']} | {row['unstarted']} | "
                     f"{'; '.join(sorted(set(row['other'])))} |")
    unprobed = sum(bool(cause.get("unprobed")) for cause in found.get("causes", []))
    return lines + ["", _in_all(per_definition, len(found.get("causes", [])), unprobed), "", _time_line(seconds), ""]


def _time_line(seconds: dict[str, float]) -> str:
    """Where the items' time went: all of it (summed over the workers), and the share of the properties that did not
    pass."""
    share = seconds["not passed"] / seconds["all"] if seconds["all"] else 0.0
    return (f"Items' time: {seconds['all']:.0f} s over the workers, {seconds['not passed']:.0f} s ({100 * share:.0f}%) "
            "in the properties that did not pass.")


def _in_all(per_definition: dict[str, dict], causes: int, unprobed: int = 0) -> str:
    """One line for a findings table's row: definitions, examples per definition, what did not run or pass, and
    the root causes (``unprobed`` of them the failures the probes' budget left, one entry per property)."""
    rows = list(per_definition.values())
    if not rows:
        return "In all: no property ran."
    examples = sorted(row["examples"] for row in rows)
    unstarted = sum(row["unstarted"] for row in rows)
    not_passed = sum(len(set(row["other"])) for row in rows)
    return (f"In all: {len(rows)} definitions, {sum(row['passed'] for row in rows)} properties passed over "
            f"{sum(examples)} examples ({examples[0]} to {examples[-1]} per definition); "
            f"properties left unstarted by the time budget: {unstarted}; not passed: {not_passed}; "
            f"root causes: {causes}"
            + (f", {unprobed} of them failures left unprobed, one entry per property" if unprobed else "") + ".")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="run report folders (reports/RUN_ID)")
    for folder in parser.parse_args().folders:
        if (folder / "report.json").is_file():
            print("\n".join(digest(folder)))


if __name__ == "__main__":
    main()
