"""One sanitized call, outside pytest and Hypothesis: what the sanitized child answers for an implementation, and
what compute-sanitizer logged (GPU only).

The suite's sanitized examples (``--sanitize``) go through the same ``isolated_impl.Child``; this shows one call's
whole story when a run only shows its outcome:

    python3 benchmarks/sanitizer_probe.py tests/impls/reads_one_past.py:run [--tool memcheck] [--lengths 1 3,130]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from gqa_decode_fuzz.engine.isolated_impl import Child, Launch  # noqa: E402
from gqa_decode_fuzz.generation.cases import DecodeCase, build  # noqa: E402


def _one_call(child: Child, lengths: tuple[int, ...]) -> None:
    inputs = build(DecodeCase(lengths=lengths), "cuda", observe=False)
    start = time.perf_counter()
    try:
        output, lse = child.call(None, tuple(inputs.arguments()), {}, [])
        said = f"answered: output {tuple(output.shape)}, lse {tuple(lse.shape)}"
    except Exception as error:  # noqa: BLE001 - the answer sought
        said = f"{type(error).__name__}: {str(error)[:2500]}"
    print(f"-- lengths {lengths}: {time.perf_counter() - start:.1f} s, alive after: {child.alive}\n{said}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("impl")
    parser.add_argument("--tool", default="memcheck")
    parser.add_argument("--lengths", nargs="+", default=["1", "3,130"])
    options = parser.parse_args()
    start = time.perf_counter()
    child = Child(Launch(options.impl, ROOT, "cuda", sanitize=options.tool))
    print(f"sanitized child started in {time.perf_counter() - start:.1f} s")
    for text in options.lengths:
        if not child.alive:
            child = Child(Launch(options.impl, ROOT, "cuda", sanitize=options.tool))
        _one_call(child, tuple(int(n) for n in text.split(",")))
    print("-- sanitizer log so far:\n" + child._sanitizer_report()[-3000:])
    child.stop()


if __name__ == "__main__":
    main()
