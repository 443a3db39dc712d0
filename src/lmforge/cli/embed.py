"""``lmforge embed``: sentence embeddings of a text file, written as a (N, D) float32 ``.npy``.

Input: one text per non-empty line (``.txt``), or JSON lines with a ``text`` field (``.jsonl``). Row i of
the output is the embedding of text i.

Example::

    $ lmforge convert from-hf ~/all-MiniLM-L6-v2 runs/minilm
    $ lmforge embed --model runs/minilm --input sentences.txt --output vecs.npy
    $ lmforge embed --model runs/minilm --input sentences.txt --output l3.npy --layer 3 --pooling cls --no-normalize
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmforge.cli._embedding_args import add_model_flags, parse_layer
from lmforge.cli._price_args import add_price_tag_flags
from lmforge.cli.main import UserError, plain_warnings, require_path
from lmforge.embeddings.encoder import load_encoder
from lmforge.embeddings.index import read_docs
from lmforge.utils.io import atomic_save_npy
from lmforge.utils.lock import remove_stale_temporaries


def run(args) -> int:
    if not str(args.output).endswith(".npy"):
        raise UserError(f"--output {args.output}: use a .npy file name")
    texts = read_docs(require_path(args.input, "--input"))
    if not texts:
        raise UserError(f"--input {args.input}: no texts")
    with plain_warnings("embed"):
        encoder = load_encoder(args.model, device=args.device, max_length=args.max_length)
    vectors = encoder.encode(texts, pooling=args.pooling, layer=parse_layer(args.layer), normalize=args.normalize,
                             batch_size=args.batch_size, progress=not args.quiet)
    out = Path(args.output)
    remove_stale_temporaries(out.parent, out.name)  # a killed earlier run's half-written copy
    atomic_save_npy(out, vectors)
    print(f"wrote {out}: {vectors.shape[0]} x {vectors.shape[1]} float32")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("embed", help="sentence embeddings of a text file -> .npy",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, metavar="FILE", help=".txt (one text per line) or .jsonl (text)")
    parser.add_argument("--output", required=True, metavar="FILE.npy", help="where to write the (N, D) array")
    add_model_flags(parser)
    parser.add_argument("--no-normalize", dest="normalize", action="store_false",
                        help="keep raw (unnormalised) vectors")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_price_tag_flags(parser, "embed")
    parser.set_defaults(func=run)
