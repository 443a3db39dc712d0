"""``lmforge tokenizer``: train a vocabulary, inspect encodings.

Example::

    $ lmforge tokenizer train --kind byte-bpe --family gpt --vocab-size 8192 --out tok/ corpus.txt
    $ lmforge tokenizer encode --tokenizer tok/ --tokens "Hello world"
    $ lmforge tokenizer decode --tokenizer tok/ 15496 995
"""

from __future__ import annotations

import argparse
import json
import sys

from lmforge.cli.main import UserError
from lmforge.tokenization import FAMILIES, KINDS, Tokenizer, train_tokenizer
from lmforge.utils.folder_kinds import MODELS, require_kind


class HELP(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: ...)" only where a default means something (not for None / False flags)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.required:
            return action.help
        return super()._get_help_string(action)


def _load(path):
    # Every folder that holds a tokenizer: its own, or a model's; run and shard folders keep theirs in tokenizer/.
    require_kind(path, ("tokenizer", "bilm", *MODELS), "tokenizer", "--tokenizer")
    return Tokenizer.load(path)


def _train(args) -> int:
    tok = train_tokenizer(args.files, kind=args.kind, vocab_size=args.vocab_size, family=args.family,
                          min_frequency=args.min_frequency, lowercase=args.lowercase, text_field=args.text_field,
                          # tokenizers' bars redraw with carriage returns: piped to a log they are blank lines
                          errors=args.errors, show_progress=not args.no_progress and sys.stderr.isatty())
    tok.save(args.out)
    print(f"saved {args.out}: {tok.kind} vocabulary of {tok.vocab_size:,} tokens, family {tok.family}")
    print("special token ids: " + json.dumps({k: v for k, v in tok.special_token_ids().items()
                                              if k != "sentinel_token_ids"}))
    if "sentinel_token_ids" in tok.special_token_ids():
        ids = tok.special_token_ids()["sentinel_token_ids"]
        print(f"sentinels: <extra_id_0>={ids[0]} ... <extra_id_{len(ids) - 1}>={ids[-1]}")
    return 0


def _texts(args) -> list[str]:
    if args.text:
        return args.text
    if sys.stdin.isatty():
        raise UserError("give TEXT arguments or pipe text on stdin")
    return [line.rstrip("\n") for line in sys.stdin]


def _encode(args) -> int:
    tok = _load(args.tokenizer)
    for text in _texts(args):
        enc = tok.backend.encode(text, args.pair, add_special_tokens=not args.no_special)
        if args.json:
            print(json.dumps({"ids": enc.ids, "tokens": enc.tokens, "offsets": enc.offsets,
                              "word_ids": enc.word_ids}, ensure_ascii=False))
        elif args.tokens:
            print(" ".join(f"{t}={i}" for t, i in zip(enc.tokens, enc.ids)))
        else:
            print(" ".join(map(str, enc.ids)))
    return 0


def _decode(args) -> int:
    tok = _load(args.tokenizer)
    lines = [" ".join(args.ids)] if args.ids else [line for line in sys.stdin if line.strip()]
    for line in lines:
        try:
            ids = [int(x) for x in line.replace(",", " ").split()]
        except ValueError:
            raise UserError(f"ids must be integers, got {line.strip()!r}") from None
        bad = [i for i in ids if not 0 <= i < tok.vocab_size]
        if bad:
            raise UserError(f"ids {bad[:5]} are outside the vocabulary [0, {tok.vocab_size})")
        print(tok.decode(ids, skip_special_tokens=not args.keep_special))
    return 0


def _info(args) -> int:
    tok = _load(args.tokenizer)
    print(json.dumps({"family": tok.family, "kind": tok.kind, "vocab_size": tok.vocab_size,
                      "special_tokens": tok.roles, **tok.special_token_ids()}, indent=2, ensure_ascii=False))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("tokenizer", help="train a tokenizer, encode/decode text",
                                   description="Train vocabularies (HF tokenizers) and inspect encodings.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser("train", help="train a vocabulary and write DIR/tokenizer.json", formatter_class=HELP,
                         description="Train a vocabulary on corpus files (.txt/.jsonl/.csv/.tsv/.parquet, "
                                     "optionally .gz/.zst; files, globs or folders) and save it to --out.")
    p.add_argument("files", nargs="+", metavar="FILES", help="corpus files, globs or folders")
    p.add_argument("--kind", choices=KINDS, default="byte-bpe", help="vocabulary model")
    p.add_argument("--vocab-size", type=int, default=8192, help="final vocabulary size, special tokens included")
    p.add_argument("--family", choices=list(FAMILIES), default=None,
                   help="special tokens of this model family (default by kind: byte-bpe gpt, bpe roberta, "
                        "wordpiece bert, unigram t5)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--min-frequency", type=int, default=2, help="minimum count of a merge/piece")
    p.add_argument("--lowercase", action="store_true", help="lower-case text (wordpiece)")
    p.add_argument("--text-field", default="text", help="JSONL field / CSV, TSV, Parquet column with the text")
    p.add_argument("--errors", choices=("strict", "replace"), default="strict",
                   help="non-UTF-8 bytes: fail (naming file and byte offset) or replace with U+FFFD")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.set_defaults(func=_train)

    p = verbs.add_parser("encode", help="print the ids (or tokens) of some text", formatter_class=HELP,
                         description="Encode TEXT arguments (or stdin, one text per line).")
    p.add_argument("text", nargs="*", metavar="TEXT", help="texts to encode (default: lines of stdin)")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder or file")
    p.add_argument("--pair", default=None, help="second sequence of a pair")
    p.add_argument("--no-special", action="store_true", help="do not add the family's special tokens")
    p.add_argument("--tokens", action="store_true", help="print token=id pairs")
    p.add_argument("--json", action="store_true", help="print ids, tokens, offsets and word ids as JSON")
    p.set_defaults(func=_encode)

    p = verbs.add_parser("decode", help="print the text of some ids", formatter_class=HELP,
                         description="Decode IDS (or stdin, one sequence per line; spaces or commas).")
    p.add_argument("ids", nargs="*", metavar="IDS", help="token ids (default: lines of stdin)")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder or file")
    p.add_argument("--keep-special", action="store_true", help="keep special tokens in the text")
    p.set_defaults(func=_decode)

    p = verbs.add_parser("info", help="family, kind, vocabulary size and special token ids",
                         formatter_class=HELP)
    p.add_argument("tokenizer", help="tokenizer folder or file")
    p.set_defaults(func=_info)
