"""``lmforge attention``: draw a model's attention maps on one text (:mod:`lmforge.models.attention_maps`).

Example::

    $ lmforge attention --model models/bert "The cat sat on the mat." --out maps/bert
    $ lmforge attention --model models/t5 "translate English to German: Hello" --target "Hallo" --out maps/t5
"""

from __future__ import annotations

import sys

import lmforge
from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import UserError, model_argument
from lmforge.models.attention_maps import MAX_TOKENS, attention_maps, check_length, draw_attention_maps
from lmforge.tokenization import Tokenizer


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "attention",
        help="draw a model's attention maps (every layer and head) on one text",
        description="Run a model once on TEXT and write its attention weights as heatmaps: DIR/KIND/layerLL-headHH.png "
                    "for every layer and head, and DIR/KIND-grid.png with all of them (rows: layers, columns: heads). "
                    "KIND is self for encoders and decoders; encoder, decoder and cross (decoder queries over the "
                    "source) for encoder-decoders. Texts over --max-tokens tokens are refused.",
    )
    parser.add_argument("text", metavar="TEXT", help="the text to run the model on (an encoder-decoder's source)")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="model folder holding tokenizer.json, or a run folder (then its best/, else its model/)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write the images into")
    parser.add_argument("--target", default=None, metavar="TEXT",
                        help="encoder-decoders: the decoder's input after its start token (default: the start "
                             "token alone)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, metavar="N",
                        help=f"refuse texts longer than N tokens, which would draw N x N maps per head "
                             f"(default {MAX_TOKENS})")
    add_load_flags(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.max_tokens < 1:
        raise UserError(f"--max-tokens {args.max_tokens}: must be at least 1")
    folder = model_argument("attention", args.model)
    if not (folder / "tokenizer.json").is_file():
        raise UserError(f"--model {folder}: no tokenizer.json (save the model with its tokenizer)")
    tokenizer = Tokenizer.load(folder)
    ids = tokenizer.encode(args.text)
    check_length(len(ids), args.max_tokens)  # before the model is loaded or anything is written
    target_ids = target_tokens = None
    if args.target is not None:
        target_ids = tokenizer.encode(args.target, add_special_tokens=False)
        check_length(len(target_ids) + 1, args.max_tokens, "--target")
    model = lmforge.load(folder)
    if args.target is not None:
        if model.config.arch != "encoder-decoder":
            raise UserError(f"--target is for encoder-decoder models; {folder} has arch={model.config.arch!r}")
        target_ids = [model._decoder_start_id(), *target_ids]
        target_tokens = [tokenizer.id_to_token(i) or str(i) for i in target_ids]
    tokens = [tokenizer.id_to_token(i) or str(i) for i in ids]
    maps = attention_maps(model, ids, tokens, target_ids, target_tokens)
    written = draw_attention_maps(maps, args.out, args.max_tokens)
    print(f"wrote {len(written)} images to {args.out}", file=sys.stderr)
    return 0
