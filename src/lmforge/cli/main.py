"""The ``lmforge`` command line.

Every module in this package that defines ``register(subparsers)`` adds one verb, so a new command is a
new file: nothing here needs editing. Each verb sets ``func`` on its parser; that function receives the
parsed arguments and returns an exit code.

Example::

    $ lmforge --help
    $ lmforge model info gpt-tiny
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import sys
import warnings

import lmforge
from lmforge.errors import UserInputError

# The CLI's name for a bad-input error: the library raises the same class, printed as one line, exit code 2.
UserError = UserInputError


@contextlib.contextmanager
def plain_warnings(verb: str):
    """Show Python warnings as one ``lmforge VERB: warning:`` line each, without the library's source
    line. Under torchrun only rank 0 prints: every rank would repeat the same warning."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if os.environ.get("RANK", "0") == "0":
            print(f"lmforge {verb}: warning: {message}", file=sys.stderr, flush=True)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmforge",
        description="Transformer language models: build, pre-train, fine-tune, prompt, embed.",
    )
    parser.add_argument("--version", action="version", version=f"lmforge {lmforge.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    package = importlib.import_module("lmforge.cli")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name == "main" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"lmforge.cli.{info.name}")
        if hasattr(module, "register"):
            module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args.func(args) or 0)
    except (UserError, FileNotFoundError, ValueError) as exc:
        # Validation errors are written to name the file/field; a traceback would bury that.
        print(f"lmforge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
