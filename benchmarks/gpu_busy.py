"""Percentiles of a GPU-utilisation sample (``nvidia-smi --query-gpu=utilization.gpu ... -lms N`` output).

Usage: ``python benchmarks/gpu_busy.py SAMPLES.txt LABEL`` prints one line: the label, the samples' count, and
the utilisation's median, 90th percentile and mean over the samples taken while the GPU was busy at all (idle
start and end left out), so a run's figure is not diluted by its start-up.
"""

from __future__ import annotations

import statistics
import sys


def main(argv: list[str]) -> int:
    path, label = argv[1], " ".join(argv[2:]) or argv[1]
    with open(path, encoding="utf-8") as samples:
        values = [int(line) for line in samples if line.strip().isdigit()]
    busy = [v for v in values if v > 0]
    if not busy:
        print(f"{label}: {len(values)} samples, the GPU never busy")
        return 0
    busy.sort()
    p90 = busy[min(len(busy) - 1, int(0.9 * len(busy)))]
    print(f"{label}: {len(values)} samples of 200 ms, {len(busy)} busy; utilisation median {statistics.median(busy)}%,"
          f" p90 {p90}%, mean {statistics.fmean(busy):.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
