"""Time the kernel on a GPU, per definition, against another copy of ``kernel/`` (say, the revision before a change).

    python benchmarks/kernel_speed.py                                  # the seed definition, this tree's kernel
    python benchmarks/kernel_speed.py --definition=all                 # every built-in definition
    python benchmarks/kernel_speed.py --baseline=old/kernel            # and a copy of another kernel/ package

A copy of another revision's package: ``mkdir -p old/kernel && for f in __init__ _kernel _launch
_interpreter_compat; do git show REV:kernel/$f.py > old/kernel/$f.py; done``. A baseline without
``for_definition`` is timed on the seed definition only. Each row: the median of ``triton.testing.do_bench``
over one call (validation included, as callers see it) on a batch of sequences of one length in a shuffled pool.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gqa_decode_fuzz.generation.cases import DecodeCase, build  # noqa: E402
from gqa_decode_fuzz.reference.definitions import DECODE, SEED, select  # noqa: E402

SHAPES = ((1, 512), (16, 1024), (64, 1024), (64, 4096))  # (batch, tokens per sequence)


def load_package(path: Path, name: str):
    """Import the kernel package at ``path`` under ``name`` (so that it does not shadow ``kernel``)."""
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py", submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def served(package, definition):
    """The package's function for ``definition``, or None where it serves only the seed's."""
    if hasattr(package.run, "for_definition"):
        return package.run.for_definition(definition)
    return package.run if definition == SEED else None


def milliseconds(function, definition, batch: int, tokens: int) -> float:
    import triton.testing

    case = DecodeCase(lengths=(tokens,) * batch, definition=definition.name, seed=batch)
    arguments = build(case, "cuda").arguments()
    function(*arguments)  # compiles
    return triton.testing.do_bench(lambda: function(*arguments), return_mode="median")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--definition", default=SEED.name, help="a name, a list of names, a .json file, or all")
    parser.add_argument("--baseline", type=Path, help="another copy of the kernel/ package to time beside this one")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (interpreter timings say nothing about the GPU)")
    packages = {"this tree": load_package(ROOT / "kernel", "kernel")}
    if args.baseline:
        packages["baseline"] = load_package(args.baseline.resolve(), "gqa_kernel_baseline")
    print("| definition | batch | tokens | " + " | ".join(f"{name} ms" for name in packages) + " |")
    print("|---|---:|---:|" + "---:|" * len(packages))
    for definition in select(args.definition, ROOT, op_types=(DECODE,), reason="the kernel serves decode only"):
        for batch, tokens in SHAPES:
            cells = []
            for package in packages.values():
                function = served(package, definition)
                cells.append("-" if function is None else f"{milliseconds(function, definition, batch, tokens):.4f}")
            print(f"| {definition.name} | {batch} | {tokens} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
