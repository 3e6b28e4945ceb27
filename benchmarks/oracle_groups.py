"""The oracle's rows grouped by length: device time and host time per call for several group costs.

    python benchmarks/oracle_groups.py [--device cuda] [--cases 300] [--costs none,0,2048,4096,8192]

Draws ``--cases`` cases at the GPU profile's case sizes (a fixed seed: every cost sees the same cases), builds
them, and for each ``_GROUP_COST_SLOTS`` value (``none``: never cut, one batch padded to its longest row) runs the
float64 oracle on every case once to capture its graphs, then again under torch's profiler. Prints, per cost, the
padded token slots as a multiple of the cases' tokens, groups per call, the device's busy time per call (kernels,
copies and fills, summed; on CUDA) and the median host time of a call, the device synchronised after it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from statistics import median
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere


def drawn_cases(count: int, limits) -> list:
    """``count`` cases of the suite's central strategy at ``limits``, the same ones on every run."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from gqa_decode_fuzz.generation.strategies import decode_cases

    cases = []

    @seed(20261205)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=decode_cases(limits=limits))
    def collect(case):
        cases.append(case)

    collect()
    return cases[:count]


def measure(built: list, cost: int, device) -> dict:
    """One cost: padding, groups, device busy time and median host time per oracle call over ``built``."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from gqa_decode_fuzz.generation.oracles import oracle_of
    from gqa_decode_fuzz.reference import oracle

    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    graphed = oracle.graphs_enabled(device)
    with mock.patch.object(oracle, "_GROUP_COST_SLOTS", cost):
        tokens = padded = groups = 0
        for inputs in built:
            lengths = [b - a for a, b in zip(inputs.kv_indptr.tolist(), inputs.kv_indptr.tolist()[1:])]
            cut = oracle._length_groups(lengths, graphed)
            tokens += sum(lengths)
            padded += sum(oracle._padded_slots(len(g), max((lengths[r] for r in g), default=0), graphed) for g in cut)
            groups += len(cut)
            oracle_of(inputs)  # captures the graphs this cost's groups replay
        synchronize()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        host = []
        with profile(activities=activities) as profiler:
            for inputs in built:
                start = time.perf_counter()
                oracle_of(inputs)
                synchronize()
                host.append(time.perf_counter() - start)
    busy = sum(e.device_time_total for e in profiler.events() if e.device_type == DeviceType.CUDA)
    count = len(built)
    return {"padding": padded / max(tokens, 1), "groups": groups / count, "device_us": busy / count,
            "host_ms": 1e3 * median(host)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--costs", default="none,0,2048,4096,8192")
    options = parser.parse_args()

    import torch

    from gqa_decode_fuzz.generation.cases import build
    from gqa_decode_fuzz.runner.profiles import CASE_SIZES

    device = torch.device(options.device)
    limits = CASE_SIZES["large" if device.type == "cuda" else "small"]
    built = [build(case, device, observe=False) for case in drawn_cases(options.cases, limits)]
    print(f"the float64 oracle on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"{len(built)} cases at {limits}; cost: a group's price in padded token slots (none: never cut)")
    print(f"{'cost':>8}{'padding':>9}{'groups':>8}{'device us':>11}{'host ms':>9}")
    for cost in options.costs.split(","):
        row = measure(built, 10**12 if cost == "none" else int(cost), device)
        print(f"{cost:>8}{row['padding']:>9.2f}{row['groups']:>8.2f}{row['device_us']:>11.1f}{row['host_ms']:>9.3f}")


if __name__ == "__main__":
    main()
