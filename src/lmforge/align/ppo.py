"""RLHF with PPO in InstructGPT's form (Ouyang et al. 2022; Ziegler et al. 2019; Schulman et al. 2017).

A rollout (:mod:`lmforge.align.rollouts`) samples responses with the policy; the reward model scores each
whole response, and the reward is paid at its last token. Each response token also pays a KL penalty to the
reference (the starting policy), which keeps the policy near the text it came from::

    r_t = -kl_coef * (log pi_old(a_t|s_t) - log pi_ref(a_t|s_t))  +  [t = last] * score     (kl_coef fixed or adaptive)

Generalised advantage estimation (Schulman et al. 2016) with the value head's V(s_t), V = 0 after the end::

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)        A_t = delta_t + gamma * lam * A_{t+1}      R_t = A_t + V(s_t)

Advantages are whitened over the rollout. Then ``ppo_epochs`` passes over the rollout in minibatches minimise,
with ratio = pi(a_t|s_t) / pi_old(a_t|s_t) and token means over the response tokens::

    L_clip  = mean max(-A_t * ratio, -A_t * clip(ratio, 1 - eps, 1 + eps))
    L_value = 0.5 * mean max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)
    L       = L_clip + vf_coef * L_value

Logged per step: the rollout's ``reward_mean``/``reward_std``, ``kl_ref`` (per sequence) and ``kl_coef``; the
update's ``clip_fraction``, ``value_loss``, ``policy_loss``, ``entropy`` and ``approx_kl`` (to pi_old).

Example:
    >>> import torch
    >>> rewards, values = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]])
    >>> adv, ret = gae(rewards, values, torch.ones(1, 2), gamma=1.0, lam=1.0)
    >>> adv.tolist(), ret.tolist()          # A_1 = 1 - 0.5; A_0 = 0 + 0.5 - 0.5 + A_1
    ([[0.5, 0.5]], [[1.0, 1.0]])
"""

from __future__ import annotations

from typing import Any

import torch

from lmforge.align.logprobs import entropy_of, masked_mean, token_logprobs
from lmforge.align.rollouts import KLController, gather_response
from lmforge.training.trainer import LossOutput


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns (N, L) of right-padded response blocks: rewards, values, mask (N, L)."""
    mask = mask.to(values.dtype)
    N, L = rewards.shape
    advantages = torch.zeros_like(values)
    last = torch.zeros(N, dtype=values.dtype, device=values.device)
    for t in reversed(range(L)):
        alive = mask[:, t + 1] if t + 1 < L else torch.zeros_like(last)  # is s_{t+1} still in the response?
        next_value = values[:, t + 1] * alive if t + 1 < L else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last * alive
        advantages[:, t] = last
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(values - mean) / std over the masked entries (zero elsewhere)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return (values - mean) * torch.rsqrt(var + eps) * mask.to(values.dtype)


def kl_penalty_rewards(scores: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor,
                       kl_coef: float) -> torch.Tensor:
    """(N,) scores, (N, L) log-probs -> per-token rewards (N, L): -kl_coef * (old - ref), plus the score
    at each response's last token."""
    mask = mask.to(old.dtype)
    rewards = -kl_coef * (old - ref) * mask
    last = (mask.sum(1).long() - 1).clamp(min=0)  # (N,)
    return rewards.scatter_add(1, last.unsqueeze(1), scores.unsqueeze(1).to(rewards.dtype))


def clipped_policy_loss(logps: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate (a token mean) and the share of tokens whose ratio was clipped."""
    ratio = torch.exp(logps - old)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - eps, 1 + eps)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).float(), mask)


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       eps: float) -> torch.Tensor:
    """0.5 * token mean of max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)."""
    clipped = old_values + torch.clamp(values - old_values, -eps, eps)
    return 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask)


class PPOMethod:
    """How a rollout becomes PPO's training tensors (the :class:`~lmforge.align.rollouts.RolloutSource` calls it).

    Args:
        kl_coef: the KL penalty's coefficient (the starting one, when ``kl_target`` makes it adaptive).
        kl_target, kl_horizon: the adaptive controller's target KL per sequence and horizon (None: fixed).
        gamma, lam: GAE's discount and lambda.
    """

    value_head = True

    def __init__(self, kl_coef: float = 0.1, kl_target: float | None = None, kl_horizon: int = 10000,
                 gamma: float = 1.0, lam: float = 0.95) -> None:
        self.kl = KLController(kl_coef, kl_target, kl_horizon)
        self.gamma, self.lam = gamma, lam

    def prepare(self, scores, old, ref, values, mask, group: int) -> dict[str, torch.Tensor]:
        rewards = kl_penalty_rewards(scores, old, ref, mask, self.kl.coef)
        advantages, returns = gae(rewards, values, mask, self.gamma, self.lam)
        return {"advantages": whiten(advantages, mask), "returns": returns, "old_values": values}

    def rollout_metrics(self, kl_seq: torch.Tensor, n: int) -> dict[str, float]:
        metrics = {"kl_coef": self.kl.coef}
        self.kl.update(float(kl_seq.mean()), n)  # the next rollout's coefficient
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": self.kl.coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl.coef = state["kl_coef"]


def response_forward(model, batch: dict[str, torch.Tensor], temperature: float):
    """The policy's log-probs, entropy and values (N, L) over the batch's response tokens."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    logits = out.logits / temperature  # as sampled: the ratio compares the same distributions
    index, mask = batch["index"], batch["action_mask"]
    logps = gather_response(token_logprobs(logits, batch["input_ids"]), index, mask)
    entropy = gather_response(entropy_of(logits), index, mask)
    values = gather_response(out.values[:, :-1], index, mask) if out.values is not None else None
    return logps, entropy, values


class PPOLoss:
    """The Trainer's ``loss`` for PPO: clipped policy loss + vf_coef * clipped value loss, a token mean.

    Args:
        clip: eps of the policy ratio; value_clip: eps_v of the value; vf_coef: the value loss's weight.
        temperature: the rollouts' sampling temperature.
    """

    def __init__(self, clip: float = 0.2, value_clip: float = 0.2, vf_coef: float = 0.1, temperature: float = 1.0
                 ) -> None:
        self.clip, self.value_clip, self.vf_coef, self.temperature = clip, value_clip, vf_coef, temperature

    def count_targets(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["action_mask"].sum())

    def __call__(self, model, batch: dict[str, Any]) -> LossOutput:
        mask = batch["action_mask"]
        logps, entropy, values = response_forward(model, batch, self.temperature)
        policy_loss, clip_fraction = clipped_policy_loss(logps, batch["old_logps"], batch["advantages"], mask,
                                                         self.clip)
        value_loss = clipped_value_loss(values, batch["old_values"], batch["returns"], mask, self.value_clip)
        metrics = {**batch.get("rollout_metrics", {}), "policy_loss": float(policy_loss.detach()),
                   "value_loss": float(value_loss.detach()), "clip_fraction": float(clip_fraction),
                   "entropy": float(masked_mean(entropy.detach(), mask)),
                   "approx_kl": float(masked_mean((batch["old_logps"] - logps).detach(), mask))}
        return LossOutput(policy_loss + self.vf_coef * value_loss, int(mask.sum()), metrics)
