"""``lmforge pretrain``: pre-train a model on prepared shards with one of the objectives.

Settings come from ``--config FILE.yaml`` (the keys of :class:`lmforge.training.TrainConfig`), and the command
line overrides the file. ``--resume`` continues the run in ``--out`` exactly where its last checkpoint left it;
without ``--config`` it reuses ``OUT/config.yaml``, so ``lmforge pretrain --out runs/x --resume`` is enough.

Example::

    $ lmforge data prepare corpus.txt --tokenizer tok/ --out data/corpus
    $ lmforge pretrain --model gpt-tiny --objective clm --data data/corpus --out runs/gpt \\
          --max-steps 2000 --batch-size 16 --lr 6e-4 --warmup 100 --override n_layers=4
    $ lmforge pretrain --out runs/gpt --resume          # after a crash, Ctrl-C or SIGTERM
    $ torchrun --nproc-per-node 8 -m lmforge.cli.main pretrain --config run.yaml --strategy fsdp

Under torchrun every rank runs this command; only rank 0 prints and writes. See docs/distributed.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import plain_warnings
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.training import config as tc
from lmforge.training import distributed
from lmforge.training.config import TrainConfig, read_settings, setting_names
from lmforge.training.pretrain import build_pretraining
from lmforge.training.resume_settings import RESUMABLE_FLAGS, refuse_trajectory_changes
from lmforge.training.seq_len_schedule import refuse_moved_switch
from lmforge.training.trainer import run_started
from lmforge.utils.flags import add_dataclass_flags, key_values
from lmforge.utils.folder_kinds import require_kind
from lmforge.utils.lock import refuse_if_held, removed_on_failure

# (setting, help). Types, defaults and choices come from TrainConfig, so the two cannot drift apart. A setting
# on by default is turned off by its --no- flag, and its help says what that flag does.
OPTIONS = [
    ("model", "preset name (e.g. gpt-tiny, bert-tiny, elmo-tiny or elmo-cnn-tiny for --objective bilm), config "
              "file or model folder (a folder's weights are loaded)"),
    ("objective", "pre-training objective (mlm+nsp: BERT's MLM plus next sentence prediction, which adds a "
                  "pooler and NSP head to the model; mlm alone is RoBERTa's no-NSP recipe; enc-dec-lm: T5's prefix "
                  "LM for encoder-decoders, the encoder reads a random prefix and the decoder writes the rest; span-corruption "
                  "and denoising also train a decoder (--objective-option layout=decoder or prefix-lm: input and "
                  "target concatenated); mass: MASS, an encoder-decoder decodes a masked half; permuted-lm: XLNet's "
                  "two-stream permuted LM on an encoder; unilm: UniLM's mixed attention masks on an encoder; "
                  "multilingual-denoising: mBART, BART's noise on several languages with language-id tokens, "
                  "--data holding one prepared folder per language; ul2: UL2's mixture of denoisers with mode "
                  "tokens, e.g. --objective-option denoisers=[R:3:0.15,S:0.25] --objective-option proportions=[3,1])"),
    ("tokenizer", "tokenizer folder (default: the copy inside --data)"),
    ("data", "prepared shards (output of `lmforge data prepare`); for multilingual-denoising a folder of them, "
             "one per language named by its code (DATA/en, DATA/es, ...)"),
    ("out", "run folder: config, tokenizer, checkpoints, logs, final model"),
    ("max_steps", "optimizer steps"),
    ("batch_size", "sequences per micro-batch"),
    ("grad_accum", "micro-batches per optimizer step (effective batch = batch-size x grad-accum)"),
    ("seq_len", "model input length (default: the model's max_seq_len)"),
    ("seq_len_schedule", "several input lengths in turn, as LENGTH:FRACTION of the steps, e.g. 128:0.9,512:0.1 "
                         "(BERT: 128 for 90%% of the steps, then 512); the batch stays in sequences, the optimizer "
                         "and LR schedule carry on, evaluation reads the longest length; not with --seq-len; "
                         "--resume refuses to change it, and a --max-steps that would move a switch"),
    ("lr", "peak learning rate"),
    ("warmup", "linear warmup steps"),
    ("schedule", "learning-rate schedule after warmup"),
    ("min_lr_ratio", "end of linear/cosine decay, as a share of --lr"),
    ("weight_decay", "AdamW weight decay (not applied to biases, norms, embeddings)"),
    ("label_smoothing", "label smoothing eps of the token cross-entropy: targets (1 - eps) one-hot + eps / V "
                        "(the original Transformer: 0.1; 0 = off)"),
    ("grad_clip", "clip the global gradient norm to this (0: off)"),
    ("max_nonfinite_steps", "stop with an error after this many steps in a row with a non-finite loss or "
                            "gradient norm (their updates are skipped; 0: never stop)"),
    ("eval_every", "evaluate on the val split every N steps (0: never)"),
    ("eval_batches", "batches per evaluation"),
    ("save_every", "write a checkpoint every N steps (and always at the end)"),
    ("keep_checkpoints", "how many of the newest checkpoints to keep"),
    ("final_checkpoint", "what a finished run keeps: full (weights and optimizer state, so --resume --max-steps "
                         "extends it exactly), weights (no optimizer state: an extension restarts the optimizer) "
                         "or none (only the model folder; the checkpoints are removed); the summary says what "
                         "each saves"),
    ("precision", "bf16 autocast or fp32; auto = bf16 where the hardware has it"),
    ("compile", "torch.compile the model"),
    ("activation_checkpointing", "recompute activations in backward to save memory"),
    ("device", "where to train (under torchrun: cuda:LOCAL_RANK)"),
    ("strategy", "single process, DDP or FSDP2; auto = ddp under torchrun with several processes"),
    ("fsdp_param_dtype", "FSDP: dtype parameters are all-gathered in for compute; auto follows --precision"),
    ("fsdp_reduce_dtype", "FSDP: dtype of the gradient reduce-scatter"),
    ("fsdp_cpu_offload", "FSDP: keep sharded parameters, gradients and optimizer state in host memory"),
    ("dist_timeout", "seconds a collective waits for a silent rank (hung, or its node lost) before every rank "
                     "stops with one line (default: torch's, 30 min with gloo, 10 min with NCCL)"),
    ("num_workers", "DataLoader worker processes"),
    ("seed", "seed of initial weights, data order, masking and dropout"),
    ("resume", "continue the run in --out from its newest intact checkpoint, with the settings it saved. Only "
               f"these may change on resume: {RESUMABLE_FLAGS}; each change is appended to OUT/history.jsonl. Any "
               "other difference (lr, schedule, batch, model, data, objective, seed, PEFT, lengths, precision) is "
               "refused, and nothing is written"),
    ("progress", "hide the progress bar (it is shown by default)"),
    ("tensorboard", "do not write TensorBoard events (they are written to OUT/tensorboard/ by default)"),
    ("region", "grid region for the run's CO2e (world, us, eu, fr, ...; default world); see `lmforge cost`"),
    ("grid_intensity", "grid carbon intensity in g CO2e per kWh (overrides --region)"),
    ("power_watts", "estimated power draw of one device when no energy counter is readable (default: 65 W "
                    "CPU, 300 W GPU)"),
    ("price_per_hour", "US dollars per device-hour for the run's cost (default: 0.05 CPU, 2.00 GPU)"),
]
CHOICES = {"objective": "PRETRAIN_OBJECTIVES", "schedule": "SCHEDULES", "precision": "PRECISIONS",
           "device": "DEVICES", "strategy": "STRATEGIES", "fsdp_param_dtype": "FSDP_PARAM_DTYPES",
           "fsdp_reduce_dtype": "FSDP_REDUCE_DTYPES", "final_checkpoint": "FINAL_CHECKPOINTS"}


def _settings(args):
    """The run's TrainConfig: defaults, then --config FILE (or OUT/config.yaml when resuming), then the flags."""
    given = {k: v for k, v in vars(args).items() if k in setting_names()}
    given["overrides"] = key_values(args.override, "--override")
    given["objective_options"] = key_values(args.objective_option, "--objective-option", "mlm_probability=0.2")
    if args.config:
        config = TrainConfig.from_dict(read_settings(args.config), source=args.config)
    elif given.get("resume") and given.get("out") and (Path(given["out"]) / "config.yaml").is_file():
        config = TrainConfig.load(Path(given["out"]) / "config.yaml")
    else:
        config = TrainConfig()
    source = "command line" if not args.config else f"command line (over {args.config})"
    config = config.updated(given, source=source)
    if config.resume and config.out and not args.config and not (Path(config.out) / "config.yaml").is_file() \
            and not all((config.model, config.objective, config.data)):
        if not Path(config.out).exists():
            raise InputFileNotFound(f"--out {config.out}: no such folder, so there is no run to resume; check the "
                                    "path, or start a run there without --resume")
        require_kind(config.out, ("run",), "pretrain --resume", "--out")
        raise UserInputError(f"--out {config.out}: holds no run to resume (no config.yaml); check the path, or "
                             "start a run there without --resume")
    config.require("model", "objective", "data", "out", source=args.config or "a --config file")
    saved = Path(config.out) / "config.yaml"
    if config.resume and saved.is_file():
        before = TrainConfig.load(saved)
        refuse_trajectory_changes(config.out, before.to_dict(), config.to_dict(), "pretrain")
        refuse_moved_switch(config.out, before, config)
    # A model folder to continue from: a task folder has no pre-training head, a run folder means its model/ (a
    # quantised folder passes, to be refused with what to train instead).
    require_kind(config.model, ("model", "hf", "bilm", "quantized"), "pretrain", "--model")
    return config


