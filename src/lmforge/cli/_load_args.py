"""Flags of the commands that load a model folder: ``--no-verify`` and ``--allow-tokenizer-mismatch``.

:func:`lmforge.cli.main.main` runs every command inside :func:`load_checks_of`, so the flags reach each load the
command makes (through :func:`lmforge.model_folder.load_checks`) without being passed down call by call.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from lmforge.model_folder import load_checks


def add_load_flags(parser, tokenizer: bool = False) -> None:
    """``--no-verify`` (and, with ``tokenizer``, ``--allow-tokenizer-mismatch``) on a command's parser."""
    parser.add_argument("--no-verify", action="store_true", default=False,
                        help="skip checking the model folder's files against its manifest.json (sizes and sha256); "
                        "non-finite weights are refused either way")
    if tokenizer:
        parser.add_argument("--allow-tokenizer-mismatch", action="store_true", default=False,
                            help="use --tokenizer even if the model folder records another tokenizer")


def load_checks_of(args) -> AbstractContextManager:
    """The load checks a command's parsed flags ask for (flags a command lacks keep the defaults)."""
    return load_checks(verify=not getattr(args, "no_verify", False),
                       allow_tokenizer_mismatch=getattr(args, "allow_tokenizer_mismatch", False))
