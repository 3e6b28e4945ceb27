"""What one isolated call costs: the same built case called in-process and through the isolated child, and where
the parent's time goes (cProfile of the isolated calls, the heaviest functions by own time).

    python benchmarks/isolated_call.py [--impl tests/impls/torch_float32.py:run] [--calls 300] [--device cuda]

(the package installed, or ``. benchmarks/namespace.sh`` with the checkout on ``PYTHONPATH``, as on the GPU image)

Prints the median and 90th percentile of a call in-process and isolated (the parent's wait for the child's answer
included, and the check for late writes that ends each example), then the profile of the isolated calls. The
case is the central property's default draw at the large case sizes, built once.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere


def _timed(call, calls: int, synchronize) -> list[float]:
    """Milliseconds of each of ``calls`` calls, the device waited for at each end."""
    spent = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        synchronize()
        spent.append((time.perf_counter() - start) * 1e3)
    return spent


def _line(name: str, spent: list[float]) -> str:
    ordered = sorted(spent)
    return (f"{name:<12}median {statistics.median(ordered):8.3f} ms   p90 {ordered[int(0.9 * len(ordered))]:8.3f} ms"
            f"   ({len(ordered)} calls)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="tests/impls/torch_float32.py:run")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--lengths", default="700,33,1,250,2048,17,90,5", help="the case's sequence lengths")
    options = parser.parse_args(argv)

    import torch

    from gqa_decode_fuzz.engine.isolated_impl import load_target_for
    from gqa_decode_fuzz.generation.cases import DecodeCase, build
    from gqa_decode_fuzz.reference.definitions import SEED

    device = torch.device(options.device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    case = DecodeCase(lengths=tuple(int(n) for n in options.lengths.split(",")), spare_pages=1000)
    inputs = build(case, device)
    in_process = load_target_for(options.impl, ROOT, device.type, isolated=False).serving(SEED)
    target = load_target_for(options.impl, ROOT, device.type, isolated=True)
    isolated = target.function  # the IsolatedImpl: its children, its check for late writes
    try:
        bound = target.serving(SEED)  # the suite's argument order, as the tests call it

        def isolated_example():
            bound(*inputs)
            isolated.check_returned()

        for call in (lambda: in_process(*inputs), isolated_example):  # first calls: compiles, the child's start
            _timed(call, 5, synchronize)
        print(f"{options.impl} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
              f"case {case}")
        print(_line("in-process", _timed(lambda: in_process(*inputs), options.calls, synchronize)))
        print(_line("isolated", _timed(isolated_example, options.calls, synchronize)))
        profiler = cProfile.Profile()
        profiler.enable()
        _timed(isolated_example, options.calls, synchronize)
        profiler.disable()
    finally:
        isolated.close()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
    print(f"the parent's own time over {options.calls} isolated calls, heaviest first:")
    print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
