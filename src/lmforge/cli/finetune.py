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
import dataclasses
import json
import sys
import typing
from pathlib import Path

import yaml

from lmforge.cli.main import UserError, plain_warnings
from lmforge.embeddings.losses import EMBEDDING_LOSSES

SETTINGS_FILE = "finetune.yaml"
MERGED_DIR = "merged"  # --merge: a plain task folder with the PEFT adapter folded in
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
    "loss_average": ("HOW", "seq2seq/text2text: token (default: over all target tokens of a batch) | example "
                            "(each example's mean counts once: a mixture's one-word labels are not drowned out)"),
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


def _peft_option(text: str) -> tuple[str, object]:
    """``"r=16"`` -> ("r", 16): the value converted to the PeftConfig field's type (targets: comma-separated)."""
    from lmforge.peft import PeftConfig

    key, sep, raw = text.partition("=")
    key, raw = key.strip().replace("-", "_"), raw.strip()
    if not sep or not key:
        raise UserError(f"--peft-option {text!r}: expected KEY=VALUE, e.g. r=16 or targets=q,v")
    defaults = {f.name: f.default for f in dataclasses.fields(PeftConfig)}
    if key == "method":
        raise UserError("--peft-option method: name the method with --peft METHOD")
    if key not in defaults:
        raise UserError(f"--peft-option {key}: not a PEFT option (options: "
                        f"{', '.join(k for k in defaults if k != 'method')})")
    default = defaults[key]
    try:
        if key == "targets":
            return key, [t.strip() for t in raw.split(",") if t.strip()]
        if isinstance(default, bool):
            return key, {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}[raw.lower()]
        if isinstance(default, (int, float)):
            return key, type(default)(raw)
    except (KeyError, ValueError):
        kind = ("true or false" if isinstance(default, bool) else "an integer" if isinstance(default, int)
                else "a number")
        raise UserError(f"--peft-option {text!r}: {key} must be {kind}") from None
    return key, raw


def _peft_settings(given: dict, saved: dict | None, resuming: bool) -> dict | None:
    """The PeftConfig of the run as a dict (None: full fine-tuning), from --peft-config, --peft and --peft-option;
    a resumed run keeps its own and refuses different ones."""
    from lmforge.config import ConfigError
    from lmforge.peft import PeftConfig

    if not any(given.get(k) for k in ("peft", "peft_option", "peft_config")):
        return saved
    fields = {}
    if given.get("peft_config"):
        try:
            fields = PeftConfig.load(given["peft_config"]).options()
        except ConfigError as exc:
            raise UserError(f"--peft-config: {exc}") from exc
    if given.get("peft"):
        fields["method"] = given["peft"]
    if "method" not in fields:
        raise UserError("--peft-option needs --peft METHOD (or a --peft-config file naming the method)")
    fields.update(_peft_option(text) for text in given.get("peft_option") or [])
    try:
        cfg = PeftConfig.from_dict(fields).to_dict()
    except ConfigError as exc:
        raise UserError(f"--peft {fields['method']}: {str(exc).removeprefix('PeftConfig: ')}") from exc
    if resuming and cfg != saved:
        what = f"PEFT settings {PeftConfig.from_dict(saved).options()}" if saved else "full fine-tuning"
        raise UserError(f"--peft: this run was started with {what}; resume it without --peft/--peft-option/"
                        "--peft-config, or with the same settings")
    return cfg


def _check_merge(peft: dict | None) -> None:
    from lmforge.peft.config import MERGEABLE

    if not peft:
        raise UserError("--merge folds a PEFT adapter into the model; it needs --peft")
    if peft["method"] not in MERGEABLE:
        raise UserError(f"--merge: a {peft['method']} adapter cannot be folded into the weights (only "
                        f"{', '.join(MERGEABLE)} can)")


