"""Alignment after instruction tuning: reward models, DPO, RLHF with PPO, GRPO (``lmforge align``).

    reward.py    Bradley-Terry loss and the ``reward`` task (``lmforge finetune --task reward``), pairwise accuracy
    scorers.py   reward functions: a reward model, a classifier's label log-prob/prob/margin, a Python callable
    logprobs.py  response-only log-probabilities (with the policy's chat template, when it has one)
    data.py      preference pairs and prompts, read with row-numbered errors
    dpo.py       DPO, IPO and conservative DPO; frozen, precomputed, or LoRA-disabled reference
    policy.py    AlignedPolicy: the policy (+ PPO's value head) as the Trainer's model; saves the policy alone
    rollouts.py  RolloutSource: the Trainer's data for PPO/GRPO, sampling with the current policy, resumable
    ppo.py       InstructGPT's PPO: KL-penalised rewards, GAE, clipped policy and value losses, adaptive KL
    grpo.py      group-relative advantages, k3 KL; a verifiable arithmetic task with an exact-answer reward
    pairs.py     make-pairs: sample k, score, keep best and worst as (chosen, rejected)
    config.py    AlignConfig (OUT/align.yaml)
    run.py       run_align: every method is the one Trainer with a loss

Example:
    >>> import torch
    >>> from lmforge.align import dpo_loss
    >>> loss, _, _ = dpo_loss(torch.tensor([-4.0]), torch.tensor([-6.0]), torch.tensor([-5.0]), torch.tensor([-5.0]))
    >>> round(float(loss[0]), 4)        # -log sigmoid(0.1 * 2)
    0.5981
"""

from __future__ import annotations

from lmforge.utils.lazy import lazy_exports

_LAZY = {
    "AlignConfig": "config",
    "run_align": "run",
    "dpo_loss": "dpo",
    "DPOLoss": "dpo",
    "bradley_terry_loss": "reward",
    "pairwise_accuracy": "reward",
    "RewardTask": "reward",
    "ModelReward": "scorers",
    "resolve_reward": "scorers",
    "PPOLoss": "ppo",
    "PPOMethod": "ppo",
    "gae": "ppo",
    "GRPOLoss": "grpo",
    "GRPOMethod": "grpo",
    "group_advantages": "grpo",
    "arithmetic_prompts": "grpo",
    "exact_answer_reward": "grpo",
    "RolloutSource": "rollouts",
    "AlignedPolicy": "policy",
    "make_pairs": "pairs",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)
