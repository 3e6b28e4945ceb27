"""``gqa-decode-fuzz``: the suite's console script, one subcommand per module of this package.

``main`` reads the subcommand and hands its arguments to that module's ``run``. Anything after a lone ``--`` is
passed through untouched (``args.passthrough``: extra pytest arguments for ``check``). Every problem a
subcommand meets comes back as exit status 2 with one line on stderr, never a traceback: a loop that calls
the script reads the status, and a person reads the line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

ERROR = 2

# subcommand: the module of this package that owns it (``HELP``, ``add_arguments(parser)``, ``run(args) -> int``)
SUBCOMMANDS = {
    "check": "check",
    "merge-reports": "merge",
}


class CommandError(Exception):
    """A problem a subcommand names in one line (exit status 2)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gqa-decode-fuzz", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        module.add_arguments(commands.add_parser(name, help=module.HELP, description=module.__doc__,
                                                 formatter_class=argparse.RawDescriptionHelpFormatter))
        commands.choices[name].set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; its exit status (2 for any error, with one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse has printed its usage line and message
        return ERROR if exit_.code else 0
    args.passthrough = passthrough
    try:
        return args.run(args)
    except CommandError as error:
        print(f"gqa-decode-fuzz {args.command}: error: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"gqa-decode-fuzz {args.command}: interrupted", file=sys.stderr)
    except Exception as error:  # noqa: BLE001 - a loop gets a status and one line, never a traceback
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(f"gqa-decode-fuzz {args.command}: error: {type(error).__name__}: {first}", file=sys.stderr)
    return ERROR
