"""``lmforge fill-mask``: the top-k fillers of a ``[MASK]`` (encoders: the mask; decoders: the next token; T5: a
sentinel), with their probabilities.

Example::

    $ lmforge fill-mask --model runs/bert/model "The capital of France is [MASK]." --top-k 5
"""

from __future__ import annotations

import json

import lmforge
from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import UserError, model_argument, plain_warnings
from lmforge.evaluation.fill_mask import fill_mask, score_candidates
from lmforge.tokenization import Tokenizer


def run(args) -> int:
    if args.top_k < 1:
        raise UserError(f"--top-k {args.top_k}: must be at least 1")
    folder = model_argument("fill-mask", args.model, ("model", "hf", "quantized"))
    if not (folder / "tokenizer.json").is_file():
        raise UserError(f"--model {folder}: no tokenizer.json (save the model with its tokenizer)")
    with plain_warnings("fill-mask"):
        model = lmforge.load(folder, device=args.device)
        if args.candidates:
            ranked = score_candidates(model, Tokenizer.load(folder), args.text,
                                      [c.strip() for c in args.candidates.split(",") if c.strip()])
            if args.json:
                print(json.dumps(ranked, ensure_ascii=False))
            for rank, r in enumerate(ranked if not args.json else [], 1):
                print(f"{rank:3d}  {r['log_likelihood']:10.4f}  {r['candidate']}  ({r['tokens']} tokens)")
            return 0
        fillers = fill_mask(model, Tokenizer.load(folder), args.text, args.top_k)
    if args.json:
        print(json.dumps(fillers, ensure_ascii=False))
        return 0
    for rank, f in enumerate(fillers, 1):
        print(f"{rank:3d}  {f['probability']:.4f}  {f['token']}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fill-mask", help="top-k fillers of a [MASK] with their probabilities (cloze probe)",
        description="Print the model's most probable fillers of the [MASK] in TEXT: an encoder fills its mask "
                    "token, a decoder predicts the token after the text before [MASK], T5 the span after its "
                    "first sentinel, BART the next token of its rewrite.")
    parser.add_argument("text", help="the text, with one [MASK] (a decoder may omit it: the next token)")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="model folder holding tokenizer.json, or a run folder (its best/, else its model/)")
    parser.add_argument("--top-k", type=int, default=10, help="how many fillers to print (default 10)")
    parser.add_argument("--candidates", default=None, metavar="A,B,...",
                        help="rank these fillers (any number of tokens each) by their log-likelihood in the blank "
                        "instead of listing the top-k tokens")
    parser.add_argument("--json", action="store_true", default=False,
                        help="print one JSON list of {token, id, probability} instead of the table")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    add_load_flags(parser)
    parser.set_defaults(func=run)
