"""The ``lmforge`` command line.

Every module in this package that defines ``register(subparsers)`` adds one verb, and has a row in the verb
table (:mod:`lmforge.cli._verbs`: its module and one-line help). ``lmforge``, ``lmforge --help`` and a mistyped
verb are answered from that table without importing any verb module; ``lmforge VERB ...`` imports only
``VERB``'s module and builds only its parser. Each verb sets ``func`` on its parser; that function receives the
parsed arguments and returns an exit code.

Each verb declares its flags one ``add_argument`` call at a time, so parser declarations look alike from verb
to verb (a duplicate-code scan pairs them by shape); they are data, not repeated logic, and stay beside the verb
they describe.

Every command takes ``--threads N``: torch's intra-op threads for the command (``torch.set_num_threads``),
added here to each verb that does not define a ``--threads`` of its own.

Errors: a :class:`lmforge.errors.LmforgeError` (bad input: a flag, a file, a field) is printed as one line,
``lmforge VERB: error: ...``, with exit code 2 (3 when the machine refused: a full disk, a locked run folder).
Any other exception is a bug and keeps its traceback. A flag mistake is the same one line from the verb's own
parser, with the closest of its flags (``unknown flag --max-stpes; did you mean --max-steps?``); flags are
never matched by prefix (:class:`Parser`).

Example::

    $ lmforge --help
    $ lmforge model info gpt-tiny
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import pkgutil
import re
import sys
import warnings
from pathlib import Path
from typing import Iterable

import lmforge
from lmforge.cli._verbs import VERBS
from lmforge.errors import (
    EXIT_ENVIRONMENT,
    EXIT_INTERRUPTED,
    EXIT_USER,
    EnvironmentFault,
    InputFileNotFound,
    LmforgeError,
    RunLocked,
    UserInputError,
)
from lmforge.utils.folder_kinds import MODELS, require_kind
from lmforge.utils.runs import model_folder

EXIT_CODES = """exit codes:
  0    success
  1    a bug in lmforge (its traceback is printed); bench and quickstart also return 1 when a part failed
  2    a problem with the input: a flag, a file, a folder (one line: lmforge COMMAND: error: ...)
  3    the machine refused: a full disk, a read-only folder, a run folder held by another process
  130  interrupted (Ctrl-C); pretrain and finetune first save a checkpoint (143: the same for SIGTERM)"""

# The CLI's name for a bad-input error; any LmforgeError is printed the same way.
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


def model_argument(verb: str, path: str | Path, kinds: Iterable[str] = MODELS) -> Path:
    """``--model PATH`` as a model folder: a run folder means its ``best/``, else its ``model/``, and the
    choice is said on stderr. A folder of a kind not in ``kinds`` (see :mod:`lmforge.utils.folder_kinds`) is
    refused in one line that says what it is, before anything is loaded or written."""
    folder, picked = model_folder(path)
    require_kind(folder, kinds, verb, "--model")  # before the note: a refusal is the only line
    if picked:
        what = "its best evaluation" if folder.name == "best" else "its final model"
        print(f"lmforge {verb}: using {folder} ({what})", file=sys.stderr, flush=True)
    return folder


def require_path(path: str | Path, flag: str, folder: bool = False) -> Path:
    """``path`` if it exists (as a folder when ``folder``), else InputFileNotFound naming ``flag``: checked
    before a library call whose own error would not be a one-line user error."""
    path = Path(path)
    wanted, other = ("folder", "file") if folder else ("file", "folder")
    if path.exists() and path.is_dir() != folder:
        raise UserInputError(f"{flag} {path}: is a {other}, not a {wanted}; give a {wanted}")
    if not (path.is_dir() if folder else path.is_file()):
        raise InputFileNotFound(f"{flag} {path}: no such {wanted}")
    return path


class Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes are one line, ``lmforge VERB: error: ...``, exit 2.

    No prefix matching (``--max-step`` is not ``--max-steps``): an abbreviation silently accepted today becomes
    ambiguous the day a verb gains a flag. Sub-verbs' parsers are of this class too (argparse makes a
    subparser of its parent's class), so each verb reports its own unknown flags, with the closest of its own
    option strings as a suggestion, instead of the top-level usage."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)  # for error(): the words this parser saw
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # here, not at the top level: this parser knows the flags the user meant
            self.error(self.unknown_message(extras))
        return namespace, extras

    def _own_flags(self) -> list[str]:
        return [option for option in self._option_string_actions if option.startswith("--")]

    def _unknown_flags(self) -> list[str]:
        """The long flags among this parser's own words (up to its sub-verb) that it does not define."""
        verbs = {name for action in self._actions if isinstance(action, argparse._SubParsersAction)
                 for name in action.choices}
        unknown = []
        for word in getattr(self, "_words", []):
            if word == "--" or word in verbs:
                break
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and flag not in self._option_string_actions:
                unknown.append(flag)
        return unknown

    def unknown_message(self, extras: list[str]) -> str:
        """The error for words this parser does not know: the first unknown flag and its closest flag."""
        flags = [word for word in extras if word.startswith("-") and word != "-"]
        if not flags:
            return f"unexpected argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}"
        flag = flags[0].split("=", 1)[0]
        close = difflib.get_close_matches(flag, self._own_flags(), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"see {self.prog} --help"
        return f"unknown flag {flag}; {hint}"

    def _refused_verb(self, message: str) -> bool:
        """Whether ``message`` refuses the word in a verb's place: the flags after a mistyped verb are the meant
        verb's, not this parser's, so the verb is the mistake to name (``lmforge fintune --model x``)."""
        names = [argparse._get_action_name(action) for action in self._actions
                 if isinstance(action, argparse._SubParsersAction)]
        return any(message.startswith(f"argument {name}: invalid choice:") for name in names)

    def error(self, message: str):
        """One line on stderr and exit 2: the usage is what ``--help`` is for. An unknown flag is reported
        before what it caused (a typo'd required flag would otherwise read as a missing one)."""
        unknown = [] if self._refused_verb(message) else self._unknown_flags()
        if unknown:
            message = self.unknown_message(unknown)
        else:
            message = _suggest_choice(message)
        self.exit(EXIT_USER, f"{self.prog}: error: {message}\n")


def _suggest_choice(message: str) -> str:
    """argparse's ``invalid choice: 'x' (choose from ...)`` with the closest choice first, when there is one."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not found:
        return message
    choices = re.findall(r"'([^']*)'", found.group(2))
    close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.6)
    if not close:
        return message
    return f"{message[:found.start()]}invalid choice: {found.group(1)!r}; did you mean {close[0]!r}? " \
           f"(choose from {found.group(2)})"


THREADS_HELP = "torch intra-op threads for this command (torch.set_num_threads; default: torch's own, one per core)"


def _add_threads(parser: argparse.ArgumentParser) -> None:
    """``--threads`` on every leaf command (a verb's sub-verbs get it, not the verb that only dispatches)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for sub in set(action.choices.values()):
            _add_threads(sub)
    if not subs and "--threads" not in parser._option_string_actions:
        parser.add_argument("--threads", type=int, default=None, metavar="N", help=THREADS_HELP)


def set_threads(threads: int | None) -> None:
    """Apply ``--threads``: at least 1, else a one-line error."""
    if threads is None:
        return
    if threads < 1:
        raise UserInputError(f"--threads {threads}: must be >= 1")
    import torch

    torch.set_num_threads(threads)


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = Parser(
        prog="lmforge",
        description="Transformer language models: build, pre-train, fine-tune, prompt, embed.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lmforge {lmforge.__version__}")
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND")


def verb_table_parser() -> argparse.ArgumentParser:
    """The top-level parser with every verb listed from :data:`VERBS` and none of their modules imported: it
    answers ``lmforge``, ``--help`` and ``--version``, and refuses a mistyped verb with the closest one."""
    parser, subparsers = _top_parser()
    for name, verb in VERBS.items():
        subparsers.add_parser(name, help=verb.help)
    return parser


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Given the ``verb`` about to run, only its module is imported and only its
    parser built (each verb module imports what it runs: all of them together take many seconds to import); a
    word that is no verb gets :func:`verb_table_parser`, which refuses it. Without ``verb``, every verb module
    in this package is imported and registered (the whole tree, for tests and docs)."""
    if verb is not None and verb not in VERBS:
        return verb_table_parser()
    parser, subparsers = _top_parser()
    if verb is not None:
        names = [VERBS[verb].module]
    else:
        package = importlib.import_module("lmforge.cli")
        names = [info.name for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name)
                 if info.name != "main" and not info.name.startswith("_")]
    for name in names:
        module = importlib.import_module(f"lmforge.cli.{name}")
        if hasattr(module, "register"):
            module.register(subparsers)
    for sub in set(subparsers.choices.values()):
        _add_threads(sub)
    return parser


def _verb_word(words: list[str]) -> str | None:
    """The verb in a command line: its first word, unless that is a flag (``lmforge --help finetune`` is the
    top-level help, with every verb)."""
    return words[0] if words and not words[0].startswith("-") else None


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    verb = _verb_word(words)
    parser = verb_table_parser() if verb is None else build_parser(verb)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    from lmforge.cli._load_args import load_checks_of  # here: it imports torch, which --help never needs
    from lmforge.cli._price_args import priced

    try:
        set_threads(getattr(args, "threads", None))
        with load_checks_of(args), priced(args):
            return int(args.func(args) or 0)
    except LmforgeError as exc:
        # A user's error names the file/field to fix; a traceback would bury that. Anything else is a bug
        # and keeps its traceback (exit code 1).
        print(f"lmforge {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT if isinstance(exc, (EnvironmentFault, RunLocked)) else EXIT_USER
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
