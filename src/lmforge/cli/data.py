"""``lmforge data``: tokenise corpora into shards, inspect or verify them.

Example::

    $ lmforge data prepare --tokenizer tok/ --out data/corpus --val-fraction 0.01 corpus/*.txt
    $ lmforge data info data/corpus --verify
"""

from __future__ import annotations

import json
import sys
import warnings

from lmforge.cli.main import UserError
from lmforge.cli.tokenizer import HELP
from lmforge.data.prepare import prepare, read_manifest, verify


def _prepare(args) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manifest = prepare(args.inputs, args.tokenizer, args.out, val_fraction=args.val_fraction, seed=args.seed,
                           text_field=args.text_field, errors=args.errors, dtype=args.dtype,
                           shard_mb=args.shard_mb, overwrite=args.overwrite, progress=not args.no_progress)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    _summary(args.out, manifest)
    return 0


def _summary(folder, manifest) -> None:
    splits = manifest["splits"]
    print(f"{folder}: {manifest['dtype']}, {manifest['documents_read']:,} documents read, "
          f"tokenizer {manifest['tokenizer']['kind']} ({manifest['tokenizer']['vocab_size']:,} tokens)")
    for name, s in splits.items():
        print(f"  {name:5s} {s['tokens']:>14,} tokens {s['documents']:>10,} documents {s['shards']:>5} shards")


def _info(args) -> int:
    manifest = read_manifest(args.folder)
    if args.json:
        print(json.dumps(manifest, indent=1))
    else:
        _summary(args.folder, manifest)
    if args.verify:
        problems = verify(args.folder)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        if problems:
            raise UserError(f"{len(problems)} shard file(s) failed verification")
        print("  all checksums match")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help="tokenise corpora into shards for training",
                                   description="Tokenise corpora into sharded token files and inspect them.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser(
        "prepare", help="tokenise INPUTS into uint16/uint32 shards + manifest.json", formatter_class=HELP,
        description="Tokenise INPUTS (.txt: empty line = document boundary; .jsonl; .csv/.tsv; .parquet; "
                    "any of them .gz/.zst; files, globs or folders) with all cores into OUT/train and "
                    "OUT/val shards. Rerunning the same command resumes and skips finished shards.")
    p.add_argument("inputs", nargs="+", metavar="INPUTS", help="files, globs or folders")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder or file")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--val-fraction", type=float, default=0.01, help="fraction of documents for validation; at least one "
                   "document when there are two different ones")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/val assignment")
    p.add_argument("--text-field", default="text", help="JSONL field / CSV, TSV, Parquet column with the text")
    p.add_argument("--errors", choices=("strict", "replace"), default="strict",
                   help="non-UTF-8 bytes: fail (naming file and byte offset) or replace with U+FFFD")
    p.add_argument("--dtype", choices=("auto", "uint16", "uint32"), default="auto",
                   help="token storage; auto = uint16 when the vocabulary fits in 65,536 ids")
    p.add_argument("--shard-mb", type=float, default=64.0, help="MB of input text per shard")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an --out folder prepared from other inputs or settings")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=_prepare)

    p = verbs.add_parser("info", help="summary of a prepared folder", formatter_class=HELP)
    p.add_argument("folder", help="output folder of `lmforge data prepare`")
    p.add_argument("--verify", action="store_true", help="re-hash every shard against the manifest")
    p.add_argument("--json", action="store_true", help="print the whole manifest")
    p.set_defaults(func=_info)
