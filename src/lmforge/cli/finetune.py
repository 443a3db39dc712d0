"""``lmforge finetune``: fine-tune a model on a task from a TSV, CSV, JSONL or CoNLL file.

The model is a preset (with ``--tokenizer``), an lmforge model folder, or a Hugging Face folder (converted on
the fly). The run folder gets the Trainer's checkpoints and logs, ``best/`` (the best evaluation by
``--metric``) and ``model/`` (the last step); both are task folders for ``lmforge evaluate`` and ``predict``.
``--resume`` continues a run from its last checkpoint with the settings saved in ``OUT/finetune.yaml``.

``--peft METHOD`` trains a PEFT adapter (LoRA, QLoRA, Houlsby adapters, prefix or prompt tuning, (IA)^3, BitFit,
MAM) and the task head instead of the whole model; ``--peft-option KEY=VALUE`` (repeatable) or ``--peft-config
FILE`` set its options (the fields of :class:`lmforge.peft.PeftConfig`). ``best/`` and ``model/`` then hold the
adapter, the head and the base model's path (see :mod:`lmforge.tasks.peft`); ``--merge`` also writes ``merged/``, a
plain task folder with the adapter folded in (LoRA, QLoRA, (IA)^3, BitFit).

Example::

    $ lmforge convert from-hf path/to/all-MiniLM-L6-v2 minilm
    $ lmforge finetune --model minilm --task classify --train rt-sentiment:train --eval rt-sentiment:dev \\
          --out runs/rt --epochs 1 --batch-size 16 --lr 5e-5 --warmup-ratio 0.1 --layer-decay 0.9
    $ lmforge finetune --model t5-tiny --tokenizer tok/ --task text2text --train sst.tsv \\
          --task-prefix "sst2 sentence: " --label-map 0=negative,1=positive --out runs/t5
    $ lmforge finetune --model t5-tiny --tokenizer tok/ --task text2text --mixture tasks.yaml --out runs/mix
    $ lmforge finetune --model minilm --task classify --train rt-sentiment:train --eval rt-sentiment:dev \
          --out runs/rt-lora --peft lora --peft-option r=8 --peft-option alpha=16 --peft-option targets=q,v \
          --lr 1e-3 --max-steps 800 --merge
"""

from __future__ import annotations

import argparse
import signal
import sys

from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import UserError, plain_warnings
from lmforge.cli.pretrain import CHOICES, OPTIONS
from lmforge.embeddings.losses import EMBEDDING_LOSSES
from lmforge.embeddings.sbert import run_embedding_finetune
from lmforge.peft import METHODS
from lmforge.evaluation import baselines, benchmarks, named
from lmforge.evaluation.elmo_features import FEATURE_BASELINES, FEATURE_KINDS, parse_features
from lmforge.tasks.run import run_finetune
from lmforge.tasks.settings import (
    FINETUNE_DEFAULTS,
    PEFT_FLAGS,
    TASK_KEYS,
    TRAINER_KEYS,
    parse_label_map,  # noqa: F401  (imported from here by older code)
)
from lmforge.tasks.gpt1_transforms import INPUT_TRANSFORMS
from lmforge.tasks.spec import LOSS_AVERAGES, POOLINGS, TASKS, TaskSpec, column_defaults
from lmforge.training import config as tc
from lmforge.training.config import TrainConfig
from lmforge.training.trainer import run_started
from lmforge.utils.flags import add_dataclass_flags
from lmforge.utils.lock import refuse_if_held, removed_on_failure

