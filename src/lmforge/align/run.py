"""``run_align``: a policy folder and preference pairs or prompts in; a run folder whose ``model/`` is the
aligned policy out. Every method is the one Trainer with a ``loss`` (DPO also with a collator; PPO and GRPO
with a :class:`~lmforge.align.rollouts.RolloutSource` as their data), so checkpoints, exact resume, bf16 and
torchrun (DDP) come with it.

Everything is read and checked first (the policy, its tokenizer, the data, the reward, the reference), so a
refused run writes nothing; ``OUT/align.yaml`` records the settings (for ``--resume``) once the Trainer has
checked and locked the folder.

Example (a sketch: it trains)::

    cfg = TrainConfig(out="runs/dpo", max_steps=200, batch_size=8, lr=5e-6)
    run_align(cfg, AlignConfig(method="dpo", policy="runs/sft/model", train="pairs.jsonl", beta=0.1))
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from lmforge import checkpoint
from lmforge.align.config import SETTINGS_FILE, AlignConfig
from lmforge.align.data import check_prompt_length, read_pairs, read_prompts
from lmforge.align.dpo import DPOLoss, PairCollator, encode_pairs, precompute_reference
from lmforge.align.grpo import GRPOLoss, GRPOMethod, arithmetic_prompts
from lmforge.align.logprobs import PromptEncoder, check_policy
from lmforge.align.policy import AlignedPolicy
from lmforge.align.ppo import PPOLoss, PPOMethod
from lmforge.align.rollouts import RolloutSource
from lmforge.align.scorers import resolve_reward
from lmforge.config import ConfigError
from lmforge.errors import UserInputError
from lmforge.peft.config import PeftConfig
from lmforge.peft.model import apply_peft
from lmforge.prompting.instruct import CHAT_TEMPLATE_FILE
from lmforge.tasks.data import ExampleBatches
from lmforge.training import distributed
from lmforge.training.config import TrainConfig
from lmforge.training.precision import resolve_precision
from lmforge.training.state import seed_all
from lmforge.training.trainer import Trainer, TrainResult, check_fresh_run
from lmforge.utils.io import atomic_write_text
from lmforge.utils.runs import model_folder

ARITHMETIC = "arithmetic"  # --prompts arithmetic: sums made on the fly, with lmforge.align.grpo's exact reward
ARITHMETIC_PROMPTS = 512


def rollout_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """The objective of PPO and GRPO: the rollout source makes finished minibatches."""
    return batch


def load_policy(source: str):
    """(model, tokenizer) of ``--policy``: a decoder LM folder with its tokenizer."""
    if not source:
        raise ConfigError("missing the policy: pass --policy DIR (a decoder LM folder)")
    if not Path(source).is_dir():
        raise UserInputError(f"--policy {source}: no such model folder")
    folder = model_folder(source)[0]
    checkpoint.require_kind(folder, ("model", "hf", "task"), "align", "--policy")
    if not (folder / checkpoint.TOKENIZER_FILE).is_file() and not checkpoint.is_hf_folder(folder):
        raise UserInputError(f"--policy {source}: the folder has no {checkpoint.TOKENIZER_FILE}; prompts and "
                             "responses are text, so the policy needs its tokenizer beside it")
    model, tok = checkpoint.load_body(folder)
    check_policy(model, source)
    return model, tok


def load_reference(align: AlignConfig, tokenizer):
    """The frozen reference: ``--reference`` or the policy's own starting weights, with the same tokenizer."""
    source = align.reference or align.policy
    model, tok = checkpoint.load_body(source)
    check_policy(model, source)
    if align.reference and tok is not None and tok.sha256() != tokenizer.sha256():
        raise UserInputError(f"--reference {source}: its tokenizer is not the policy's; the two models must score "
                             "the same token ids")
    return model.eval().requires_grad_(False)


def read_rollout_prompts(align: AlignConfig, encoder: PromptEncoder, seed: int) -> list[dict]:
    if not align.prompts:
        raise ConfigError(f"--method {align.method} samples from prompts: pass --prompts FILE (or 'arithmetic')")
    rows = arithmetic_prompts(ARITHMETIC_PROMPTS, seed) if align.prompts == ARITHMETIC else \
        read_prompts(align.prompts, align.prompt_field)
    for row in rows:
        check_prompt_length(encoder.prompt(row["prompt"]), row["where"], encoder.max_len, room=align.max_new_tokens)
    return rows