def _phases(data) -> str:
    """`` | seq len 128 -> 512 at step 90`` for a sequence-length schedule, else nothing."""
    lengths, starts = getattr(data, "lengths", None), getattr(data, "starts", None)
    if not lengths or not starts:
        return ""
    return " | seq len " + "".join(f" -> {n} at step {s}" if k else str(n)
                                   for k, (n, s) in enumerate(zip(lengths, starts)))


def run(args) -> int:
    return distributed.recorded(_run)(args)  # under torchrun, a failing rank's traceback reaches the launcher's summary


def _run(args) -> int:
    with plain_warnings("pretrain"):
        config = _settings(args)
        refuse_if_held(config.out)  # at once, not after minutes of building what it could not write
        # A run that fails before its first step leaves no folder holding only its settings behind.
        with (removed_on_failure(config.out, keep=run_started),
              distributed.session(config.strategy, config.device, config.dist_timeout) as ctx):
            built = build_pretraining(config)
            config, model, trainer = built.config, built.model, built.trainer
            cfg = model.config
            dtype = "bf16" if trainer.autocast_dtype is not None else "fp32"
            ranks = f" x {ctx.world_size} ranks ({ctx.strategy})" if ctx.grouped else ""
            if ctx.is_main:
                print(f"model {cfg.name} ({cfg.arch}, {model.num_parameters() / 1e6:.2f}M parameters, vocab "
                      f"{cfg.vocab_size:,}) | objective {config.objective} | batch {config.batch_size} x "
                      f"{config.grad_accum}{ranks}{_phases(trainer.train_data)} | {dtype} on {trainer.device} | "
                      f"out {config.out}", file=sys.stderr)
            result = trainer.fit()
    if result.stopped_by in ("SIGINT", "SIGTERM"):
        if ctx.is_main:
            print(f"stopped by {result.stopped_by} at step {result.step}; checkpoint {result.checkpoint}. "
                  f"Continue with: lmforge pretrain --out {config.out} --resume", file=sys.stderr)
        return 128 + int(getattr(signal, result.stopped_by))
    loss = result.metrics.get("loss")
    if ctx.is_main:
        print(f"done: step {result.step}, loss {loss:.4f}, model saved to {result.model_dir}"
              if isinstance(loss, float) else f"done: step {result.step}, model saved to {result.model_dir}")
        print(result.summary())
        tag = result.metrics
        if "total_flops" in tag:
            print(f"price tag: {tag['total_flops']:.3g} FLOPs, {tag['total_tokens']:,} tokens, "
                  f"{tag['device_s'] / 3600:.3g} device-h, {tag['energy_kwh']:.3g} kWh ({tag['energy_method']}), "
                  f"{tag['co2e_kg']:.3g} kg CO2e, ${tag['cost_usd']:.3g} (details: lmforge cost {config.out})")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "pretrain", help="pre-train a model (MLM, MLM + NSP, ELECTRA, causal LM, prefix LM, span corruption, "
                         "denoising, encoder-decoder LM, ELMo biLM)",
        description="Pre-train a model on shards from `lmforge data prepare`. Every option can also be a key "
                    "of --config FILE.yaml (dashes or underscores); the command line wins. Writes OUT/config.yaml, "
                    "OUT/tokenizer/, OUT/checkpoints/step-NNNNNNNN/, OUT/metrics.jsonl, OUT/tensorboard/, "
                    "OUT/loss.png and finally OUT/model/ (loadable by lmforge.load).",
        argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", metavar="FILE.yaml", default=None, help="settings file (same keys as the options)")
    add_dataclass_flags(parser, TrainConfig, OPTIONS, choices={k: getattr(tc, v) for k, v in CHOICES.items()})
    parser.add_argument("--override", action="append", default=None, metavar="KEY=VALUE",
                        help="set a ModelConfig field, e.g. --override n_layers=2 --override d_model=64 (repeatable)")
    parser.add_argument("--objective-option", action="append", default=None, metavar="KEY=VALUE",
                        help="set an objective argument, e.g. --objective-option mlm_probability=0.2 (repeatable). "
                             "mlm also takes: masking=static (BERT: each sequence masked once per copy, epoch e "
                             "showing copy e mod static_copies) or masking=dynamic (RoBERTa: a new mask every "
                             "epoch; the default); static_copies=N (default 10); whole_word=true (mask every piece "
                             "of a word or none); span_masking=true (SpanBERT: spans of whole words); "
                             "format=segment-pair|sentence-pair (mlm+nsp; default segment-pair, BERT's) or "
                             "format=full-sentences|doc-sentences (mlm) picks RoBERTa's input format: pairs of "
                             "multi-sentence segments or of single sentences, or whole sentences packed across "
                             "documents or kept within one")
    add_load_flags(parser, tokenizer=True)  # --model FOLDER is checked against its manifest like every other load
    parser.set_defaults(func=run)
