"""``lmforge probe``: a linear probe per layer on frozen representations; prints a table, writes a PNG.

Files are CoNLL (``token<TAB>tag`` lines, blank line between sentences), e.g. WNUT-16 named entities.

Example::

    $ lmforge probe --model runs/minilm --task tag --train ner/wnut16_train.conll --eval ner/wnut16_dev.conll \\
          --out runs/probe-minilm
    layer  accuracy macro_f1
    0        0.9...   0.0...
    ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmforge.cli.main import UserError
from lmforge.datasets import read_conll
from lmforge.embeddings.encoder import load_encoder
from lmforge.embeddings.probe import format_table, plot, probe_layers
from lmforge.utils.io import atomic_write_text


def run(args) -> int:
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
    out = Path(args.out)
    atomic_write_text(out / "probe.txt", table + "\n")
    atomic_write_text(out / "probe.json", json.dumps(rows, indent=2) + "\n")
    png = plot(rows, out / "probe.png", title=f"{Path(args.model).name}: linear probe ({args.task})")
    print(f"wrote {out / 'probe.txt'}, {out / 'probe.json'}, {png}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("probe", help="per-layer linear probes on frozen representations",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="DIR", help="model folder with its tokenizer")
    parser.add_argument("--task", default="tag", choices=("tag",), help="tag: one label per word (CoNLL)")
    parser.add_argument("--train", required=True, metavar="FILE", help="training sentences (CoNLL)")
    parser.add_argument("--eval", required=True, metavar="FILE", help="evaluation sentences (CoNLL)")
    parser.add_argument("--out", default="probe", metavar="DIR", help="folder for probe.txt/json/png (default: probe)")
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
