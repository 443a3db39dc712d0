"""``lmforge neighbors``: nearest occurrences of a word in context vs a static word2vec/PPMI baseline.

Example::

    $ lmforge neighbors --model runs/minilm --corpus brown.txt --word play -k 3
    static (word2vec) neighbours of 'play': playing 0.81, game 0.77, ...
    [12] Chico Ruiz made a spectacular <play> on Alusik 's grounder
       0.83 [40] ... all-round excellent <play> .
"""

from __future__ import annotations

import argparse

from lmforge.cli._embedding_args import parse_layer
from lmforge.cli.main import UserError, require_path
from lmforge.embeddings.encoder import load_encoder
from lmforge.embeddings.neighbors import (
    contextual_neighbors,
    highlight,
    read_sentences,
    static_neighbors,
)


def run(args) -> int:
    sentences = read_sentences(require_path(args.corpus, "--corpus"), args.max_sentences)
    if not sentences:
        raise UserError(f"--corpus {args.corpus}: no sentences")
    if args.word.lower() not in {w.lower() for sentence in sentences for w in sentence}:
        raise UserError(f"--word {args.word!r} does not occur in the corpus")
    static = static_neighbors(sentences, args.word, k=args.static_k, method=args.static)
    method = args.static if args.static != "auto" else ("word2vec" if _has_gensim() else "ppmi")
    print(f"static ({method}) neighbours of {args.word!r}: " + ", ".join(f"{w} {c:.2f}" for w, c in static))
    encoder = load_encoder(args.model, device=args.device, max_length=args.max_length)
    for query in contextual_neighbors(encoder, sentences, args.word, k=args.k, layer=parse_layer(args.layer),
                                      queries=args.queries, batch_size=args.batch_size):
        print(f"\n[{query['sentence']}] {highlight(sentences[query['sentence']], query['position'])}")
        for s, i, cos in query["neighbors"]:
            print(f"   {cos:.3f} [{s}] {highlight(sentences[s], i)}")
    return 0


def _has_gensim() -> bool:
    try:
        import gensim  # noqa: F401
    except ImportError:
        return False
    return True


def register(subparsers) -> None:
    parser = subparsers.add_parser("neighbors", help="contextual nearest neighbours of a word vs a static baseline",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="DIR", help="model folder with its tokenizer")
    parser.add_argument("--corpus", required=True, metavar="FILE", help="text file, one sentence per line")
    parser.add_argument("--word", required=True, help="the word to look up")
    parser.add_argument("-k", type=int, default=3, help="contextual neighbours per occurrence (default: 3)")
    parser.add_argument("--queries", type=int, default=3, help="occurrences to show (default: 3)")
    parser.add_argument("--static", default="auto", choices=("auto", "word2vec", "ppmi"),
                        help="static baseline (default: word2vec when gensim is installed, else ppmi)")
    parser.add_argument("--static-k", type=int, default=10, help="static neighbours to list (default: 10)")
    parser.add_argument("--layer", default="-1", help="hidden state or scalar-mix (default: -1)")
    parser.add_argument("--max-sentences", type=int, default=None, help="read only the first N lines")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default: 32)")
    parser.add_argument("--max-length", type=int, default=None, help="truncate to this many tokens")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.set_defaults(func=run)
