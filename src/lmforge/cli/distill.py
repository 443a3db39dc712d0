"""``lmforge distill``: knowledge distillation of a teacher into a smaller student (see :mod:`lmforge.distillation`).

Two kinds, chosen by the data given:

* ``--data SHARDS``: pre-training distillation, DistilBERT-style. The teacher is a pre-trained model folder; the
  student (default: the teacher's config with half its layers, initialised from every other teacher layer)
  learns alpha_ce * soft-target KL + alpha_mlm * MLM + alpha_cos * cosine loss on the shards of ``lmforge data
  prepare``. ``OUT/model`` is an ordinary model folder.
* ``--train FILE``: task distillation. The teacher is a fine-tuned classifier (``lmforge finetune --task
  classify``); the student learns alpha * soft-target KL + (1 - alpha) * CE(gold). ``OUT/best`` and
  ``OUT/model`` are task folders for ``lmforge evaluate`` and ``predict``.

``--resume`` continues a run from its newest checkpoint with the settings saved in ``OUT/distill.yaml`` (and
``OUT/config.yaml``), so ``lmforge distill --out RUN --resume`` is enough; flags given again override them.

Example::

    $ lmforge distill --teacher runs/bert --data data/corpus --out runs/distilbert --max-steps 2000
    $ lmforge distill --teacher runs/bert --student bert-tiny --override n_layers=2 --data data/corpus \\
          --out runs/small --alpha-cos 0 --temperature 4
    $ lmforge distill --teacher runs/rt/best --train rt-sentiment:train --eval rt-sentiment:dev --out runs/rt-small
    $ lmforge distill --out runs/distilbert --resume
    $ lmforge distill --method tinybert --teacher runs/bert --data data/corpus --out runs/tiny --override n_layers=2
    $ lmforge distill --method tinybert --teacher runs/rt/best --student runs/tiny/model --train rt-sentiment:train \
          --eval rt-sentiment:dev --out runs/tiny-rt --temperature 1 --augment 4 --augment-model runs/bert
    $ torchrun --nproc-per-node 8 -m lmforge.cli.main distill --teacher runs/bert --data data/corpus --out runs/d
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import UserError, plain_warnings
from lmforge.cli.pretrain import OPTIONS
from lmforge.distillation.config import METHODS, DistillConfig, saved_settings
from lmforge.distillation.pretraining import OBJECTIVES, build_distillation
from lmforge.distillation.student import describe_init
from lmforge.distillation.task import distill_task
from lmforge.distillation.tinybert import INTERMEDIATE_DIR, build_general_distillation, distill_task_tinybert
from lmforge.evaluation import named
from lmforge.tasks.settings import FINETUNE_DEFAULTS
from lmforge.training import config as tc
from lmforge.training import distributed
from lmforge.training.config import TrainConfig, setting_names
from lmforge.training.trainer import run_started
from lmforge.utils.flags import add_dataclass_flags, key_values
from lmforge.utils.lock import refuse_if_held, removed_on_failure

# (flag, type, help) of the DistillConfig fields; the defaults are shown from the dataclass.
DISTILL_FLAGS = [
    ("teacher", str, "teacher: a pre-trained model folder (with --data) or a fine-tuned task folder (with "
                     "--train); a run folder means its best/, else its model/"),
    ("student", str, "student: a preset, config file or model folder (default: the teacher's config with half its "
                     "layers); a preset gets half the teacher's layers and its vocabulary unless --override says "
                     "otherwise, and starts from every other teacher layer when the shapes allow"),
    ("train", str, "task distillation: training texts with gold labels (.tsv .csv .jsonl .parquet, a dataset folder "
                   "DIR:SPLIT, or NAME:SPLIT)"),
    ("eval", str, "task distillation: evaluation data, scored during training (picks OUT/best)"),
    ("alpha_ce", float, "pre-training: weight of the soft-target KL (scaled by T^2)"),
    ("alpha_mlm", float, "pre-training: weight of the student's own objective loss (MLM, or next-token CE)"),
    ("alpha_cos", float, "pre-training: weight of the cosine loss between student and teacher last hidden states "
                         "(needs the same d_model; 0 turns it off)"),
    ("alpha", float, "task: weight of the soft-target KL; 1 - alpha goes to the gold labels' cross-entropy"),
    ("temperature", float, "softmax temperature T of the soft targets (higher: softer)"),
    ("epochs", float, "task: passes over the training data (sets --max-steps)"),
    ("warmup_ratio", float, "task: warmup as a share of the steps (sets --warmup)"),
    ("method", str, "distilbert: the losses above; tinybert (Jiao et al. 2020): with --data, general distillation "
                    "of the embeddings, hidden states and attention scores; with --train, the same on the fine-tuned "
                    "teacher (OUT/intermediate), then the prediction layer's soft cross-entropy (OUT)"),
    ("layer_map", str, "tinybert: STUDENT:TEACHER layer pairs, 0 = the embeddings, e.g. 0:0,1:3,2:6 (default: the "
                       "uniform g(m) = m * N / M, which needs the teacher's layer count to be a multiple of the "
                       "student's)"),
    ("intermediate_epochs", float, "tinybert, task: passes of the intermediate-layer phase (default: --epochs, "
                                   "else --max-steps)"),
    ("augment", int, "tinybert, task: augmented copies of each training example, written to OUT/augmented.jsonl "
                     "(the paper: 20; 0 turns it off)"),
    ("augment_p", float, "tinybert, task: probability of replacing each word of a copy"),
    ("augment_k", int, "tinybert, task: candidates per word (MLM top-k or static-vector neighbours)"),
    ("augment_model", str, "tinybert, task: a pre-trained MLM model folder (the teacher's tokenizer) proposing "
                           "single-piece words; multi-piece words take neighbours of static vectors of --train"),
]
METAVARS = {"teacher": "DIR", "student": "PRESET|DIR", "train": "FILE", "eval": "FILE", "temperature": "T",
            "layer_map": "S:T,...", "augment": "N", "augment_p": "P", "augment_k": "K", "augment_model": "DIR",
            "intermediate_epochs": "E", "method": "distilbert|tinybert"}
CHOICES = {"method": METHODS}
# The Trainer's flags as `lmforge pretrain` words them; the student, data and run folder are flags of their own.
OBJECTIVE_HELP = ("pre-training: the objective whose batches both models read (default: clm for a decoder teacher, "
                  "else mlm)")
TRAINER_OPTIONS = [(k, OBJECTIVE_HELP if k == "objective" else text) for k, text in OPTIONS
                   if k not in ("model", "data", "out")]


def _settings(given: dict) -> tuple[TrainConfig, DistillConfig]:
    """Defaults, then (with --resume) the run folder's saved settings, then the flags given."""
    out = given.get("out")
    if not out:
        raise UserError("missing --out: the run folder")
    resume = bool(given.get("resume"))
    saved = saved_settings(out) if resume else {}
    if given.get("task") is not None:  # a task by name (glue/sst2): its training and evaluation splits
        train, evaluation = named.distill_sources(given["task"], given.get("data_dir"))
        given = {**given, "train": given.get("train") or train, "eval": given.get("eval") or evaluation}
    elif given.get("data_dir") is not None:  # --resume of a run by name: its NAME:SPLIT sources read from here
        for source in (given.get("train"), given.get("eval"), *saved.get("distill", {}).values()):
            if isinstance(source, str) and ":" in source:
                named.use_data_dir(source.partition(":")[0], given["data_dir"])
    distill_given = {k: v for k, v in given.items() if k in DistillConfig.config_keys() and v is not None}
    distill = DistillConfig.from_dict({**saved.get("distill", {}), **distill_given}, source="command line")
    trainer_given = {k: v for k, v in given.items() if k in setting_names() and v is not None}
    if given.get("override"):
        trainer_given["overrides"] = key_values(given["override"], "--override")
    if given.get("objective_option"):
        trainer_given["objective_options"] = key_values(given["objective_option"], "--objective-option",
                                                        "mlm_probability=0.2")
    trainer_given["out"] = out
    if resume and (Path(out) / "config.yaml").is_file():  # pre-training distillation keeps them there
        config = TrainConfig.load(Path(out) / "config.yaml")
    elif resume and "trainer" in saved:
        config = TrainConfig.from_dict(saved["trainer"], source=f"{out}/distill.yaml")
    elif distill.train:
        config = TrainConfig.from_dict(FINETUNE_DEFAULTS, source="defaults")  # fine-tuning's recipe
    else:
        config = TrainConfig()
    config = config.updated(trainer_given, source="command line")
    if resume and not saved:
        if not Path(out).exists():
            raise UserError(f"--out {out}: no such folder, so there is no run to resume; check the path, or start "
                            "a run there without --resume")
        if not distill.teacher:
            raise UserError(f"--out {out}: holds no distillation run to resume (no distill.yaml); check the path, "
                            "or start a run there without --resume")
    if distill.train and config.data:
        raise UserError("give --data (pre-training distillation) or --train (task distillation), not both")
    if not distill.train and not config.data:
        raise UserError("give --data SHARDS (pre-training distillation on `lmforge data prepare` shards) or "
                        "--train FILE (task distillation with a fine-tuned --teacher)")
    return config, distill


