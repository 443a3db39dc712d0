"""Flags shared by the representation commands (embed, index, probe, neighbors)."""

from __future__ import annotations

from lmforge.cli._load_args import add_load_flags, add_precision_flags
from lmforge.cli.main import UserError
from lmforge.embeddings.pooling import POOLINGS


def parse_layer(value: str) -> int | str:
    """``-1``, ``3`` or ``scalar-mix``."""
    if value == "scalar-mix":
        return value
    try:
        return int(value)
    except ValueError:
        raise UserError(f"--layer {value!r}: give an integer (0 = embeddings, -1 = last) or 'scalar-mix'") from None


def add_model_flags(parser, *, pooling: bool = True) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="model folder with its tokenizer "
                        "(lmforge save / lmforge convert from-hf output)")
    if pooling:
        parser.add_argument("--pooling", default=None, choices=POOLINGS,
                            help="sentence pooling (default: the model's embedding.json, else mean; last for GPT)")
    parser.add_argument("--layer", default="-1", help="hidden state: 0 = embeddings, -1 = output, or scalar-mix "
                        "(default: -1)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default: 32)")
    parser.add_argument("--max-length", type=int, default=None, help="truncate to this many tokens "
                        "(default: the model's max_seq_len)")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_load_flags(parser)
    add_precision_flags(parser)
