"""``lmforge align``: align a policy with preferences or rewards (see :mod:`lmforge.align`).

    lmforge align --method dpo  --policy DIR --train PAIRS   --out RUN     DPO / IPO / cDPO on preference pairs
    lmforge align --method ppo  --policy DIR --prompts FILE --reward RM --out RUN   RLHF with PPO (InstructGPT)
    lmforge align --method grpo --policy DIR --prompts arithmetic --out RUN     GRPO (a verifiable reward)
    lmforge align make-pairs --policy DIR --prompts FILE --reward RM --out pairs.jsonl   sample, score, pair

Every run is the Trainer's: checkpoints, ``--resume`` (the settings come back from ``OUT/align.yaml``), bf16,
torchrun (DDP), and ``metrics.jsonl`` with the method's numbers (reward mean/std, KL to the reference,
entropy, clip fraction, value loss, DPO's margins and accuracy). ``OUT/model`` is an ordinary model folder for
``lmforge generate``, ``chat`` and ``serve``.

Example::

    $ lmforge finetune --task reward --model runs/gpt/model --train pairs.jsonl --out runs/rm
    $ lmforge align --method ppo --policy runs/gpt/model --prompts openings.jsonl --reward runs/rm/best --out runs/ppo
    $ lmforge align --method dpo --policy runs/gpt/model --train pairs.jsonl --lora-r 8 --out runs/dpo
    $ lmforge align --out runs/dpo --resume
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from lmforge.align.config import METHODS, AlignConfig, saved_settings
from lmforge.align.data import read_prompts
from lmforge.align.dpo import VARIANTS
from lmforge.align.logprobs import PromptEncoder
from lmforge.align.pairs import make_pairs
from lmforge.align.run import load_policy, run_align
from lmforge.align.scorers import KINDS, resolve_reward
from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import UserError, plain_warnings
from lmforge.cli.pretrain import OPTIONS
from lmforge.training import config as tc
from lmforge.training.config import TrainConfig, setting_names
from lmforge.training.trainer import run_started
from lmforge.utils.flags import add_dataclass_flags
from lmforge.utils.lock import refuse_if_held, removed_on_failure
from lmforge.utils.runs import model_folder

ALIGN_OPTIONS = [
    ("method", "dpo (preference pairs), ppo (RLHF with a reward, InstructGPT's form) or grpo (group-relative, no "
               "value head)"),
    ("policy", "the policy: a decoder LM folder with its tokenizer (its chat_template.json, if any, formats the "
               "prompts); a run folder means its model/"),
    ("reference", "the frozen reference model (default: the policy's starting weights; with --lora-r, the base "
                  "model with the adapters off, so no second copy)"),
    ("lora_r", "train LoRA adapters of this rank on the policy instead of every weight (0: full fine-tuning); "
               "OUT/model has them merged"),
    ("train", "dpo: preference pairs, JSONL/TSV/CSV with prompt, chosen and rejected columns"),
    ("beta", "dpo: beta, the KL strength (temperature of the implicit reward)"),
    ("variant", "dpo: sigmoid (DPO; with --cdpo-epsilon, conservative DPO) or ipo"),
    ("cdpo_epsilon", "dpo: conservative DPO's assumed share of flipped labels (TRL's label_smoothing; 0: plain DPO)"),
    ("precompute_ref", "dpo: score the pairs with the reference once before training, then free it"),
    ("prompts", "ppo/grpo: prompts (JSONL with a prompt field, TSV/CSV, NAME:SPLIT, .txt one per line), or "
                "'arithmetic' for sums made on the fly with an exact-answer reward"),
    ("prompt_field", "the prompt column of --train or --prompts"),
    ("reward", "ppo/grpo: a reward model (finetune --task reward) or classifier (finetune --task classify) task "
               "folder, or a Python callable as module:function taking (prompts, responses, rows)"),
    ("reward_kind", "a classifier reward: log-prob, probability or logit margin of --reward-label"),
    ("reward_label", "a classifier reward: the label to reward (default: its last label)"),
    ("n_prompts", "ppo/grpo: prompts per rollout"),
    ("group", "ppo/grpo: samples per prompt (GRPO's group; default 4 for grpo, 1 for ppo)"),
    ("ppo_epochs", "ppo/grpo: passes over each rollout, in minibatches of --batch-size sequences"),
    ("max_new_tokens", "ppo/grpo: tokens sampled per response at most"),
    ("temperature", "ppo/grpo: sampling temperature of the rollouts"),
    ("top_k", "ppo/grpo: sample among the k likeliest tokens only (default: all)"),
    ("kl_coef", "ppo: coefficient of the per-token KL penalty to the reference (the start value when adaptive)"),
    ("kl_target", "ppo: target KL per sequence of the adaptive coefficient (Ziegler et al.; default: fixed)"),
    ("kl_horizon", "ppo: horizon of the adaptive KL coefficient, in sequences"),
    ("gamma", "ppo: GAE discount"),
    ("lam", "ppo: GAE lambda"),
    ("clip", "ppo/grpo: clip range of the probability ratio"),
    ("value_clip", "ppo: clip range of the value update"),
    ("vf_coef", "ppo: weight of the value loss"),
    ("kl_beta", "grpo: weight of the KL term to the reference"),
]
TRAINER_OPTIONS = [(k, text) for k, text in OPTIONS
                   if k not in ("model", "objective", "tokenizer", "data", "out", "seq_len", "eval_every",
                                "eval_batches", "num_workers")]
ALIGN_DEFAULTS = {"lr": 1e-5, "warmup": 0, "schedule": "constant", "batch_size": 8, "max_steps": 100,
                  "eval_every": 0, "weight_decay": 0.0}


def _settings(given: dict) -> tuple[TrainConfig, AlignConfig]:
    """Defaults, then (with --resume) the run folder's saved settings, then the flags given."""
    out = given.get("out")
    if not out:
        raise UserError("missing --out: the run folder")
    saved = saved_settings(out) if given.get("resume") else {}
    if given.get("resume") and not saved:
        raise UserError(f"--out {out}: holds no alignment run to resume (no align.yaml); check the path, or start "
                        "a run there without --resume")
    align_given = {k: v for k, v in given.items() if k in AlignConfig.config_keys() and v is not None}
    align = AlignConfig.from_dict({**saved.get("align", {}), **align_given}, source="command line")
    trainer_given = {k: v for k, v in given.items() if k in setting_names() and v is not None}
    trainer_given["out"] = out
    base = TrainConfig.from_dict(saved["trainer"], source=f"{out}/align.yaml") if saved else \
        TrainConfig.from_dict(ALIGN_DEFAULTS, source="defaults")
    return base.updated(trainer_given, source="command line"), align


