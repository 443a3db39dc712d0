"""``lmforge finetune``: fine-tune a model on a task from a TSV, CSV, JSONL or CoNLL file.

The model is a preset (with ``--tokenizer``), an lmforge model folder, or a Hugging Face folder (converted on
the fly). The run folder gets the Trainer's checkpoints and logs, ``best/`` (the best evaluation by
``--metric``) and ``model/`` (the last step); both are task folders for ``lmforge evaluate`` and ``predict``.
``--resume`` continues a run from its last checkpoint with the settings saved in ``OUT/finetune.yaml``.

Example::

    $ lmforge convert from-hf path/to/all-MiniLM-L6-v2 minilm
    $ lmforge finetune --model minilm --task classify --train rt-sentiment:train --eval rt-sentiment:dev \\
          --out runs/rt --epochs 1 --batch-size 16 --lr 5e-5 --warmup-ratio 0.1 --layer-decay 0.9
    $ lmforge finetune --model t5-tiny --tokenizer tok/ --task text2text --train sst.tsv \\
          --task-prefix "sst2 sentence: " --label-map 0=negative,1=positive --out runs/t5
    $ lmforge finetune --model t5-tiny --tokenizer tok/ --task text2text --mixture tasks.yaml --out runs/mix
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path

import yaml

from lmforge.cli.main import UserError, plain_warnings

SETTINGS_FILE = "finetune.yaml"
# Trainer flags shared with `lmforge pretrain` (its help texts); fine-tuning changes some defaults.
TRAINER_KEYS = ("max_steps", "batch_size", "grad_accum", "lr", "warmup", "schedule", "min_lr_ratio", "weight_decay",
                "grad_clip", "cut_frac", "stlr_ratio", "eval_every", "save_every", "keep_checkpoints", "precision",
                "compile", "activation_checkpointing", "device", "seed", "resume", "progress", "tensorboard")
FINETUNE_DEFAULTS = {"lr": 5e-5, "schedule": "linear", "max_steps": 1000, "batch_size": 16, "eval_every": 100,
                     "save_every": 500, "weight_decay": 0.01}
TASK_FLAGS = {
    "text_column": ("NAME", "column of the input text (tag: the words; qa: the question)"),
    "text_pair_column": ("NAME", "column of the second text of a pair (qa: the context)"),
    "label_column": ("NAME", "column of the label (classify/regress/multilabel/tag; text2text with --label-map)"),
    "target_column": ("NAME", "column of the target text (seq2seq/text2text) or answers (qa)"),
    "task_prefix": ("TEXT", "text put before every input (seq2seq/text2text), e.g. 'translate English to Spanish: '"),
    "pair_prefix": ("TEXT", "text2text: put before the second text of a pair, e.g. 'sentence2: '"),
    "label_separator": ("SEP", "multilabel: separator of the labels in one cell (default ,)"),
    "pooling": ("MODE", "cls | mean | last | max (default: cls for encoders, last for decoders/encoder-decoders)"),
    "classifier_dropout": ("P", "dropout before the classifier (default 0.1)"),
    "max_length": ("N", "input tokens; longer inputs are cut with a warning (default 256)"),
    "max_target_length": ("N", "target tokens for seq2seq/text2text, also the generation limit (default 128)"),
    "max_answer_length": ("N", "qa: longest answer span in tokens (default 30)"),
    "mixing_cap": ("K", "text2text mixture: examples-proportional mixing cap"),
    "mixing_temperature": ("T", "text2text mixture: mixing temperature (1 = proportional)"),
}


def parse_label_map(value: str | None) -> dict[str, str]:
    """``"0=negative,1=positive"``, a JSON object, or a .json/.yaml file -> {label: word}."""
    if not value:
        return {}
    path = Path(value)
    if path.suffix in (".json", ".yaml", ".yml") and path.is_file():
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    elif value.lstrip().startswith("{"):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise UserError(f"--label-map {value!r}: not valid JSON ({exc})") from exc
    else:
        data = {}
        for pair in value.split(","):
            label, sep, word = pair.partition("=")
            if not sep or not label.strip() or not word.strip():
                raise UserError(f"--label-map {value!r}: expected LABEL=WORD pairs, e.g. 0=negative,1=positive")
            data[label.strip()] = word.strip()
    if not isinstance(data, dict):
        raise UserError(f"--label-map {value!r}: expected a mapping of label to word")
    return {str(k): str(v) for k, v in data.items()}


def _mixture(path: str | None) -> list[dict]:
    if not path:
        return []
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such mixture file")
    data = yaml.safe_load(file.read_text(encoding="utf-8"))
    entries = data.get("tasks") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{file}: expected a list of tasks (each with name, train, columns, task_prefix ...)")
    for entry in entries:
        if isinstance(entry, dict) and "label_map" in entry:
            entry["label_map"] = {str(k): str(v) for k, v in (entry["label_map"] or {}).items()}
        for key in ("train", "eval"):  # relative file names are relative to the mixture file
            if isinstance(entry, dict) and entry.get(key) and not Path(entry[key]).is_absolute() \
                    and (file.parent / entry[key]).exists():
                entry[key] = str(file.parent / entry[key])
    return entries


def _settings(args) -> dict:
    """Every setting of the run as plain data (what OUT/finetune.yaml holds)."""
    given = vars(args)
    saved = {}
    if given.get("resume") and given.get("out") and (Path(given["out"]) / SETTINGS_FILE).is_file():
        saved = yaml.safe_load((Path(given["out"]) / SETTINGS_FILE).read_text(encoding="utf-8")) or {}
    settings = {"model": None, "tokenizer": None, "random_init": False, "train": None, "eval": None,
                "out": None, "task": {}, "recipe": {}, "trainer": dict(FINETUNE_DEFAULTS), **saved}
    for key in ("model", "tokenizer", "train", "eval", "out"):
        if given.get(key) is not None:
            settings[key] = given[key]
    if given.get("random_init"):
        settings["random_init"] = True
    task = dict(settings["task"])
    if given.get("task"):
        task["task"] = given["task"]
    for key in TASK_FLAGS:
        if given.get(key) is not None:
            task[key] = given[key]
    if given.get("label_map") is not None:
        task["label_map"] = parse_label_map(given["label_map"])
    if given.get("mixture") is not None:
        task["mixture"] = _mixture(given["mixture"])
    settings["task"] = task
    recipe = dict(settings["recipe"])
    for key in ("layer_decay", "unfreeze_every", "freeze_body", "metric", "eval_limit", "eval_batch_size",
                "epochs", "warmup_ratio", "bucket"):
        if given.get(key) is not None and given.get(key) is not False:
            recipe[key] = given[key]
    settings["recipe"] = recipe
    trainer = dict(settings["trainer"])
    trainer.update({k: given[k] for k in TRAINER_KEYS if k in given})
    settings["trainer"] = trainer
    for key, flag in (("model", "--model"), ("out", "--out")):
        if not settings[key]:
            raise UserError(f"missing {flag}")
    if not task.get("task"):
        raise UserError("missing --task (classify, regress, multilabel, tag, qa, seq2seq, text2text, instruct "
                        "or embedding)")
    if not settings["train"] and not task.get("mixture"):
        raise UserError("missing --train FILE (or --mixture FILE for a text2text mixture)")
    return settings


def run(args) -> int:
    if getattr(args, "task", None) == "embedding":  # Sentence-BERT: its own recipe (lmforge.embeddings.sbert)
        from lmforge.cli._embedding_args import run_embedding_finetune

        return run_embedding_finetune(args)
    from lmforge.tasks.finetune import Recipe, finetune
    from lmforge.tasks.spec import TaskSpec
    from lmforge.training.config import TrainConfig
    from lmforge.utils.io import atomic_write_text

    settings = _settings(args)
    if settings["task"].get("task") == "instruct":  # decoder SFT on instruction/chat JSONL
        from lmforge.prompting.instruct import finetune_instruct_from_settings

        result = finetune_instruct_from_settings(settings, pack=args.pack)
        print(f"done: step {result.step}, final model saved to {result.model_dir}")
        return 0
    recipe_settings = dict(settings["recipe"])
    epochs, warmup_ratio = recipe_settings.pop("epochs", None), recipe_settings.pop("warmup_ratio", None)
    spec = TaskSpec.from_dict(settings["task"], source="command line")
    recipe = Recipe(**recipe_settings)
    config = TrainConfig.from_dict({**settings["trainer"], "model": str(settings["model"]), "out": settings["out"]},
                                   source="command line")
    out = Path(settings["out"])
    if not config.resume and out.is_dir() and (out / "checkpoints").is_dir():
        raise UserError(f"{out} already holds a run: continue it with --resume, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / SETTINGS_FILE, yaml.safe_dump({k: v for k, v in settings.items()}, sort_keys=False))
    with plain_warnings("finetune"):
        result = finetune(settings["model"], spec, settings["train"], settings["eval"], config=config, recipe=recipe,
                          out=out, tokenizer=settings["tokenizer"], random_init=settings["random_init"],
                          epochs=epochs, warmup_ratio=warmup_ratio, log=lambda m: print(m, file=sys.stderr))
    train = result.train
    if train.stopped_by in ("SIGINT", "SIGTERM"):
        import signal

        print(f"stopped by {train.stopped_by} at step {train.step}; continue with: lmforge finetune --out {out} "
              "--resume", file=sys.stderr)
        return 128 + int(getattr(signal, train.stopped_by))
    if result.best:
        b = result.best
        print(f"best: {b['metric']} {b['value']:.4f} at step {b['step']} -> {out / 'best'}")
    print(f"done: step {train.step}, final model saved to {train.model_dir}")
    return 0


def _add_trainer_flags(parser) -> None:
    from lmforge.cli.pretrain import CHOICES, OPTIONS
    from lmforge.training import config as tc

    texts = dict(OPTIONS)
    texts.update({"cut_frac": "slanted-triangular: share of the steps spent rising",
                  "stlr_ratio": "slanted-triangular: ratio of the peak LR to the lowest"})
    hints = typing.get_type_hints(tc.TrainConfig)
    defaults = {**tc.TrainConfig().to_dict(), **FINETUNE_DEFAULTS}
    group = parser.add_argument_group("training (as for `lmforge pretrain`)")
    for key in TRAINER_KEYS:
        flag = "--" + key.replace("_", "-")
        default = defaults[key]
        kind = typing.get_args(hints[key])[0] if typing.get_args(hints[key]) else hints[key]
        if kind is bool and default:
            group.add_argument(f"--no-{key.replace('_', '-')}", dest=key, action="store_false",
                               help=texts[key] + " (on by default)")
        elif kind is bool:
            group.add_argument(flag, dest=key, action="store_true", help=texts[key])
        else:
            choices = getattr(tc, CHOICES[key]) if key in CHOICES else None
            group.add_argument(flag, dest=key, type=kind, choices=choices, help=f"{texts[key]} (default: {default})",
                               metavar=None if choices else key.upper().replace("_", "-"))


def register(subparsers) -> None:
    from lmforge.tasks.spec import POOLINGS, TASKS

    parser = subparsers.add_parser(
        "finetune", help="fine-tune a model on a task (classify, regress, multilabel, tag, qa, seq2seq, text2text)",
        description="Fine-tune a preset, an lmforge model folder or a Hugging Face folder on a TSV/CSV/JSONL/CoNLL "
                    "file (or a shipped data set NAME:SPLIT, e.g. rt-sentiment:train). Writes OUT/finetune.yaml, "
                    "OUT/checkpoints/, OUT/metrics.jsonl, OUT/best/ (best evaluation by --metric) and OUT/model/.",
        argument_default=argparse.SUPPRESS)
    what = parser.add_argument_group("what to fine-tune")
    what.add_argument("--model", default=None, help="preset name, lmforge model folder or Hugging Face folder")
    what.add_argument("--tokenizer", default=None, help="tokenizer folder (needed for presets)")
    what.add_argument("--random-init", action="store_true", default=False,
                      help="keep the architecture and tokenizer but start from random weights (a baseline)")
    what.add_argument("--task", default=None, choices=(*TASKS, "instruct", "embedding"),
                      help="the task (instruct: supervised fine-tuning on instruction/chat JSONL; "
                      "embedding: Sentence-BERT training with --loss)")
    what.add_argument("--pack", action="store_true", help="instruct: pack short examples (block-diagonal mask)")
    what.add_argument("--train", default=None, metavar="FILE",
                      help="training data (.tsv .csv .jsonl .conll, or NAME:SPLIT)")
    what.add_argument("--eval", default=None, metavar="FILE", help="evaluation data, for --metric and OUT/best")
    what.add_argument("--out", default=None, metavar="DIR", help="run folder")
    task = parser.add_argument_group("task format")
    for key, (metavar, text) in TASK_FLAGS.items():
        kind = {"classifier_dropout": float, "mixing_temperature": float, "max_length": int, "max_target_length": int,
                "max_answer_length": int, "mixing_cap": int}.get(key, str)
        task.add_argument("--" + key.replace("_", "-"), dest=key, type=kind, default=None, metavar=metavar, help=text,
                          choices=POOLINGS if key == "pooling" else None)
    task.add_argument("--label-map", default=None, metavar="MAP",
                      help="text2text: label words, '0=negative,1=positive', a JSON object or a .json/.yaml file")
    task.add_argument("--mixture", default=None, metavar="FILE.yaml",
                      help="text2text: train several tasks at once (a list of {name, train, eval, text_column, "
                           "target_column | label_column + label_map, task_prefix})")
    recipe = parser.add_argument_group("fine-tuning recipe")
    recipe.add_argument("--epochs", type=float, default=None, help="passes over the training data (sets --max-steps)")
    recipe.add_argument("--warmup-ratio", type=float, default=None,
                        help="warmup as a share of the steps (sets --warmup)")
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
    recipe.add_argument("--loss", default=None, choices=("mnrl", "triplet", "cosine"),
                        help="embedding: Sentence-BERT loss (default: mnrl, in-batch negatives)")
    _add_trainer_flags(parser)
    parser.set_defaults(func=run)
