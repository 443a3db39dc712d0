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

    $ lmforge prompt generate --model runs/gpt/model --task arithmetic --cot --shots 0,4 --seeds 0,1,2 --limit 50

is chain-of-thought prompting (Wei et al. 2022): the demonstrations show their rationale (``--rationale-column``)
before "The answer is N.", and the answer scored is the one extracted from the model's own chain.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import lmforge
from lmforge.checkpoint import check_tokenizer
from lmforge.cli._load_args import add_load_flags
from lmforge.cli._price_args import add_price_tag_flags
from lmforge.cli._rag_args import add_rag_flags, rag_settings
from lmforge.cli.main import UserError
from lmforge.prompting import Template, Verbalizer, classify
from lmforge.prompting.generative import METRICS, PROMPT_DEFAULTS, TASKS, read_rows, run_few_shot, unescape
from lmforge.prompting.rag import FEW_SHOT_TEMPLATE
from lmforge.tokenization import Tokenizer


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
    add_price_tag_flags(c, "prompt classify")
    c.set_defaults(func=run_classify)
    g = verbs.add_parser(
        "generate", help="generative few-shot: translation or QA-style answers, scored (BLEU / EM / F1) against k",
        description="Prompt each model with k demonstrations (the template filled and answered) and the query, "
        "decode greedily to the end of the line, and score against the targets; repeated over seeds. Prints a "
        "table of score against k, then one JSON line.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = PROMPT_DEFAULTS
    g.add_argument("--model", required=True, action="append", metavar="DIR",
                   help="model folder (repeatable: one line per model in the table and the plot)")
    g.add_argument("--task", default=None, choices=tuple(TASKS),
                   help="a shipped task (pool: its train split, queries: its test split): kjv-rv1909 (KJV -> "
                   "Reina-Valera verse translation, BLEU) or arithmetic (word problems with worked rationales, exact "
                   "match; for --cot); or give --data, --pool and --template")
    g.add_argument("--data", metavar="FILE", help="queries: TSV/JSONL or NAME:SPLIT with the input and target columns")
    g.add_argument("--pool", metavar="FILE", help="demonstration pool (same formats as --data)")
    g.add_argument("--template", metavar="T", help="prompt of one example with {x}, e.g. 'Q: {x}\\nA:' (\\n unescaped)")
    g.add_argument("--input-column", default=d["input_column"], help="column of the input")
    g.add_argument("--target-column", default=d["target_column"], help="column of the reference answer")
    g.add_argument("--cot", action="store_true",
                   help="chain-of-thought (Wei et al. 2022): each demonstration writes its rationale, then 'The answer "
                   "is <target>.'; the model's answer is extracted from the rationale it generates, then scored")
    g.add_argument("--rationale-column", default=d["rationale_column"],
                   help="with --cot: the pool's column of worked rationales")
    g.add_argument("--metric", default=d["metric"], choices=METRICS,
                   help="score of the answers (a shipped task has its own)")
    g.add_argument("--shots", default=",".join(map(str, d["shots"])), metavar="K,K",
                   help="demonstrations per prompt, comma-separated")
    g.add_argument("--seeds", default=",".join(map(str, d["seeds"])), metavar="S,S",
                   help="seeds of the demonstration draws (mean ± std)")
    g.add_argument("--limit", type=int, default=d["limit"], metavar="N", help="score the first N queries")
    g.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"],
                   help="longest answer, in tokens (a chain of thought needs more than a bare answer)")
    g.add_argument("--batch-size", type=int, default=d["batch_size"], help="prompts per generation batch")
    g.add_argument("--out", default=None, metavar="DIR", help="folder for table.md, results.json, fewshot.png")
    g.add_argument("--device", default=d["device"], help="torch device")
    add_price_tag_flags(g, "prompt generate")
    add_rag_flags(g, template=FEW_SHOT_TEMPLATE, question="each query's few-shot prompt (the search is for the "
                  "query's input)")
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
    settings = {key: getattr(args, key) for key in PROMPT_DEFAULTS}
    settings["shots"], settings["seeds"] = _int_list(args.shots, "--shots"), _int_list(args.seeds, "--seeds")
    rag = rag_settings(args, FEW_SHOT_TEMPLATE)  # flags without --index, a template without its slots: refused now
    if rag is not None:
        settings["k"], settings["rag_template"] = rag
    result = run_few_shot(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(result["table"], end="")
    if args.out:
        print(f"wrote {Path(args.out) / 'table.md'}, results.json, fewshot.png")
    models = result["models"]
    print(json.dumps({name: {str(row["k"]): row["mean"] for row in r["table"]} for name, r in models.items()}))
    return 0


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
    template = Template(unescape(args.template))
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
                      selection=args.selection, order=args.order, separator=unescape(args.separator),
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