# (metavar, help) of the task-format flags: the TaskSpec fields lmforge.tasks.settings.TASK_KEYS names.
TASK_FLAGS = {
    "text_column": ("NAME", "column of the input text (tag: the words; qa: the question; default: "
                            f"{column_defaults('text')})"),
    "text_pair_column": ("NAME", "column of the second text of a pair (qa: the context)"),
    "label_column": ("NAME", "column of the label (classify/regress/multilabel/tag; text2text with --label-map; "
                             f"default: {column_defaults('label')})"),
    "target_column": ("NAME", "column of the target text (seq2seq/text2text), answers (qa) or choices (multiple-choice: a list, or NAME0, NAME1, ... columns)"),
    "task_prefix": ("TEXT", "text put before every input (seq2seq/text2text), e.g. 'translate English to Spanish: '"),
    "pair_prefix": ("TEXT", "text2text: put before the second text of a pair, e.g. 'sentence2: '"),
    "label_separator": ("SEP", "multilabel: separator of the labels in one cell (default ,)"),
    "pooling": ("MODE", "cls | mean | last | max (default: cls for encoders, last for decoders/encoder-decoders; "
                        "embedding: mean)"),
    "classifier_dropout": ("P", "dropout before the classifier (default 0.1)"),
    "head_bilstm": ("LAYERS", "encoders: a randomly initialised BiLSTM of LAYERS layers between the body and the "
                              "head (BERT's feature-based ablation: 2; with --freeze-body the body stays fixed; "
                              "default 0 = none)"),
    "head_bilstm_hidden": ("H", "--head-bilstm: units per direction (default d_model / 2; BERT's ablation: 768)"),
    "max_length": ("N", "input tokens; longer inputs are cut with a warning (default 256; embedding: the model's "
                        "max_seq_len)"),
    "max_target_length": ("N", "target tokens for seq2seq/text2text, also the generation limit (default 128)"),
    "max_answer_length": ("N", "qa: longest answer span in tokens (default 30)"),
    "null_threshold": ("TAU", "qa (SQuAD 2.0): answer 'no answer' when the [CLS] span outscores the best span by more "
                              "than TAU (default 0 once the training data has unanswerable rows; tune it on dev: "
                              "evaluate reports best_f1_thresh)"),
    "mixing_cap": ("K", "text2text mixture: examples-proportional mixing cap"),
    "mixing_temperature": ("T", "text2text mixture: mixing temperature (1 = proportional)"),
    "loss_average": ("HOW", "seq2seq/text2text: token (default: over all target tokens of a batch) | example "
                            "(each example's mean counts once: a mixture's one-word labels are not drowned out)"),
    "input_transform": ("HOW", "decoders: plain (default) | gpt1: GPT-1's [start] A [delim] B [extract] with three "
                               "new tokens learned in fine-tuning (classify/regress/multilabel/multiple-choice) | "
                               "gpt1-similarity: the pair in both orders, their [extract] states added"),
}
assert tuple(TASK_FLAGS) == TASK_KEYS, "every task-format flag is a setting, and every setting a flag"
# --task embedding trains with its own recipe (Sentence-BERT), whose defaults differ; the help says so.
EMBEDDING_DEFAULTS = {"lr": "2e-05", "max_steps": "one epoch"}


def run(args) -> int:
    given = vars(args)
    if given.get("out"):
        refuse_if_held(given["out"])  # at once, not after minutes of building what it could not write
    # A run that fails before its first step leaves no folder holding only its settings behind.
    with removed_on_failure(given.get("out") or ".", keep=run_started):
        return _run(given, args)


def _run_baseline(given) -> int:
    """``--baseline NAME``: train a simple baseline (lmforge.evaluation.baselines) instead of fine-tuning a model."""
    for flag in ("model", "tokenizer", "peft", "merge", "random_init", "mixture", "resume", "label_smoothing",
                 "head_bilstm"):
        if given.get(flag):
            raise UserError(f"--baseline trains its own small model: drop --{flag.replace('_', '-')}")
    if given.get("eval_sets"):
        raise UserError("--baseline scores its --eval only: drop --eval-set")
    bench = benchmarks.resolve_task(given)
    if not given.get("task"):
        raise UserError("missing --task (a task type, e.g. classify or tag, or a task by name, e.g. rt-sentiment)")
    for flag in ("out", "train"):
        if not given.get(flag):
            raise UserError(f"missing --{flag}")
    fields = {k: given[k] for k in TASK_KEYS if given.get(k) is not None}
    if bench is not None and bench.labels:
        fields["labels"] = list(bench.labels)
    spec = TaskSpec.from_dict({"task": given["task"], **fields}, source="command line")
    options = baselines.BaselineOptions.parse(given.get("baseline_option"))
    features = parse_features(given.get("features"))
    trainer = {**FINETUNE_DEFAULTS, **baselines.NEURAL_DEFAULTS, **{k: given[k] for k in TRAINER_KEYS if k in given}}
    config = TrainConfig.from_dict({**trainer, "out": given["out"]}, source="command line")
    scored_by_name = named.scores_baseline(bench)  # summaries by name: the papers' ROUGE, scored below
    with plain_warnings("finetune"):
        result = baselines.train_baseline(given["baseline"], spec, given["train"],
                                          None if scored_by_name else given.get("eval"), out=given["out"],
                                          config=config, options=options, epochs=given.get("epochs"),
                                          log=lambda line: print(line, file=sys.stderr), features=features)
        if scored_by_name and given.get("eval"):
            result = named.score_baseline_run(result, bench.name, given["eval"])
    if result["eval"]:
        print("eval: " + ", ".join(f"{k} {v:.4f}" for k, v in result["eval"].items() if k != "examples"))
    print(f"done: {given['baseline']} saved to {result['model_dir']}")
    return 0