def run(args) -> int:
    given = vars(args)
    with plain_warnings("distill"):
        config, distill = _settings(given)
        refuse_if_held(config.out)  # at once, not after minutes of building what it could not write
        # A run that fails before its first step leaves no folder holding only its settings behind.
        with removed_on_failure(config.out, keep=_started):
            if distill.method == "tinybert":
                return _tinybert_task(config, distill) if distill.train else _tinybert_general(config, distill)
            if distill.train:
                return _task(config, distill)
            return _pretraining(config, distill)


def _started(out) -> bool:
    """A run that took a step, or a TinyBERT task run whose intermediate phase did: kept on a failure."""
    return run_started(out) or run_started(Path(out) / INTERMEDIATE_DIR)


def _tinybert_general(config: TrainConfig, distill: DistillConfig) -> int:
    with distributed.session(config.strategy, config.device, config.dist_timeout) as ctx:
        built, mapping = build_general_distillation(config, distill)
        student, trainer = built.model, built.trainer
        if ctx.is_main:
            pairs = ",".join(f"{m}:{n}" for m, n in mapping.items())
            print(f"teacher {distill.teacher} -> student {student.config.n_layers} layers, d={student.config.d_model}"
                  f", {student.num_parameters() / 1e6:.2f}M parameters | TinyBERT general distillation, layer map "
                  f"{pairs} | objective {built.config.objective} batches | out {config.out}", file=sys.stderr)
        result = trainer.fit()
    return _report(result.stopped_by, result.step, result.model_dir, result.metrics.get("loss"), config.out,
                   ctx.is_main)


