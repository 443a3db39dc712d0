"""Flags shared by the representation commands (embed, index, probe, neighbors)."""

from __future__ import annotations

from pathlib import Path

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


def load_encoder(args):
    from lmforge.embeddings import SentenceEncoder

    folder = Path(args.model)
    if not folder.is_dir():
        raise UserError(f"--model {folder}: not a folder (convert a Hugging Face model with `lmforge convert from-hf`)")
    try:
        return SentenceEncoder.load(folder, device=args.device, max_length=args.max_length)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None


EMBEDDING_LOSSES = ("mnrl", "triplet", "cosine")


def run_embedding_finetune(args) -> int:
    """``lmforge finetune --task embedding``: Sentence-BERT training from finetune's parsed flags.

    Reads ``model, train, out`` (required) and, when present, ``eval, loss, tokenizer, random_init, pooling,
    max_steps, epochs, batch_size, lr, warmup_ratio, seed, max_length, progress`` (finetune parses with
    ``argument_default=SUPPRESS``, so absent flags are absent attributes).
    """
    from lmforge.embeddings.sbert import finetune_embedding

    def flag(name, default=None):
        value = getattr(args, name, None)
        return default if value is None else value

    for name in ("model", "train", "out"):
        if flag(name) is None:
            raise UserError(f"--task embedding needs --{name}")
    loss = flag("loss", "mnrl")
    if loss not in EMBEDDING_LOSSES:
        raise UserError(f"--loss {loss!r}: use one of {', '.join(EMBEDDING_LOSSES)}")
    epochs = flag("epochs", 1)
    result = finetune_embedding(
        flag("model"), flag("train"), out=flag("out"), eval=flag("eval"), loss=loss, tokenizer=flag("tokenizer"),
        random_init=bool(flag("random_init", False)), pooling=flag("pooling", "mean"),
        max_steps=flag("max_steps"), epochs=max(1, int(round(epochs))), batch_size=flag("batch_size", 16),
        lr=flag("lr", 2e-5), warmup=flag("warmup_ratio", 0.1), seed=flag("seed", 0),
        max_length=flag("max_length"), progress=bool(flag("progress", True)))
    after = result["after"]
    shown = {k: after[k] for k in ("spearman", "recall@1", "recall@10", "mrr") if after.get(k) is not None}
    print(f"done: {after['steps']} steps, loss {after['loss']:.4f}; " +
          ", ".join(f"{k} {v:.4f}" for k, v in shown.items()) + f"; model -> {after['model_dir']}")
    return 0
