"""``lmforge prompt classify``: classify text by prompting a frozen model (zero- or few-shot).
``lmforge prompt generate``: generative few-shot (translation, QA-style answers), scored against k.

Example::

    $ lmforge prompt classify --model runs/gpt/model --template "Review: {x} Overall, it was a {z} movie." \\
          --verbalizer '{"positive": ["great", "good"], "negative": ["terrible", "bad"]}' \\
          --data rt-sentiment:test --shots 4 --pool rt-sentiment:train --selection balanced --calibrate

Data (``--data``, ``--pool``): a TSV with a header or JSONL, with ``text`` (and ``text2`` for pairs) and ``label``
columns, or a shipped data set as ``NAME:SPLIT``. Labels are matched to the verbalizer's keys; integer labels
0..C-1 that are not keys are read as the index of a key in the verbalizer's order (rt-sentiment: 0 = the first
key). Prints accuracy, macro F1 and the majority-class baseline, then one JSON line with the metrics.

    $ lmforge prompt generate --model runs/gpt/model --model runs/gpt-sft/model --task kjv-rv1909 \\
          --shots 0,1,4,16 --seeds 0,1,2 --limit 100 --out runs/fewshot

writes ``table.md``, ``results.json`` and ``fewshot.png`` (score against k, one line per model; GPT-3's figure).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import lmforge
from lmforge import datasets
from lmforge.checkpoint import check_tokenizer, load_body
from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import UserError
from lmforge.prompting import Template, Verbalizer, classify
from lmforge.prompting.generative import TASKS, GenerativeTask, few_shot, plot
from lmforge.tokenization import Tokenizer
from lmforge.utils.io import atomic_write_bytes, atomic_write_text, read_text_file


def register(subparsers) -> None:
    parser = subparsers.add_parser("prompt", help="prompt a frozen model: zero/few-shot classification",
                                   description="Prompt-based prediction with a frozen language model.")
    verbs = parser.add_subparsers(dest="prompt_command", metavar="VERB")
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
    c = verbs.add_parser(
        "classify", help="classify with a template + verbalizer (zero/few-shot, calibration)",
        description="Score each label's answers in the template's {z} slot: a decoder continues the prompt, an "
        "encoder-decoder decodes the answer, an MLM encoder fills [MASK]s (cloze). Prints accuracy / macro F1 and a "
        "last-line JSON of metrics.", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    c.add_argument("--model", required=True, metavar="DIR", help="model folder (or a preset name with --tokenizer)")
    c.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: the model folder)")
    c.add_argument("--template", required=True, metavar="T",
                   help="prompt with {x} (and {x2} for pairs) and an answer slot {z}; \\n and \\t are unescaped")
    c.add_argument("--verbalizer", required=True, metavar="JSON",
                   help='label -> answers, as JSON text or a JSON file: {"positive": ["great"], "negative": ["bad"]}')
    c.add_argument("--data", required=True, metavar="FILE", help="TSV/JSONL with text/label columns, or NAME:SPLIT")
    c.add_argument("--shots", type=int, default=0, metavar="K", help="demonstrations per prompt")
    c.add_argument("--pool", metavar="FILE", help="demonstration pool (same formats as --data)")
    c.add_argument("--selection", choices=("random", "balanced", "knn"), default="random",
                   help="how demonstrations are chosen (knn: nearest by the model's mean-pooled hidden states)")
    c.add_argument("--order", choices=("given", "random", "nearest-last"), default=None,
                   help="demonstration order (default: nearest-last for knn, else as selected)")
    c.add_argument("--separator", default="\\n\\n", help="between demonstrations and before the query")
    c.add_argument("--seed", type=int, default=0, help="seed of random / balanced selection")
    c.add_argument("--calibrate", action="store_true", help="contextual calibration (Zhao et al. 2021)")
    c.add_argument("--reduction", choices=("sum", "mean"), default="sum",
                   help="multi-token answers: total or length-normalised log-likelihood")
    c.add_argument("--limit", type=int, default=None, metavar="N", help="classify only the first N examples")
    c.add_argument("--device", default="cpu", help="torch device")
    add_load_flags(c, tokenizer=True)
    c.set_defaults(func=run_classify)
    g = verbs.add_parser(
        "generate", help="generative few-shot: translation or QA-style answers, scored (BLEU / EM / F1) against k",
        description="Prompt each model with k demonstrations (the template filled and answered) and the query, "
        "decode greedily to the end of the line, and score against the targets; repeated over seeds. Prints a "
        "table of score against k, then one JSON line.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g.add_argument("--model", required=True, action="append", metavar="DIR",
                   help="model folder (repeatable: one line per model in the table and the plot)")
    g.add_argument("--task", default=None, choices=("kjv-rv1909",),
                   help="a shipped task: kjv-rv1909 (KJV -> Reina-Valera verse translation, BLEU; pool: train, "
                   "queries: test); or give --data, --pool and --template")
    g.add_argument("--data", metavar="FILE", help="queries: TSV/JSONL or NAME:SPLIT with the input and target columns")
    g.add_argument("--pool", metavar="FILE", help="demonstration pool (same formats as --data)")
    g.add_argument("--template", metavar="T", help="prompt of one example with {x}, e.g. 'Q: {x}\\nA:' (\\n unescaped)")
    g.add_argument("--input-column", default="text", help="column of the input")
    g.add_argument("--target-column", default="target", help="column of the reference answer")
    g.add_argument("--metric", default="bleu", choices=("bleu", "exact_match", "f1"), help="score of the answers")
    g.add_argument("--shots", default="0,1,4", metavar="K,K", help="demonstrations per prompt, comma-separated")
    g.add_argument("--seeds", default="0", metavar="S,S", help="seeds of the demonstration draws (mean ± std)")
    g.add_argument("--limit", type=int, default=100, metavar="N", help="score the first N queries")
    g.add_argument("--max-new-tokens", type=int, default=48, help="longest answer, in tokens")
    g.add_argument("--batch-size", type=int, default=8, help="prompts per generation batch")
    g.add_argument("--out", default=None, metavar="DIR", help="folder for table.md, results.json, fewshot.png")
    g.add_argument("--device", default="cpu", help="torch device")
    g.set_defaults(func=run_generate)


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected integers separated by commas, e.g. 0,1,4,16") from None
    if not values or min(values) < 0:
        raise UserError(f"{flag} {text!r}: expected integers >= 0, e.g. 0,1,4,16")
    return values


def run_generate(args) -> int:
    shots, seeds = _int_list(args.shots, "--shots"), _int_list(args.seeds, "--seeds")
    if args.task is not None:
        task = TASKS[args.task]
        pool_source, data_source = f"{args.task}:train", f"{args.task}:test"
    else:
        if not (args.data and args.pool and args.template):
            raise UserError("without --task, give --data, --pool and --template (with {x})")
        task = GenerativeTask(_unescape(args.template), args.input_column, args.target_column, args.metric)
        pool_source, data_source = args.pool, args.data
    columns = (task.input_column, task.target_column)
    pool = read_rows(args.pool or pool_source, columns)
    queries = read_rows(args.data or data_source, columns)[: args.limit]
    results = {}
    for model_dir in args.model:
        model, tokenizer = load_body(model_dir)
        model.to(args.device).eval()
        print(f"{model_dir}: {len(queries)} queries, k in {shots}, seeds {seeds}", file=sys.stderr, flush=True)
        results[model_dir] = few_shot(model, tokenizer, task, pool, queries, shots, seeds,
                                      max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    lines = [f"| model | {' | '.join(f'k={k}' for k in shots)} |", "|---|" + "---:|" * len(shots)]
    for name, result in results.items():
        cells = [f"{row['mean']:.2f} ± {row['std']:.2f}" for row in result["table"]]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    table = "\n".join(lines) + f"\n\n{task.metric} (0-100), mean ± std over seeds {seeds}; {len(queries)} queries\n"
    print(table, end="")
    if args.out:
        out = Path(args.out)
        atomic_write_text(out / "table.md", table)
        atomic_write_text(out / "results.json", json.dumps({"task": args.task or args.data, "metric": task.metric,
                                                            "shots": shots, "seeds": seeds, "models": results},
                                                           indent=1) + "\n")
        atomic_write_bytes(out / "fewshot.png", plot({Path(m).name or m: r for m, r in results.items()},
                                                     task.metric))
        print(f"wrote {out / 'table.md'}, results.json, fewshot.png")
    print(json.dumps({name: {str(row["k"]): row["mean"] for row in r["table"]} for name, r in results.items()}))
    return 0


def _unescape(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\t", "\t")


def read_rows(source: str, columns: tuple[str, ...] = ("text", "label")) -> list[dict]:
    """Rows of a TSV/JSONL file, or of a shipped data set given as ``NAME:SPLIT``, with ``columns``."""
    path = Path(source)
    if not path.exists():
        name, _, split = source.partition(":")
        if name not in datasets.names():
            raise UserError(f"{source}: no such file, and {name!r} is not a shipped data set "
                            f"({', '.join(datasets.names())})")
        rows = datasets.load(name, split or "test")
    elif path.suffix in (".jsonl", ".json"):
        try:
            rows = [json.loads(line) for line in read_text_file(path).splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise UserError(f"{source}: not valid JSON lines ({exc})") from None
    else:
        rows = datasets.read_tsv(path)
    if not rows:
        raise UserError(f"{source}: no rows")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise UserError(f"{source}: needs columns {' and '.join(columns)}; missing {missing} (has {sorted(rows[0])})")
    return rows


def _label_mapper(labels: list[str], rows: list[dict], source: str):
    values = {str(r["label"]) for r in rows}
    if values <= set(labels):
        return str
    if values <= {str(i) for i in range(len(labels))}:  # integer classes name the verbalizer's keys in order
        return lambda y: labels[int(y)]
    raise UserError(f"{source}: labels {sorted(values)[:10]} are neither verbalizer keys {labels} "
                    f"nor 0..{len(labels) - 1}")


def classification_metrics(gold: list[str], pred: list[str], labels: list[str]) -> dict[str, float]:
    """Accuracy, macro F1 over ``labels``, and the accuracy of always predicting the most frequent gold label."""
    n = len(gold)
    f1s = []
    for c in labels:
        tp = sum(g == c and p == c for g, p in zip(gold, pred))
        fp = sum(g != c and p == c for g, p in zip(gold, pred))
        fn = sum(g == c and p != c for g, p in zip(gold, pred))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    majority = Counter(gold).most_common(1)[0][1] / n if n else 0.0
    return {"accuracy": sum(g == p for g, p in zip(gold, pred)) / n if n else 0.0,
            "macro_f1": sum(f1s) / len(f1s), "majority_baseline": majority}


def run_classify(args) -> int:
    import torch

    if args.shots < 0:
        raise UserError("--shots must be >= 0")
    if args.shots and not args.pool:
        raise UserError(f"--shots {args.shots} needs --pool, the file the demonstrations come from")
    template = Template(_unescape(args.template))
    try:
        verbalizer = Verbalizer.from_json(args.verbalizer)
    except json.JSONDecodeError as exc:
        raise UserError(f"--verbalizer: not valid JSON ({exc})") from None
    rows = read_rows(args.data)[: args.limit]
    pool = read_rows(args.pool) if args.pool else None
    to_label = _label_mapper(verbalizer.labels, rows, args.data)
    if pool is not None:
        pool_label = _label_mapper(verbalizer.labels, pool, args.pool)
        pool = [{**r, "label": pool_label(r["label"])} for r in pool]
    tok_dir = args.tokenizer or args.model
    if not (Path(tok_dir) / "tokenizer.json").exists():
        raise UserError(f"{tok_dir}: no tokenizer.json (pass --tokenizer DIR)")
    torch.manual_seed(0)
    model = lmforge.load(args.model, device=args.device)
    tokenizer = Tokenizer.load(tok_dir)
    if args.tokenizer and Path(args.model).is_dir():
        check_tokenizer(args.model, tokenizer, args.tokenizer)
    start = time.perf_counter()
    result = classify(model, tokenizer, template, verbalizer, rows, pool=pool, shots=args.shots,
                      selection=args.selection, order=args.order, separator=_unescape(args.separator),
                      seed=args.seed, calibrate=args.calibrate, reduction=args.reduction)
    gold = [to_label(r["label"]) for r in rows]
    metrics = classification_metrics(gold, result.predictions, verbalizer.labels)
    metrics.update(n=len(rows), shots=args.shots, selection=args.selection if args.shots else None,
                   calibrated=args.calibrate, seconds=round(time.perf_counter() - start, 2))
    print(f"examples:          {len(rows)}")
    print(f"accuracy:          {metrics['accuracy']:.4f}")
    print(f"macro F1:          {metrics['macro_f1']:.4f}")
    print(f"majority baseline: {metrics['majority_baseline']:.4f}")
    print("predicted:         " + ", ".join(f"{k}={v}" for k, v in sorted(Counter(result.predictions).items())))
    print(json.dumps(metrics))
    sys.stdout.flush()
    return 0
