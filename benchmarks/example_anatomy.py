"""Where a -x run's time to its first failure went, from its corpus record and its Triton cache.

    python benchmarks/example_anatomy.py LABEL RECORD.json [TRITON_CACHE_DIR]

RECORD is a ``--corpus-record`` file (tests/corpus/plugin.py), whose ``example_ms`` lists each example up to
the first failing one: its milliseconds and the gap before it (drawing, Hypothesis's own work, the next test's
setup). Prints one line of totals, the slowest examples, and, given the cache the run compiled into, how many
binaries Triton built per kernel (each a specialisation: a new stride, alignment or integer class compiles again).
Measures only.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

SLOWEST = 6


def summary(label: str, record: dict, cache: Path | None) -> list[str]:
    """The lines printed for one run."""
    examples = record.get("example_ms") or []
    if not examples:
        return [f"{label}: no examples recorded (the run did not start a property)"]
    spent = [ms for _, ms, _ in examples]
    gaps = [gap for _, _, gap in examples]
    lines = [
        f"{label}: {len(examples)} examples to the first failure in {record.get('first_example_to_failure')} s;"
        f" examples {sum(spent) / 1000:.2f} s (median {statistics.median(spent):.1f} ms, first {spent[0]:.0f} ms),"
        f" gaps {sum(gaps) / 1000:.2f} s (median {statistics.median(gaps):.1f} ms)",
    ]
    slowest = sorted(range(len(examples)), key=lambda i: -spent[i])[:SLOWEST]
    lines.append("  slowest: " + ", ".join(f"#{i} {examples[i][0]} {spent[i]:.0f} ms" for i in sorted(slowest)))
    if cache is not None and cache.is_dir():
        built = Counter(path.stem for path in cache.rglob("*.cubin"))
        lines.append("  compiled: " + (", ".join(f"{name} x{n}" for name, n in built.most_common()) or "none"))
    return lines


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    label, record_path = argv[0], Path(argv[1])
    try:
        record = json.loads(record_path.read_text() or "{}")
    except (OSError, ValueError) as error:
        print(f"{label}: no record ({error})")
        return 1
    cache = Path(argv[2]) if len(argv) == 3 else None
    print("\n".join(summary(label, record, cache)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
