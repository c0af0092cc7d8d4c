"""Command line entry point: ``gating-core COMMAND ...`` (the console script ``pip install``
creates), the same as ``python -m gating_core COMMAND ...``.

Each command lives in its own module under ``gating_core.commands`` and exposes
``register(subparsers)``, which adds its sub-parser and sets ``func`` to a callable taking the
parsed arguments and returning an exit code. Modules are imported lazily so that ``info`` does
not pay for scikit-learn or dask.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from gating_core import __version__

from gating_core.errors import GatingCoreError, describe_error, printable

# command name -> module under gating_core.commands
COMMANDS = {
    "info": "info",
    "train": "train",
    "gate": "gate",
    "evaluate": "evaluate",
    "library": "library_commands",
}


#: The exit status of every command (shown by --help).
EXIT_STATUS = ("exit status: 0 done; 1 a file or folder named on the command line (input or output) is "
               "missing, unreadable, damaged or unsuitable, or the work failed (with several input files: "
               "any of them); 2 the command line is wrong: a usage error, a value out of range, options "
               "that do not go together or that need a package not installed; "
               "130 interrupted.")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_program_name(),
        description="Automatic gating of flow cytometry data by marginal transfer learning.",
        epilog=EXIT_STATUS,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    registered = set()
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        if module_name in registered:
            continue
        module = importlib.import_module(f"gating_core.commands.{module_name}")
        module.register(subparsers)
        registered.add(module_name)
    for command in subparsers.choices.values():
        command.epilog = command.epilog or EXIT_STATUS
    return parser


def _program_name() -> str:
    """How the user called us, for usage lines: ``gating-core`` or ``python -m gating_core``."""
    launched_as = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m gating_core" if launched_as in ("__main__.py", "-m", "") else launched_as


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=first if first in COMMANDS else None)
    args = parser.parse_args(argv)
    _tolerant_streams()
    try:
        return int(args.func(args) or 0)
    except (GatingCoreError, OSError, UnicodeError) as exc:
        # A bad input (damaged file, unreadable path, file name that is not UTF-8, ...): one
        # line naming the file and the problem, no traceback, exit status 1 (EXIT_STATUS).
        # Programming errors still show one.
        if isinstance(exc, BrokenPipeError):
            return _broken_pipe()
        print(f"error: {printable(describe_error(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _broken_pipe() -> int:
    # Output piped into `head` and closed early: not an error of ours.
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def _tolerant_streams() -> None:
    """Let stdout / stderr show file names that are not valid UTF-8 (as \\xff) instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass
