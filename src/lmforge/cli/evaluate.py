"""``lmforge evaluate``: score a fine-tuned task folder on labelled data.

Prints a table of metrics and, as its last line, the same metrics as one JSON object (for scripts)::

    $ lmforge evaluate --model runs/rt/best --data rt-sentiment:test
    metric    value
    --------  ----------
    loss      0.3012
    accuracy  0.8739
    ...
    {"loss": 0.3012, "accuracy": 0.8739, ..., "examples": 1007}

A plain LM folder can be scored on a generative task: ``--task seq2seq --text-column en --target-column es``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from lmforge.cli._load_args import add_load_flags, add_precision_flags
from lmforge.cli._price_args import add_price_tag_flags
from lmforge.cli.main import UserError, model_argument, plain_warnings
from lmforge.checkpoint import read_model_folder
from lmforge.evaluation import baselines, forgetting, length_extrapolation, named, sts_benchmark
from lmforge.tasks.inference import evaluate, table_lines, tune_null_threshold
from lmforge.tasks.spec import TASKS, column_defaults
from lmforge.utils.folder_kinds import MODELS
from lmforge.utils.io import atomic_write_text

OVERRIDE_FLAGS = {
    "text_column": "column of the input text, if it differs from training (default: the task folder's, else "
                   f"{column_defaults('text')})",
    "text_pair_column": "column of the second text of a pair",
    "label_column": "column of the gold label (default: the task folder's, else "
                    f"{column_defaults('label')})",
    "target_column": "column of the gold target text / answers",
    "task_prefix": "prefix put before each input (seq2seq/text2text)",
    "max_length": "input tokens (longer inputs are cut, with a warning)",
    "max_target_length": "target tokens; also the generation limit",
    "null_threshold": "qa (SQuAD 2.0): answer 'no answer' when the [CLS] span outscores the best span by more than "
                      "this (use the best_f1_thresh that evaluate reports on dev)",
}


def add_common(parser, output: bool) -> None:
    """The flags evaluate and predict share."""
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="task folder, or a run folder (then its best/, else its model/)")
    parser.add_argument("--data", default=None, metavar="FILE",
                        help=".tsv .csv .jsonl .conll .parquet file, a dataset folder DIR:SPLIT, or NAME:SPLIT "
                             "(with --task NAME: default its evaluation split(s) from --data-dir)")
    if output:
        parser.add_argument("--output", required=True, metavar="FILE", help="predictions file: .jsonl, .tsv or .csv")
    parser.add_argument("--task", default=None, metavar="TASK",
                        help=f"the task type ({', '.join(TASKS)}; checked against the folder's, required for a plain "
                             "model folder) or a task by name (see `lmforge tasks list`, e.g. glue/sst2: its splits "
                             "from --data-dir, scored with the leaderboard's metrics; evaluate: sts/stsb, sts/sickr, "
                             "sts/sts12..16, or sts for Sentence-BERT's whole row, score any encoder --model as it is: "
                             "Spearman x 100 of embedding cosines)")
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="--task NAME: the suite's folder in its official layout (else $LMFORGE_GLUE_DIR ...)")
    parser.add_argument("--split", default=None, metavar="SPLIT",
                        help="--task NAME: the split to read (default: evaluate every evaluation split, predict the "
                             "first; a test split: evaluate writes the submission file into --out)")
    parser.add_argument("--subtask", default=None, metavar="NAME", help="text2text mixture: which task the data is")
    for key, text in OVERRIDE_FLAGS.items():
        kind = int if key.startswith("max_") else float if key == "null_threshold" else str
        parser.add_argument("--" + key.replace("_", "-"), dest=key, type=kind, default=None, help=text)
    parser.add_argument("--batch-size", type=int, default=32, help="examples per forward pass (default 32)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    add_load_flags(parser)
    add_precision_flags(parser)


def overrides(args) -> dict:
    return {k: getattr(args, k) for k in OVERRIDE_FLAGS}


def run_lengths(args, folder) -> int:
    """``--seq-len N``: a decoder's LM loss per bucket of positions (lmforge.evaluation.length_extrapolation)."""
    model, tokenizer = read_model_folder(folder)
    model.to(args.device)
    ids = length_extrapolation.text_ids(args.data, tokenizer, tokenizer.boundary_id)
    result = length_extrapolation.report(model, ids, args.seq_len, args.train_len, args.batch_size, args.limit)
    print(f"{result['blocks']} blocks of {args.seq_len} positions; trained at {result['train_len']}")
    print(f"{'positions':>12s}  {'loss':>8s}  {'ppl':>10s}")
    for row in result["buckets"]:
        mark = "  (beyond training)" if row["beyond_training"] else ""
        print(f"{row['positions']:>12s}  {row['loss']:8.4f}  {row['ppl']:10.2f}{mark}")
    print(f"{'all':>12s}  {result['loss']:8.4f}  {result['ppl']:10.2f}")
    print(json.dumps(result))
    return 0