def resolve_rollout_reward(align: AlignConfig, device):
    if align.reward:
        return resolve_reward(align.reward, align.reward_kind, align.reward_label, device)
    if align.prompts == ARITHMETIC:
        return resolve_reward("lmforge.align.grpo:exact_answer_reward")
    raise ConfigError(f"--method {align.method} needs a reward: pass --reward DIR (a reward model or classifier "
                      "task folder) or --reward module:function")


def run_align(config: TrainConfig, align: AlignConfig, *, log: Callable[[str], None] | None = None) -> TrainResult:
    """Align ``align.policy`` with ``align.method`` in the run folder ``config.out`` (see the module docstring)."""
    config.require("out")
    out = Path(config.out)
    check_fresh_run(out, config.resume)
    ctx = distributed.setup(config.strategy, config.device, config.dist_timeout)
    policy, tok = load_policy(align.policy)
    encoder = PromptEncoder.for_folder(policy, tok, model_folder(align.policy)[0])
    # The data and the reward are checked before any model is placed or any file written.
    if align.method == "dpo":
        if not align.train:
            raise ConfigError("--method dpo trains on preference pairs: pass --train FILE (prompt, chosen, rejected)")
        examples = encode_pairs(read_pairs(align.train, align.prompt_field), encoder)
        prompts = reward = None
    else:
        prompts = read_rollout_prompts(align, encoder, config.seed)
        reward = resolve_rollout_reward(align, ctx.device)
    reference = None if align.lora_r else load_reference(align, tok).to(ctx.device)
    seed_all(config.seed)  # the same adapter and value-head initialisation in a run and in its resumption
    if align.lora_r:
        policy = apply_peft(policy, PeftConfig(method="lora", r=align.lora_r, alpha=2 * align.lora_r))
    model = AlignedPolicy(policy, value_head=align.method == "ppo").to(ctx.device)
    if align.method == "dpo":
        if align.precompute_ref:
            precompute_reference(reference if reference is not None else model.policy, examples, tok.pad_id,
                                 config.batch_size, ctx.device)
            reference = None
        loss = DPOLoss(reference, align.beta, align.variant, align.cdpo_epsilon)
        objective, data = PairCollator(tok.pad_id), ExampleBatches(examples, config.batch_size, seed=config.seed)
    else:
        method = PPOMethod(align.kl_coef, align.kl_target, align.kl_horizon, align.gamma, align.lam) \
            if align.method == "ppo" else GRPOMethod()
        data = RolloutSource(model, prompts, encoder, reward, method, reference, n_prompts=align.n_prompts,
                             group=align.samples_per_prompt, minibatch=config.batch_size,
                             ppo_epochs=align.ppo_epochs, max_new_tokens=align.max_new_tokens,
                             temperature=align.temperature, top_k=align.top_k,
                             seed=distributed.rank_seed(config.seed, ctx.rank),
                             autocast_dtype=resolve_precision(config.precision, ctx.device))
        loss = PPOLoss(align.clip, align.value_clip, align.vf_coef, align.temperature) if align.method == "ppo" \
            else GRPOLoss(align.clip, align.kl_beta, align.temperature)
        objective = rollout_batch
    files = {CHAT_TEMPLATE_FILE: json.dumps(asdict(encoder.template), indent=2) + "\n"} if encoder.template else None
    settings = {"align": align.absolute().to_dict(), "trainer": config.updated({"out": str(out.resolve())}).to_dict()}

    def write_settings() -> None:  # by the Trainer, once the run folder is checked and locked
        atomic_write_text(out / SETTINGS_FILE, yaml.safe_dump(settings, sort_keys=False))

    if log is not None and ctx.is_main:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log(f"{align.method} on {align.policy} ({trainable / 1e6:.2f}M trainable parameters"
            f"{f', LoRA r={align.lora_r}' if align.lora_r else ''}) | out {out}")
    trainer = Trainer(model, objective, data, config, out=out, tokenizer=tok, loss=loss, model_files=files,
                      dist=ctx, on_start=write_settings, job="align")
    return trainer.fit()