def _run(given, args) -> int:
    if given.get("baseline"):
        return _run_baseline(given)
    if given.get("features"):
        raise UserError(f"--features {' '.join(given['features'])}: feeds a frozen biLM into a word baseline; use it "
                        f"with --baseline {' or '.join(FEATURE_BASELINES)}")
    if given.get("task") == "embedding":  # Sentence-BERT: its own recipe (lmforge.embeddings.sbert)
        if any(given.get(k) for k in (*PEFT_FLAGS, "merge")):
            raise UserError("--peft and --merge are not supported with --task embedding (it has its own recipe)")
        if given.get("eval_sets"):
            raise UserError("--eval-set is not supported with --task embedding (it has its own recipe)")
        return run_embedding_finetune(args)
    settings = benchmarks.task_settings(given)
    with plain_warnings("finetune"):
        result = run_finetune(settings, pack=given.get("pack", False))
    if result.stopped_by in ("SIGINT", "SIGTERM"):
        print(f"stopped by {result.stopped_by} at step {result.step}; continue with: lmforge finetune --out "
              f"{result.out} --resume", file=sys.stderr)
        return 128 + int(getattr(signal, result.stopped_by))
    if result.best:
        b = result.best
        print(f"best: {b['metric']} {b['value']:.4f} at step {b['step']} -> {result.out / 'best'}")
    for name, scores in (result.eval_sets or {}).items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in scores.items() if k != "step" and isinstance(v, (int, float)))
        print(f"eval set {name} (step {scores['step']}): {shown}")
    print(f"done: step {result.step}, final model saved to {result.model_dir}")
    if result.train is not None:
        print(result.train.summary())
    if result.merged:
        print(f"merged: {result.merged_from} with its adapter folded in -> {result.merged}")
    return 0


def _add_trainer_flags(parser) -> None:
    texts = dict(OPTIONS)
    texts.update({"cut_frac": "slanted-triangular: share of the steps spent rising",
                  "stlr_ratio": "slanted-triangular: ratio of the peak LR to the lowest"})
    defaults = {**TrainConfig().to_dict(), **FINETUNE_DEFAULTS}
    shown = {k: f"{defaults[k]}; embedding: {v}" for k, v in EMBEDDING_DEFAULTS.items()}
    group = parser.add_argument_group("training (as for `lmforge pretrain`)")
    add_dataclass_flags(group, TrainConfig, [(key, texts[key]) for key in TRAINER_KEYS], defaults={**defaults, **shown},
                        choices={k: getattr(tc, v) for k, v in CHOICES.items()})


