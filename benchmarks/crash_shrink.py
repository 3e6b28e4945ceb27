"""How long an isolated kernel that kills its process takes to fail and shrink: the central property, one process
(``-n 0``), run ``--repeat`` times for each ``--impl``, in this checkout and in each ``--before`` checkout.

    python benchmarks/crash_shrink.py [--impl tests/impls/process_faults.py:exits ...] [--repeat 3]
                                      [--before DIR ...] [--device cpu|cuda] [--max-examples 30]

Every crash costs the child that served it, and shrinking replays the crash again and again, so this is the time
the child replacements take (``engine/isolated_impl.py``). Prints, per checkout and target, pytest's seconds for
each run (the runs of the checkouts interleaved), their median, and the child restarts the header counted.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROPERTY = "properties/test_decode.py::test_output_and_lse_within_error_bound"


def _run(checkout: Path, impl: str, device: str, max_examples: int) -> tuple[float, int | None, str]:
    """One run in ``checkout``: pytest's seconds, the child restarts, and its last line."""
    with tempfile.TemporaryDirectory(prefix="gqa-crash-shrink-") as failures:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GQA_DECODE_", "PYTEST_"))}
        # the checkout's own packages, not an installed checkout's: this checkout's namespace.sh, run there
        command = ["bash", "-c", f'. "{ROOT}/benchmarks/namespace.sh" && exec "$0" "$@"', sys.executable,
                   "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", PROPERTY, "--hypothesis-profile=ci",
                   f"--max-examples={max_examples}", f"--impl={impl}", f"--device={device}", "--run-report=none",
                   f"--failures-dir={failures}"]
        result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    seconds = re.search(r" in ([\d.]+)s", result.stdout)
    restarts = re.search(r"(\d+) child restarts", result.stdout)
    last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    return (float(seconds.group(1)) if seconds else float("nan"), int(restarts.group(1)) if restarts else None,
            last)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", nargs="+", default=["tests/impls/process_faults.py:exits"],
                        help="isolated targets that kill their process on some inputs")
    parser.add_argument("--before", nargs="*", default=[], type=Path, help="older checkouts to compare")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-examples", type=int, default=30)
    options = parser.parse_args(argv)
    checkouts = [ROOT, *(path.resolve() for path in options.before)]
    runs: dict[tuple[Path, str], list[tuple[float, int | None, str]]] = {}
    for _ in range(options.repeat):
        for impl in options.impl:
            for checkout in checkouts:
                runs.setdefault((checkout, impl), []).append(_run(checkout, impl, options.device,
                                                                  options.max_examples))
    print(f"{'checkout':<28}{'impl':<40}{'median s':>9}{'restarts':>9}  runs (s); last line")
    for (checkout, impl), done in runs.items():
        seconds = [s for s, _, _ in done]
        name = "this" if checkout == ROOT else checkout.name
        print(f"{name:<28}{impl:<40}{statistics.median(seconds):>9.2f}{str(done[-1][1]):>9}  "
              f"{', '.join(f'{s:.2f}' for s in seconds)}; {done[-1][2][:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