def run(args) -> int:
    with plain_warnings("align"):
        config, align = _settings(vars(args))
        refuse_if_held(config.out)  # at once, not after minutes of building what it could not write
        with removed_on_failure(config.out, keep=run_started):
            result = run_align(config, align, log=lambda line: print(line, file=sys.stderr))
    if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 reports for all
        return 128 + int(getattr(signal, result.stopped_by)) if result.stopped_by in ("SIGINT", "SIGTERM") else 0
    if result.stopped_by in ("SIGINT", "SIGTERM"):
        print(f"stopped by {result.stopped_by} at step {result.step}. Continue with: lmforge align --out "
              f"{config.out} --resume", file=sys.stderr)
        return 128 + int(getattr(signal, result.stopped_by))
    loss = result.metrics.get("loss")
    print(f"done: step {result.step}" + (f", loss {loss:.4f}" if isinstance(loss, float) else "") +
          f", policy saved to {result.model_dir}")
    return 0


def run_make_pairs(args) -> int:
    with plain_warnings("align make-pairs"):
        model, tok = load_policy(args.policy)
        model.eval()
        encoder = PromptEncoder.for_folder(model, tok, model_folder(args.policy)[0])
        prompts = read_prompts(args.prompts, args.prompt_field)
        if args.limit:
            prompts = prompts[:args.limit]
        reward = resolve_reward(args.reward, args.reward_kind, args.reward_label)
        counts = make_pairs(model, encoder, prompts, reward, args.out, k=args.k, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    print(f"wrote {counts['pairs']} pairs to {args.out} ({counts['skipped']} prompts skipped: their samples tied)")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "align", help="align a policy: DPO on preference pairs, RLHF with PPO, GRPO; make-pairs",
        description="Align a decoder LM through the Trainer (checkpoints, --resume, bf16, torchrun): DPO/IPO/cDPO on "
                    "preference pairs, PPO with a reward model and a KL penalty (InstructGPT), or GRPO. OUT/model "
                    "is an ordinary model folder. `lmforge align make-pairs` writes preference pairs by sampling a "
                    "policy and scoring with a reward.",
        argument_default=argparse.SUPPRESS, allow_abbrev=False)  # make-pairs' --k is not an abbreviation
    what = parser.add_argument_group("method, policy, data, reward")
    add_dataclass_flags(what, AlignConfig, ALIGN_OPTIONS,
                        choices={"method": METHODS, "variant": VARIANTS, "reward_kind": KINDS})
    what.add_argument("--out", default=None, metavar="DIR", help="run folder: settings, checkpoints, logs, OUT/model")
    group = parser.add_argument_group("training (as for `lmforge pretrain`)")
    add_dataclass_flags(group, TrainConfig, TRAINER_OPTIONS, defaults=ALIGN_DEFAULTS,
                        choices={"schedule": tc.SCHEDULES, "precision": tc.PRECISIONS, "device": tc.DEVICES,
                                 "strategy": tc.STRATEGIES, "fsdp_param_dtype": tc.FSDP_PARAM_DTYPES,
                                 "fsdp_reduce_dtype": tc.FSDP_REDUCE_DTYPES})
    add_load_flags(parser)
    parser.set_defaults(func=run)

    sub = parser.add_subparsers(dest="align_command", metavar="SUBCOMMAND")
    pairs = sub.add_parser("make-pairs", help="sample k continuations per prompt, score them, write (chosen, "
                                              "rejected) pairs as JSONL",
                           description="Sample --k continuations of each prompt from --policy, score them with "
                                       "--reward, and write the best and the worst as a (chosen, rejected) pair "
                                       "(JSONL, written atomically). Prompts whose samples tie are skipped.")
    pairs.add_argument("--policy", required=True, metavar="DIR", help="the policy that samples (a decoder LM folder)")
    pairs.add_argument("--prompts", required=True, metavar="FILE",
                       help="prompts: JSONL with a prompt field, TSV/CSV, NAME:SPLIT or .txt (one per line)")
    pairs.add_argument("--prompt-field", default="prompt", metavar="NAME", help="the prompt column (default: prompt)")
    pairs.add_argument("--reward", required=True, metavar="DIR|MODULE:FN",
                       help="a reward model or classifier task folder, or a Python callable module:function")
    pairs.add_argument("--reward-kind", default="prob", choices=KINDS,
                       help="a classifier reward: log-prob, probability or margin of --reward-label (default: prob)")
    pairs.add_argument("--reward-label", default=None, metavar="LABEL",
                       help="a classifier reward: the label to reward (default: its last label)")
    pairs.add_argument("--out", required=True, metavar="FILE", help="the pairs file to write (JSONL)")
    pairs.add_argument("--k", type=int, default=4, help="samples per prompt (default: 4)")
    pairs.add_argument("--max-new-tokens", type=int, default=24, help="tokens per sample at most (default: 24)")
    pairs.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    pairs.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens (default: all)")
    pairs.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    pairs.add_argument("--seed", type=int, default=0, help="sampling seed: the same seed writes the same file")
    add_load_flags(pairs)
    pairs.set_defaults(func=run_make_pairs)