def _add_peft_flags(parser) -> None:
    group = parser.add_argument_group(
        "parameter-efficient fine-tuning",
        "Train an adapter and the task head; the base model stays frozen. OUT/best and OUT/model then hold the "
        "adapter, the head and the base model's path (lmforge evaluate/predict load them as any task folder).")
    group.add_argument("--peft", default=None, choices=METHODS, metavar="METHOD",
                       help=f"PEFT method: {', '.join(METHODS)} (default: full fine-tuning)")
    group.add_argument("--peft-option", action="append", default=None, metavar="KEY=VALUE",
                       help="a PeftConfig option, repeatable: r=8, alpha=16, dropout=0.1, rslora=true, targets=q,v, "
                            "adapter_dim=64, num_virtual_tokens=20, prefix_hidden=512, prompt_init=vocab, ... "
                            "(`lmforge peft info` shows a saved adapter's)")
    group.add_argument("--peft-config", default=None, metavar="FILE.yaml",
                       help="PeftConfig fields in a .yaml/.json file (--peft and --peft-option override them)")
    group.add_argument("--merge", action="store_true", default=False,
                       help="after training, also write OUT/merged: a plain task folder with the adapter folded in "
                            "(from OUT/best if an evaluation picked one, else OUT/model; lora, qlora, ia3, bitfit)")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "finetune", help="fine-tune a model on a task (classify, regress, multilabel, tag, qa, multiple-choice, "
                         "seq2seq, text2text, reward)",
        description="Fine-tune a preset, an lmforge model folder or a Hugging Face folder on a TSV/CSV/JSONL/CoNLL "
                    "file (or a shipped data set NAME:SPLIT, e.g. rt-sentiment:train). Writes OUT/finetune.yaml, "
                    "OUT/checkpoints/, OUT/metrics.jsonl, OUT/best/ (best evaluation by --metric) and OUT/model/.",
        argument_default=argparse.SUPPRESS)
    what = parser.add_argument_group("what to fine-tune")
    what.add_argument("--model", default=None, help="preset name, lmforge model folder or Hugging Face folder")
    what.add_argument("--tokenizer", default=None, help="tokenizer folder (needed for presets)")
    add_load_flags(what, tokenizer=True)
    what.add_argument("--baseline", default=None, choices=baselines.BASELINES, metavar="NAME",
                      help="train a simple baseline instead of a model; classify (a text or a pair): "
                      "tfidf-logreg, ngram-svm (scikit-learn), bilstm, cnn (word models trained by the Trainer; "
                      "lr 1e-3, batch 50, constant schedule unless given); tag: crf (sklearn-crfsuite), "
                      "bilstm-tagger; regress: tfidf-ridge; qa: qa-window (sliding-window word overlap); "
                      "multiple-choice: tfidf-mc (TF-IDF similarity); seq2seq/text2text: lead-3; no --model")
    what.add_argument("--baseline-option", action="append", default=None, metavar="KEY=VALUE",
                      help="a baseline setting, repeatable: C=1.0 (linear), embed_dim=100, hidden=100 (bilstm), "
                      "filters=100 (cnn), dropout=0.5, vectors=random|word2vec, min_count=1, max_words=256, "
                      "alpha=1.0 (tfidf-ridge), c1=0.1, c2=0.1, max_iterations=100 (crf), window=10, "
                      "max_answer_words=4 (qa-window), lead=3 (lead-3)")
    what.add_argument("--features", action="append", default=None, metavar="KIND=DIR",
                      help="feed pre-trained features into --baseline " + " or ".join(FEATURE_BASELINES)
                      + ", concatenated with its word embeddings; kinds: " + "; ".join(FEATURE_KINDS.values())
                      + ": ELMo (Peters et al. 2018), the frozen biLM's layers mixed by softmax weights and a "
                      "scale learned with the task. OUT/model records the biLM's path and sha256 and reads it "
                      "from there in evaluate/predict")
    what.add_argument("--random-init", action="store_true", default=False,
                      help="keep the architecture and tokenizer but start from random weights (a baseline)")
    what.add_argument("--task", default=None, metavar="TASK",
                      help=f"the task: a type ({', '.join(TASKS)}; instruct: supervised fine-tuning on "
                      "instruction/chat JSONL; embedding: Sentence-BERT training with --loss; reward: a reward model "
                      "trained with the Bradley-Terry loss on prompt/chosen/rejected rows, for lmforge align) or a task "
                      "by name, which sets its columns, labels, metric and files (`lmforge tasks list`: "
                      f"{', '.join(benchmarks.names())})")
    what.add_argument("--data-dir", default=None, metavar="DIR",
                      help="a named benchmark task's folder in its official layout (else its suite's variable: "
                      f"{', '.join('$' + env for env, _ in benchmarks.layouts.SUITES.values())})")
    what.add_argument("--pack", action="store_true", default=False,  # the parser's default is SUPPRESS
                      help="instruct: pack short examples (block-diagonal mask)")
    what.add_argument("--train", default=None, metavar="FILE",
                      help="training data (.tsv .csv .jsonl .conll .parquet, a dataset folder DIR:SPLIT, or "
                           "NAME:SPLIT; --task instruct: JSONL, or demo-instructions, the shipped set, whose dev "
                           "split is then the default --eval)")
    what.add_argument("--eval", default=None, metavar="FILE", help="evaluation data, for --metric and OUT/best")
    what.add_argument("--eval-set", dest="eval_sets", action="append", default=None, metavar="NAME=FILE",
                      help="a further evaluation set (e.g. out-of-domain data), repeatable: scored at every "
                           "evaluation beside --eval and logged as eval_<NAME>_<metric> (never picks OUT/best); "
                           "NAME: letters, digits, '.', '-'; FILE: as --eval")
    what.add_argument("--out", default=None, metavar="DIR", help="run folder")
    task = parser.add_argument_group("task format")
    for key, (metavar, text) in TASK_FLAGS.items():
        kind = {"classifier_dropout": float, "mixing_temperature": float, "max_length": int, "max_target_length": int,
                "head_bilstm": int, "head_bilstm_hidden": int,
                "max_answer_length": int, "mixing_cap": int, "null_threshold": float}.get(key, str)
        task.add_argument("--" + key.replace("_", "-"), dest=key, type=kind, default=None, metavar=metavar, help=text,
                          choices={"pooling": POOLINGS, "loss_average": LOSS_AVERAGES,
                                   "input_transform": INPUT_TRANSFORMS}.get(key))
    task.add_argument("--label-map", default=None, metavar="MAP",
                      help="text2text: label words, '0=negative,1=positive', a JSON object or a .json/.yaml file")
    task.add_argument("--mixture", default=None, metavar="FILE.yaml",
                      help="text2text: train several tasks at once (a list of {name, train, eval, text_column, "
                           "target_column | label_column + label_map, task_prefix})")
    recipe = parser.add_argument_group("fine-tuning recipe")
    recipe.add_argument("--epochs", type=float, default=None,
                        help="passes over the training data; 0.5 trains on half of it (sets --max-steps)")
    recipe.add_argument("--warmup-ratio", type=float, default=None,
                        help="warmup as a share of the steps (sets --warmup; embedding: default 0.1)")
    recipe.add_argument("--layer-decay", type=float, default=None,
                        help="layer-wise LR decay: each layer below the head gets this factor more (ULMFiT: 0.38)")
    recipe.add_argument("--unfreeze-every", type=int, default=None,
                        help="gradual unfreezing: start with the head, unfreeze one more layer every N steps")
    recipe.add_argument("--freeze-body", action="store_true", default=False,
                        help="train the head only (feature extraction; a linear probe with a linear head)")
    recipe.add_argument("--metric", default=None,
                        help="metric that picks OUT/best (default: the task's, e.g. accuracy)")
    recipe.add_argument("--eval-limit", type=int, default=None,
                        help="evaluate on the first N --eval rows (of each task) during training")
    recipe.add_argument("--bucket", type=int, default=None,
                        help="batch examples of similar length, drawn from windows of N batches (less padding)")
    recipe.add_argument("--eval-batch-size", type=int, default=None, help="batch size of evaluation")
    recipe.add_argument("--loss", default=None, choices=EMBEDDING_LOSSES,
                        help="embedding: Sentence-BERT loss (default: mnrl, in-batch negatives; triplet; cosine; "
                             "softmax: SBERT's NLI classifier on (u, v, |u - v|) over the label column's classes)")
    _add_peft_flags(parser)
    _add_trainer_flags(parser)
    parser.set_defaults(func=run)
