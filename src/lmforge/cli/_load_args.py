"""Flags of the commands that load a model folder: ``--no-verify`` and ``--allow-tokenizer-mismatch``, and
for inference commands ``--dtype`` and ``--quantize``.

:func:`lmforge.cli.main.main` runs every command inside :func:`load_checks_of`, so the flags reach each load the
command makes (through :func:`lmforge.model_folder.load_checks` and :func:`lmforge.models.quantize.precision`)
without being passed down call by call.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack

from lmforge.model_folder import load_checks
from lmforge.models.quantize import DTYPES, QUANTIZE_CHOICES, precision


def add_load_flags(parser, tokenizer: bool = False) -> None:
    """``--no-verify`` (and, with ``tokenizer``, ``--allow-tokenizer-mismatch``) on a command's parser."""
    parser.add_argument("--no-verify", action="store_true", default=False,
                        help="skip checking the model folder's files against its manifest.json (sizes and sha256); "
                        "non-finite weights are refused either way")
    if tokenizer:
        parser.add_argument("--allow-tokenizer-mismatch", action="store_true", default=False,
                            help="use --tokenizer even if the model folder records another tokenizer")


def add_precision_flags(parser) -> None:
    """``--dtype`` and ``--quantize`` on an inference command's parser (dests ``precision_*``: other verbs' own
    ``--dtype`` flags mean other things)."""
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=None, dest="precision_dtype",
                        help="compute dtype of the loaded model: fp32, or bf16 (half the bytes per weight; fast on "
                        "CPUs with AVX512-BF16/AMX, warned about elsewhere); default: as saved (fp32)")
    parser.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None, dest="precision_quantize",
                        help="quantisation of the linear layers at load: int8 (per row; on x86 CPUs an integer "
                        "matmul, which also rounds the activations per call) or int4 (weight-only, per group of 32); a "
                        "folder saved by `lmforge quantize` loads as saved")


def load_checks_of(args) -> AbstractContextManager:
    """The load checks (and precision) a command's parsed flags ask for (flags a command lacks keep the defaults)."""
    stack = ExitStack()
    stack.enter_context(load_checks(verify=not getattr(args, "no_verify", False),
                                    allow_tokenizer_mismatch=getattr(args, "allow_tokenizer_mismatch", False)))
    stack.enter_context(precision(getattr(args, "precision_dtype", None), getattr(args, "precision_quantize", None)))
    return stack