def _tinybert_task(config: TrainConfig, distill: DistillConfig) -> int:
    return _task_report(distill_task_tinybert(config, distill, log=lambda line: print(line, file=sys.stderr)),
                        config)


def _pretraining(config: TrainConfig, distill: DistillConfig) -> int:
    with distributed.session(config.strategy, config.device, config.dist_timeout) as ctx:
        built, layers = build_distillation(config, distill)
        student, trainer = built.model, built.trainer
        teacher = trainer.loss.teacher
        if ctx.is_main:
            dtype = "bf16" if trainer.autocast_dtype is not None else "fp32"
            print(f"teacher {distill.teacher} ({teacher.config.n_layers} layers) -> student "
                  f"{student.config.n_layers} layers, {student.num_parameters() / 1e6:.2f}M parameters, "
                  f"{describe_init(distill.student, layers) if not built.config.resume else 'resumed'} | objective "
                  f"{built.config.objective} | loss {distill.alpha_ce:g} ce + {distill.alpha_mlm:g} mlm + "
                  f"{distill.alpha_cos:g} cos, T={distill.temperature:g} | {dtype} on {trainer.device} | "
                  f"out {config.out}", file=sys.stderr)
        result = trainer.fit()
    return _report(result.stopped_by, result.step, result.model_dir, result.metrics.get("loss"), config.out,
                   ctx.is_main)