def run_forgetting(args, folder) -> int:
    """``--forgetting``: the body's pre-training loss before and after fine-tuning (lmforge.evaluation.forgetting)."""
    options = {"batch_size": args.batch_size, "device": args.device}
    if args.limit:
        options["eval_batches"] = args.limit
    result = forgetting.forgetting(folder, args.pretrained, args.data, objective=args.objective, **options)
    print(f"{result['objective']} loss on {args.data} (validation split), pre-trained head:")
    for key in ("before", "after"):
        print(f"  {key:10s} {result[key]:.4f}  (ppl {math.exp(min(result[key], 700)):.2f})")
    print(f"  forgetting {result['forgetting']:+.4f}")
    print(json.dumps(result))
    return 0


def run_named(args, folder) -> int:
    """``--task NAME``: the leaderboard's metrics on the task's splits (or --data), a test split's submission."""
    if args.seq_len is not None or args.forgetting or args.tune_null_threshold:
        raise UserError(f"--task {args.task}: scores the leaderboard's metrics; drop --seq-len, --forgetting and "
                        "--tune-null-threshold")
    result = named.evaluate(folder, args.task, data=args.data, split=args.split, data_dir=args.data_dir,
                            out=args.out, overrides=overrides(args), batch_size=args.batch_size, device=args.device,
                            limit=args.limit, log=lambda line: print(line, file=sys.stderr))
    if result["scores"]:
        for line in table_lines(result["scores"]):
            print(line)
    print(json.dumps(result["scores"]))
    return 0


def run_harness(args, folder) -> int:
    """``--harness TASKS``: lm-evaluation-harness on the folder (lmforge.evaluation.harness); lm_eval is imported
    only here."""
    import time
    from pathlib import Path

    from lmforge.evaluation import harness

    results = harness.evaluate(folder, args.harness.split(","), limit=args.limit, num_fewshot=args.num_fewshot,
                               batch_size=args.batch_size, device=args.device, include_path=args.include_path or ())
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = harness.write_results(results, args.output or f"harness_{Path(folder).resolve().name}_{stamp}.json")
    for line in harness.table_lines(results):
        print(line)
    print(f"lm_eval results: {out}")
    print(json.dumps(harness.metrics(results)))
    sys.stdout.flush()
    return 0


def run_sts(args) -> int:
    """``--task sts`` or ``sts/NAME``: Spearman x 100 of an encoder's cosines, no training (SBERT's Table 1)."""
    if args.data is not None:
        raise UserError(f"--task {args.task}: reads the STS sets from --data-dir (or $LMFORGE_STS_DIR); drop --data")
    # a run folder means its model (as elsewhere); a packaged model's name (all-MiniLM-L6-v2) is not a folder
    model = model_argument("evaluate", args.model) if Path(args.model).is_dir() else args.model
    scores = sts_benchmark.evaluate(model, args.task, args.data_dir, split=args.split, batch_size=args.batch_size,
                                    device=args.device, limit=args.limit)
    print("Spearman x 100 of cos(u, v) with the gold scores")
    for line in sts_benchmark.table_lines(scores):
        print(line)
    if args.out is not None:
        atomic_write_text(Path(args.out) / named.SCORES_FILE, json.dumps(scores, indent=2) + "\n")
    print(json.dumps(scores))
    return 0


