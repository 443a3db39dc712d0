"""``lmforge probe``: what a model knows without fine-tuning.

``lmforge probe [layers]``: a linear probe per layer on frozen representations; prints a table, writes a PNG.
Files are CoNLL (``token<TAB>tag`` lines, blank line between sentences), e.g. WNUT-16 named entities.

``lmforge probe cloze``: LAMA-style knowledge probes (lmforge.evaluation.cloze_probe): precision@1 and @10 of
the object of each fact at the blank, by relation, on the shipped facts or a TSV of your own (relation,
template with [X] and [Y], subject, object).

``lmforge probe bias``: CrowS-Pairs-style minimal pairs (lmforge.evaluation.bias_pairs): the share of pairs
whose more stereotyping sentence the model finds more likely (0.5 = no preference), overall, by bias_type and by
direction, from a CSV with the columns sent_more, sent_less, stereo_antistereo, bias_type. Encoders are scored by
pseudo-log-likelihood, decoders by log-likelihood, both on the tokens the two sentences share.

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
    $ lmforge probe bias --model runs/quickstart/bert/model --pairs crows_pairs_anonymized.csv --out runs/bias
    bias_type                 share preferred  ties  pairs
    age                       0.552        48     0     87
    ...
    {"model": "runs/quickstart/bert/model", "scoring": "pseudo-log-likelihood", "tokens": "shared", ...}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmforge import datasets
from lmforge.checkpoint import load_body
from lmforge.cli.main import UserError
from lmforge.datasets import read_conll
from lmforge.evaluation import bias_pairs
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


def run_bias(args) -> int:
    if not args.pairs:
        raise UserError("probe bias needs --pairs FILE (a CSV with the columns sent_more, sent_less, "
                        "stereo_antistereo, bias_type, as CrowS-Pairs ships it)")
    pairs = bias_pairs.read_pairs(args.pairs)  # a bad file is refused before the model is loaded
    body, tokenizer = load_body(args.model, random_init=args.random_init)
    body.to(args.device)
    scored = bias_pairs.score_pairs(body, tokenizer, pairs, tokens=args.tokens, batch_size=args.batch_size,
                                    where=str(args.pairs))
    summary = bias_pairs.summarize(scored)
    result = {"model": str(args.model), "pairs_file": str(args.pairs), "random_init": args.random_init,
              "scoring": bias_pairs.scoring(body),
              "tokens": args.tokens, **summary}
    print(bias_pairs.table(summary))
    if args.out:
        out = Path(args.out)
        atomic_write_text(out / "pairs.jsonl", "".join(json.dumps(p) + "\n" for p in scored))
        atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
        print(f"wrote {out / 'results.json'}, {out / 'pairs.jsonl'}")
    print(json.dumps(result))
    return 0


def run(args) -> int:
    if args.kind == "cloze":
        return run_cloze(args)
    if args.kind == "bias":
        return run_bias(args)
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
                                   "knowledge probes (P@1, P@10); bias probes on minimal pairs (CrowS-Pairs)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", nargs="?", default="layers", choices=("layers", "cloze", "bias"),
                        help="layers (default): a linear probe per layer; cloze: LAMA-style fact probes; bias: "
                             "which sentence of CrowS-Pairs-style minimal pairs the model prefers")
    parser.add_argument("--model", required=True, metavar="DIR", help="model folder with its tokenizer")
    parser.add_argument("--task", default="tag", choices=("tag",), help="layers: tag, one label per word (CoNLL)")
    parser.add_argument("--train", default=None, metavar="FILE", help="layers: training sentences (CoNLL)")
    parser.add_argument("--eval", default=None, metavar="FILE", help="layers: evaluation sentences (CoNLL)")
    parser.add_argument("--facts", default=None, metavar="FILE.tsv",
                        help="cloze: facts to probe (columns relation, template with [X] and [Y], subject, object; "
                             "default: the shipped cloze-facts, stated in the KJV and Austen corpora)")
    parser.add_argument("--pairs", default=None, metavar="FILE.csv",
                        help="bias: minimal pairs in CrowS-Pairs' format (CSV or TSV with the columns sent_more, "
                             "sent_less, stereo_antistereo, bias_type; other columns are ignored)")
    parser.add_argument("--tokens", default="shared", choices=bias_pairs.TOKENS,
                        help="bias: score only the tokens both sentences share (default, as CrowS-Pairs) or all of "
                             "each sentence's tokens")
    parser.add_argument("--random-init", action="store_true", default=False,
                        help="cloze, bias: the same architecture and tokenizer with fresh weights (the chance "
                             "baseline)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="layers: folder for probe.txt/json/png (default: probe); cloze: for cloze.txt/json; "
                             "bias: for results.json and pairs.jsonl, each pair's scores (default: print only)")
    parser.add_argument("--layers", default=None, help="comma-separated layers to probe (default: all)")
    parser.add_argument("--scalar-mix", action="store_true",
                        help="also probe ELMo's scalar mix of all layers, its weights learned for the task")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N sentences of each file")
    parser.add_argument("--max-iter", type=int, default=300, help="LogisticRegression max_iter (default: 300)")
    parser.add_argument("-C", type=float, default=1.0, help="inverse L2 strength (default: 1.0)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="sentences per forward pass; bias: masked copies (encoders) or sentences (decoders) "
                             "per forward pass (default: 32)")
    parser.add_argument("--max-length", type=int, default=None, help="truncate to this many tokens")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.set_defaults(func=run)