def _task(config: TrainConfig, distill: DistillConfig) -> int:
    return _task_report(distill_task(config, distill, log=lambda line: print(line, file=sys.stderr))[0], config)


def _task_report(result, config: TrainConfig) -> int:
    """A task distillation's best checkpoint and end, as ``lmforge finetune`` prints them."""
    train = result.train
    if result.best:
        b = result.best
        print(f"best: {b['metric']} {b['value']:.4f} at step {b['step']} -> {Path(config.out) / 'best'}")
    return _report(train.stopped_by, train.step, train.model_dir, train.metrics.get("loss"), config.out, True)


def _report(stopped_by: str, step: int, model_dir, loss, out, main: bool) -> int:
    if stopped_by in ("SIGINT", "SIGTERM"):
        if main:
            print(f"stopped by {stopped_by} at step {step}. Continue with: lmforge distill --out {out} --resume",
                  file=sys.stderr)
        return 128 + int(getattr(signal, stopped_by))
    if main:
        shown = f", loss {loss:.4f}" if isinstance(loss, float) else ""
        print(f"done: step {step}{shown}, student saved to {model_dir}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "distill", help="distil a teacher into a smaller student (DistilBERT pre-training, or a fine-tuned task)",
        description="Knowledge distillation through the Trainer (checkpoints, --resume, bf16; torchrun with "
                    "--data). With --data: pre-training distillation (soft-target KL + MLM + cosine loss), ending in "
                    "OUT/model, a model folder. With --train: task distillation of a fine-tuned classifier (soft "
                    "labels + gold labels), ending in task folders OUT/model and OUT/best. Settings are saved in "
                    "OUT/distill.yaml.",
        argument_default=argparse.SUPPRESS)
    what = parser.add_argument_group("teacher, student, data")
    defaults = DistillConfig()
    for key, kind, text in DISTILL_FLAGS:
        default = getattr(defaults, key)
        what.add_argument("--" + key.replace("_", "-"), dest=key, type=kind, default=None,
                          metavar=METAVARS.get(key, key.upper().replace("_", "-")), choices=CHOICES.get(key),
                          help=text + ("" if default is None else f" (default: {default})"))
    what.add_argument("--task", default=None, metavar="NAME",
                      help="task distillation on a task by name (see `lmforge tasks list`, e.g. glue/sst2): --train "
                           "and --eval default to its training and first evaluation split")
    what.add_argument("--data-dir", default=None, metavar="DIR",
                      help="--task NAME: the suite's folder in its official layout (else $LMFORGE_GLUE_DIR ...)")
    what.add_argument("--data", default=None, metavar="SHARDS",
                      help="pre-training distillation: prepared shards (output of `lmforge data prepare`; the "
                           "teacher's tokenizer)")
    what.add_argument("--out", default=None, metavar="DIR", help="run folder: settings, checkpoints, logs, the student")
    what.add_argument("--override", action="append", default=None, metavar="KEY=VALUE",
                      help="set a student ModelConfig field, e.g. --override n_layers=2 (repeatable)")
    what.add_argument("--objective-option", action="append", default=None, metavar="KEY=VALUE",
                      help="pre-training: set an objective argument, e.g. --objective-option mlm_probability=0.2")
    group = parser.add_argument_group("training (as for `lmforge pretrain`; task distillation starts from "
                                      "`lmforge finetune`'s defaults)")
    add_dataclass_flags(group, TrainConfig, TRAINER_OPTIONS,
                        choices={"objective": OBJECTIVES, "schedule": tc.SCHEDULES, "precision": tc.PRECISIONS,
                                 "device": tc.DEVICES, "strategy": tc.STRATEGIES,
                                 "fsdp_param_dtype": tc.FSDP_PARAM_DTYPES, "fsdp_reduce_dtype": tc.FSDP_REDUCE_DTYPES})
    add_load_flags(parser)
    parser.set_defaults(func=run)