def run(args) -> int:
    if sts_benchmark.names_of(args.task) is not None:  # an encoder as it is: no task folder
        with plain_warnings("evaluate"):
            return run_sts(args)
    model = model_argument("evaluate", args.model, (*MODELS, "baseline"))
    if named.is_name(args.task):  # a task by name (glue/sst2): its splits, metrics and submission format
        with plain_warnings("evaluate"):
            return run_named(args, model)
    if args.data is None and not getattr(args, "harness", None):
        raise UserError("missing --data FILE (or --task NAME, e.g. glue/sst2, with --data-dir)")
    named.use_data_dir_of(args.data, args.data_dir)
    if getattr(args, "harness", None):
        with plain_warnings("evaluate"):
            return run_harness(args, model)
    if args.forgetting:
        with plain_warnings("evaluate"):
            return run_forgetting(args, model)
    if args.seq_len is not None:
        with plain_warnings("evaluate"):
            return run_lengths(args, model)
    if args.tune_null_threshold:
        with plain_warnings("evaluate"):
            scores = tune_null_threshold(model, args.data, batch_size=args.batch_size, device=args.device)
        print(f"stored null_threshold {scores['best_f1_thresh']:.6g} (best F1 {scores['best_f1']:.4f} on {args.data}) "
              f"in {model}")
    with plain_warnings("evaluate"):
        if baselines.is_baseline(model):
            scores = baselines.evaluate(model, args.data, args.limit)
        else:
            scores = evaluate(model, args.data, task=args.task, overrides=overrides(args), subtask=args.subtask,
                              batch_size=args.batch_size, device=args.device, limit=args.limit)
    for line in table_lines(scores):
        print(line)
    clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in scores.items()}
    print(json.dumps(clean))
    sys.stdout.flush()
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate", help="score a fine-tuned model on labelled data (table, then a JSON line)",
        description="Evaluate a task folder written by `lmforge finetune` on a labelled file. Prints a table of "
                    "metrics and, as the last line, a JSON object of the same metrics.")
    add_common(parser, output=False)
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N rows only (--seq-len: the "
                        "first N blocks)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="--task NAME: write DIR/scores.json (the leaderboard's metrics) and, for a test split, "
                             "the submission file in the leaderboard's format (GLUE: DIR/SST-2.tsv ...)")
    parser.add_argument("--harness", default=None, metavar="TASK[,TASK...]",
                        help="lm-evaluation-harness tasks on a decoder folder (pip install 'lmforge[harness]'): "
                        "lm_eval's names, lmforge's own (lmforge_next_verse, lmforge_austen_ppl) or --include-path "
                        "YAML; nothing is downloaded. Writes lm_eval's results JSON (--output) and prints a line "
                        "per task; --limit: documents per task, --batch-size: rows per forward pass")
    parser.add_argument("--num-fewshot", type=int, default=None, metavar="K",
                        help="--harness: examples in each prompt (default: the task's, else 0)")
    parser.add_argument("--include-path", action="append", default=None, metavar="DIR",
                        help="--harness: a folder of task YAML files (repeatable); relative data_files are read "
                        "from beside each YAML")
    parser.add_argument("--output", default=None, metavar="FILE",
                        help="--harness: the results JSON (default: ./harness_<model folder>_<UTC time>.json)")
    parser.add_argument("--seq-len", type=int, default=None, metavar="N",
                        help="length extrapolation: a decoder folder's next-token loss on --data (a text file, corpus, "
                        "or a prepared data folder: its validation split) in blocks of N positions, per bucket of "
                        "--train-len positions; N beyond the model's max_seq_len works for sinusoidal, rope, alibi, "
                        "t5-bias and relative positions")
    parser.add_argument("--forgetting", action="store_true", default=False,
                        help="catastrophic forgetting: the fine-tuned body's pre-training loss (with the pre-trained "
                        "LM head) on the validation split of --data, a prepared data folder (lmforge data prepare), "
                        "before and after fine-tuning; --limit: evaluation batches (default 20)")
    parser.add_argument("--pretrained", default=None, metavar="DIR",
                        help="--forgetting: the model it was fine-tuned from (default: the one its run's "
                        "finetune.yaml names)")
    parser.add_argument("--objective", default=None, metavar="NAME",
                        help="--forgetting: the pre-training objective (default: mlm for encoders, clm for decoders)")
    parser.add_argument("--train-len", type=int, default=None, metavar="L",
                        help="--seq-len: the length the model was trained at (bucket width; default its max_seq_len)")
    parser.add_argument("--tune-null-threshold", action="store_true", default=False,
                        help="qa (SQuAD 2.0): choose the no-answer threshold that maximises F1 on --data (dev), store "
                        "it in the task folder, then report the scores with it")
    add_price_tag_flags(parser, "evaluate")
    parser.set_defaults(func=run)
