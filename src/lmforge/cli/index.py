"""``lmforge index``: build a dense retrieval index over documents, and search it by cosine similarity.

Example::

    $ lmforge index build --model runs/minilm --docs verses.txt --out runs/verses-index
    $ lmforge index search --index runs/verses-index --query "God created the heavens" -k 5

Search is exact (normalised embeddings, one matrix product) unless the index was built with
``--backend faiss`` (HNSW graph, approximate; needs ``pip install faiss-cpu``), which pays off past a few
million documents.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmforge.cli._embedding_args import add_model_flags, parse_layer
from lmforge.cli.main import UserError, require_path
from lmforge.embeddings import SentenceEncoder
from lmforge.embeddings.encoder import load_encoder
from lmforge.embeddings.index import (
    BACKENDS,
    VectorIndex,
    build_index,
    faiss_available,
    read_docs,
)
from lmforge.prompting.rag import encoder_identity


def _build(args) -> int:
    if args.backend == "faiss" and not faiss_available():
        raise UserError("--backend faiss needs faiss (pip install faiss-cpu); or use --backend exact")
    docs = read_docs(require_path(args.docs, "--docs"))
    if not docs:
        raise UserError(f"--docs {args.docs}: no documents")
    encoder = load_encoder(args.model, device=args.device, max_length=args.max_length)
    index = build_index(encoder, docs, pooling=args.pooling, layer=parse_layer(args.layer), batch_size=args.batch_size,
                        backend=args.backend, progress=not args.quiet,
                        # the encoder's folder and weights' sha256: a query must be encoded by the same model
                        meta={**encoder_identity(args.model), "max_length": encoder.max_length})
    index.save(args.out)
    print(f"indexed {len(index)} documents ({index.vectors.shape[1]}-d, {args.backend}) -> {args.out}")
    return 0


def _search(args) -> int:
    index = VectorIndex.load(require_path(args.index, "--index", folder=True))
    model = args.model or index.meta.get("model")
    if not model or not Path(model).is_dir():
        raise UserError(f"the index's model folder {model!r} is gone; pass --model DIR (the same model)")
    encoder = SentenceEncoder.load(model, device=args.device, max_length=index.meta.get("max_length"))
    query = encoder.encode([args.query], pooling=index.meta.get("pooling"), layer=index.meta.get("layer", -1))
    if query.shape[1] != index.vectors.shape[1]:
        raise UserError(f"model {model} gives {query.shape[1]}-d vectors but the index holds "
                        f"{index.vectors.shape[1]}-d ones: use the model the index was built with")
    hits = index.search(query, args.k)[0]
    for rank, (doc_id, text, score) in enumerate(hits, 1):
        if args.json:
            print(json.dumps({"rank": rank, "id": doc_id, "score": round(score, 6), "text": text}, ensure_ascii=False))
        else:
            print(f"{rank:>3}  {score:.4f}  [{doc_id}] {text}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("index", help="build and search a dense retrieval index", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    p = verbs.add_parser("build", help="embed documents into an index folder")
    p.add_argument("--docs", required=True, metavar="FILE", help=".txt (one document per line) or .jsonl (text)")
    p.add_argument("--out", required=True, metavar="DIR", help="index folder to write")
    add_model_flags(p)
    p.add_argument("--backend", default="exact", choices=BACKENDS, help="exact (default) or faiss HNSW")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_build)
    p = verbs.add_parser("search", help="top-k documents for a query")
    p.add_argument("--index", required=True, metavar="DIR", help="folder written by `index build`")
    p.add_argument("--query", required=True, help="query text")
    p.add_argument("-k", type=int, default=5, help="number of results (default: 5)")
    p.add_argument("--model", default=None, metavar="DIR", help="model folder (default: the one recorded at build)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--json", action="store_true", help="one JSON object per hit")
    p.set_defaults(func=_search)
