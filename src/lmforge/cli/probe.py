"""``lmforge probe``: what a model knows without fine-tuning.

``lmforge probe [layers]``: a linear probe per layer on frozen representations; prints a table, writes a PNG.
Files are CoNLL (``token<TAB>tag`` lines, blank line between sentences), e.g. WNUT-16 named entities.

``lmforge probe cloze``: LAMA-style knowledge probes (lmforge.evaluation.cloze_probe): precision@1 and @10 of
the object of each fact at the blank, by relation, on the shipped facts or a TSV of your own (relation,
template with [X] and [Y], subject, object).

Example::

    $ lmforge probe --model runs/minilm --task tag --train ner/wnut16_train.conll --eval ner/wnut16_dev.conll \\
          --out runs/probe-minilm
    layer  accuracy macro_f1
    0        0.9...   0.0...
    ...
    $ lmforge probe cloze --model runs/quickstart/bert/model
    relation              P@1   P@10  facts  skipped
    bible/father        0.083  0.333     12        0
    ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmforge import datasets
from lmforge.checkpoint import load_body
from lmforge.cli.main import UserError
from lmforge.datasets import read_conll
from lmforge.evaluation.cloze_probe import check_facts, probe, table
from lmforge.embeddings.encoder import load_encoder
from lmforge.embeddings.probe import format_table, plot, probe_layers
from lmforge.utils.io import atomic_write_text


def run_cloze(args) -> int:
    body, tokenizer = load_body(args.model, random_init=args.random_init)
    body.to(args.device)
    facts = datasets.read_tsv(args.facts) if args.facts else None
    if facts is not None:
        check_facts(facts, args.facts)
    result = probe(body, tokenizer, facts)
    text = table(result)
    print(text)
    if args.out:
        out = Path(args.out)
        atomic_write_text(out / "cloze.txt", text + "\n")
        atomic_write_text(out / "cloze.json", json.dumps(result, indent=2) + "\n")
        print(f"wrote {out / 'cloze.txt'}, {out / 'cloze.json'}")
    return 0


def run(args) -> int:
    if args.kind == "cloze":
        return run_cloze(args)
    if not args.train or not args.eval:
        raise UserError("probe layers needs --train and --eval (CoNLL files)")
    train, evaluation = read_conll(args.train), read_conll(args.eval)
    if args.limit:
        train, evaluation = train[:args.limit], evaluation[:args.limit]
    if not train or not evaluation:
        raise UserError("--train and --eval must each hold at least one sentence")
    encoder = load_encoder(args.model, device=args.device, max_length=args.max_length)
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    rows = probe_layers(encoder, train, evaluation, layers=layers, scalar_mix=args.scalar_mix,
                        max_iter=args.max_iter, C=args.C, batch_size=args.batch_size)
    table = format_table(rows)
    print(table)
    out = Path(args.out or "probe")
    atomic_write_text(out / "probe.txt", table + "\n")
    atomic_write_text(out / "probe.json", json.dumps(rows, indent=2) + "\n")
    png = plot(rows, out / "probe.png", title=f"{Path(args.model).name}: linear probe ({args.task})")
    print(f"wrote {out / 'probe.txt'}, {out / 'probe.json'}, {png}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("probe", help="per-layer linear probes on frozen representations; cloze "
                                   "knowledge probes (P@1, P@10)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", nargs="?", default="layers", choices=("layers", "cloze"),
                        help="layers (default): a linear probe per layer; cloze: LAMA-style fact probes")
    parser.add_argument("--model", required=True, metavar="DIR", help="model folder with its tokenizer")
    parser.add_argument("--task", default="tag", choices=("tag",), help="layers: tag, one label per word (CoNLL)")
    parser.add_argument("--train", default=None, metavar="FILE", help="layers: training sentences (CoNLL)")
    parser.add_argument("--eval", default=None, metavar="FILE", help="layers: evaluation sentences (CoNLL)")
    parser.add_argument("--facts", default=None, metavar="FILE.tsv",
                        help="cloze: facts to probe (columns relation, template with [X] and [Y], subject, object; "
                             "default: the shipped cloze-facts, stated in the KJV and Austen corpora)")
    parser.add_argument("--random-init", action="store_true", default=False,
                        help="cloze: the same architecture and tokenizer with fresh weights (the chance baseline)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="layers: folder for probe.txt/json/png (default: probe); cloze: for cloze.txt/json "
                             "(default: print only)")
    parser.add_argument("--layers", default=None, help="comma-separated layers to probe (default: all)")
    parser.add_argument("--scalar-mix", action="store_true",
                        help="also probe ELMo's scalar mix of all layers, its weights learned for the task")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N sentences of each file")
    parser.add_argument("--max-iter", type=int, default=300, help="LogisticRegression max_iter (default: 300)")
    parser.add_argument("-C", type=float, default=1.0, help="inverse L2 strength (default: 1.0)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default: 32)")
    parser.add_argument("--max-length", type=int, default=None, help="truncate to this many tokens")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.set_defaults(func=run)
