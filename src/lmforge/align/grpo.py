"""Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath): PPO without a value head.

Each prompt is sampled ``group`` times (G); a sequence's advantage is its reward relative to its group's, so
the group is the baseline that PPO's value head would otherwise learn::

    A_i = (r_i - mean(r_1..G)) / (std(r_1..G) + eps)          the same for every token of response i

The loss is PPO's clipped surrogate plus a KL term to the reference, with the unbiased, always-positive k3
estimator of Schulman's "Approximating KL divergence" (as in the paper), a token mean over the responses::

    L = mean max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)) + beta * mean(exp(ref - logp) - (ref - logp) - 1)

The reward is any Python callable ``reward(prompts, responses, rows) -> scores`` or a reward model
(:mod:`lmforge.align.scorers`). :func:`arithmetic_prompts` and :func:`exact_answer_reward` make a verifiable
task: sums generated on the fly (by :mod:`lmforge.datasets.arithmetic`'s generator), scored 1 when the response's
first number is the exact answer.

Example:
    >>> import torch
    >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 3.0]), group=2).view(3, 2).sum(1).tolist()
    [0.0, 0.0, 0.0]
    >>> exact_answer_reward(["2+3="], [" 5, I think"], [{"answer": "5"}])
    [1.0]
"""

from __future__ import annotations

import random
import re
from typing import Any, Sequence

import torch

from lmforge.align.logprobs import masked_mean
from lmforge.align.ppo import clipped_policy_loss, response_forward
from lmforge.datasets import arithmetic
from lmforge.training.trainer import LossOutput


def group_advantages(scores: torch.Tensor, group: int, eps: float = 1e-4) -> torch.Tensor:
    """(N,) scores, N = prompts * group, rows of one prompt adjacent -> (N,) group-normalised advantages."""
    g = scores.float().view(-1, group)  # (B, G)
    std = g.std(1, keepdim=True) if group > 1 else torch.zeros_like(g[:, :1])
    return ((g - g.mean(1, keepdim=True)) / (std + eps)).view(-1)


def k3_kl(logps: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate exp(ref - logp) - (ref - logp) - 1 (>= 0, 0 when equal)."""
    d = ref - logps
    return torch.exp(d) - d - 1


class GRPOMethod:
    """How a rollout becomes GRPO's training tensors: the group advantage on every response token."""

    value_head = False

    def prepare(self, scores, old, ref, values, mask, group: int) -> dict[str, torch.Tensor]:
        adv = group_advantages(scores, group)  # (N,)
        return {"advantages": adv.unsqueeze(1).to(old.dtype) * mask.to(old.dtype)}

    def rollout_metrics(self, kl_seq: torch.Tensor, n: int) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class GRPOLoss:
    """The Trainer's ``loss`` for GRPO (see the module docstring), a token mean.

    Args:
        clip: eps of the ratio; beta: weight of the KL term; temperature: the rollouts' sampling temperature.
    """

    def __init__(self, clip: float = 0.2, beta: float = 0.04, temperature: float = 1.0) -> None:
        self.clip, self.beta, self.temperature = clip, beta, temperature

    def count_targets(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["action_mask"].sum())

    def __call__(self, model, batch: dict[str, Any]) -> LossOutput:
        mask = batch["action_mask"]
        logps, entropy, _ = response_forward(model, batch, self.temperature)
        policy_loss, clip_fraction = clipped_policy_loss(logps, batch["old_logps"], batch["advantages"], mask,
                                                         self.clip)
        kl = masked_mean(k3_kl(logps, batch["ref_logps"]), mask)
        metrics = {**batch.get("rollout_metrics", {}), "policy_loss": float(policy_loss.detach()), "kl": float(kl.detach()),
                   "clip_fraction": float(clip_fraction), "entropy": float(masked_mean(entropy.detach(), mask))}
        return LossOutput(policy_loss + self.beta * kl, int(mask.sum()), metrics)


# ---------------------------------------------------------------------------------- a verifiable task
def arithmetic_prompts(n: int, seed: int = 0, low: int = 0, high: int = 9, ops: str = "+-") -> list[dict[str, str]]:
    """``n`` problems ``"a+b="`` with their exact answers (``{"prompt", "answer", "where"}``), reproducible by seed."""
    rng = random.Random(seed)
    rows = []
    for k in range(n):
        (a, b), (op,) = arithmetic.draw(rng, 2, low, high, ops)
        answer = arithmetic.solve([a, b], [op])[-1][-1]
        rows.append({"prompt": f"{a}{op}{b}=", "answer": str(answer), "where": f"arithmetic problem {k + 1}"})
    return rows


_NUMBER = re.compile(r"-?\d+")


def exact_answer_reward(prompts: Sequence[str], responses: Sequence[str], rows: Sequence[dict]) -> list[float]:
    """1.0 when the response's first integer equals the row's ``answer``, else 0.0."""
    scores = []
    for response, row in zip(responses, rows):
        found = _NUMBER.search(response)
        scores.append(1.0 if found is not None and found.group() == str(row["answer"]).strip() else 0.0)
    return scores