def _settings(args) -> dict:
    """Every setting of the run as plain data (what OUT/finetune.yaml holds)."""
    given = vars(args)
    saved = {}
    if given.get("resume") and given.get("out") and (Path(given["out"]) / SETTINGS_FILE).is_file():
        saved = yaml.safe_load((Path(given["out"]) / SETTINGS_FILE).read_text(encoding="utf-8")) or {}
    settings = {"model": None, "tokenizer": None, "random_init": False, "train": None, "eval": None,
                "out": None, "task": {}, "recipe": {}, "trainer": dict(FINETUNE_DEFAULTS), "peft": None,
                "merge": False, **saved}
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
    settings["peft"] = _peft_settings(given, settings["peft"], bool(saved))
    if given.get("merge"):
        settings["merge"] = True
    if settings["merge"]:
        _check_merge(settings["peft"])
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
        if any(getattr(args, k, None) for k in ("peft", "peft_option", "peft_config", "merge")):
            raise UserError("--peft and --merge are not supported with --task embedding (it has its own recipe)")
        from lmforge.embeddings.sbert import run_embedding_finetune

        return run_embedding_finetune(args)
    from lmforge.peft import PeftConfig
    from lmforge.tasks.finetune import finetune
    from lmforge.tasks.recipe import Recipe
    from lmforge.tasks.spec import TaskSpec
    from lmforge.training.config import TrainConfig
    from lmforge.utils.io import atomic_write_text

    settings = _settings(args)
    if settings["task"].get("task") == "instruct" and settings["peft"]:
        raise UserError("--peft is not supported with --task instruct (it has its own recipe)")
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
    peft = PeftConfig.from_dict(settings["peft"], source=f"{out / SETTINGS_FILE}: peft") if settings["peft"] else None
    if peft is not None and recipe.freeze_body:
        raise UserError("--freeze-body trains the head only; it cannot be combined with --peft")
    with plain_warnings("finetune"):
        result = finetune(settings["model"], spec, settings["train"], settings["eval"], config=config, recipe=recipe,
                          out=out, tokenizer=settings["tokenizer"], random_init=settings["random_init"],
                          epochs=epochs, warmup_ratio=warmup_ratio, peft=peft,
                          log=lambda m: print(m, file=sys.stderr))
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
    if settings["merge"]:
        from lmforge.tasks.peft import merge_task_folder

        source = out / "best" if result.best else train.model_dir
        merged = merge_task_folder(source, out / MERGED_DIR)
        print(f"merged: {source} with its adapter folded in -> {merged}")
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


def _add_peft_flags(parser) -> None:
    from lmforge.peft import METHODS

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
    from lmforge.tasks.spec import LOSS_AVERAGES, POOLINGS, TASKS

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
    what.add_argument("--pack", action="store_true", default=False,  # the parser's default is SUPPRESS
                      help="instruct: pack short examples (block-diagonal mask)")
    what.add_argument("--train", default=None, metavar="FILE",
                      help="training data (.tsv .csv .jsonl .conll, or NAME:SPLIT)")
    what.add_argument("--eval", default=None, metavar="FILE", help="evaluation data, for --metric and OUT/best")
    what.add_argument("--out", default=None, metavar="DIR", help="run folder")
    task = parser.add_argument_group("task format")
    for key, (metavar, text) in TASK_FLAGS.items():
        kind = {"classifier_dropout": float, "mixing_temperature": float, "max_length": int, "max_target_length": int,
                "max_answer_length": int, "mixing_cap": int}.get(key, str)
        task.add_argument("--" + key.replace("_", "-"), dest=key, type=kind, default=None, metavar=metavar, help=text,
                          choices={"pooling": POOLINGS, "loss_average": LOSS_AVERAGES}.get(key))
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
    recipe.add_argument("--loss", default=None, choices=EMBEDDING_LOSSES,
                        help="embedding: Sentence-BERT loss (default: mnrl, in-batch negatives)")
    _add_peft_flags(parser)
    _add_trainer_flags(parser)
    parser.set_defaults(func=run)
