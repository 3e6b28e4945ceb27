"""The suite's console script, ``gqa-decode-fuzz COMMAND``: one module per command, each with
``add_parser(subparsers)`` and ``run(args) -> int`` (the exit status).

In the repository this is the top-level folder ``cli`` (``python -m cli``); installed, it is
``gqa_decode_fuzz.cli`` and pyproject.toml's ``[project.scripts]`` calls ``main``.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from types import ModuleType

NAMESPACE = __name__.rpartition(".")[0]  # "gqa_decode_fuzz" installed, "" in the repository
COMMANDS = {"merge-reports": "merge"}  # command -> its module in this package

__all__ = ["COMMANDS", "main", "suite_module"]


def suite_module(name: str) -> ModuleType:
    """One of the suite's modules (``properties._plugin.report_merge``) wherever the suite is installed."""
    return importlib.import_module(f"{NAMESPACE}.{name}" if NAMESPACE else name)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command it names; its exit status."""
    parser = argparse.ArgumentParser(prog="gqa-decode-fuzz", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(f"{__name__}.{module}").add_parser(subparsers)
    args = parser.parse_args(argv)
    return args.run(args)
