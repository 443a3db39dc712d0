"""Rollouts: the data source of PPO and GRPO, sampling with the policy as it trains.

The Trainer draws its batches from an iterable, so on-policy RL is a data source rather than a new loop::

    every rollout (when the previous one is used up):
        prompts  = n_prompts drawn from the prompt set (the source's own generator)
        samples  = generate(policy, prompts, sample, num_return_sequences=group, seed=drawn)  (KV-cached, batched)
        scores   = reward(prompts, responses)                     one number per sequence, at its end
        old, ref = log pi_old(a_t|s_t), log pi_ref(a_t|s_t)        (N, L) over the response tokens, no gradient
        method.prepare(...)                                       advantages (and PPO's values, returns)
    then ppo_epochs passes over the rollout in shuffled minibatches of `minibatch` sequences: one per micro-batch

Everything the source holds is state for exact resume: its generator (which prompts, which sampling seed, which
minibatch order), the current rollout's tensors and the position in it, the KL coefficient. A run killed in
the middle of a rollout resumes with the same rollout and continues at the same minibatch; the next rollout
then samples with the resumed weights and the same seed as the uninterrupted run.

Minibatches hold the rows right-padded (``input_ids``, ``attention_mask`` (N, T)) and the response block
(N, L): ``index`` (where response token j of row i is predicted in the (N, T-1) aligned log-probs),
``action_mask``, ``old_logps``, ``ref_logps``, ``advantages`` (PPO also ``returns``, ``old_values``), plus
``rollout_metrics`` (reward mean/std, KL to the reference per sequence, ...), which the loss logs.

Example:
    >>> import torch
    >>> logps = torch.arange(12.).view(2, 6)                      # (N, T-1) aligned log-probs
    >>> index, mask = response_index(torch.tensor([2, 4]), torch.tensor([3, 1]))   # starts, lengths
    >>> gather_response(logps, index, mask).tolist()              # row 0: columns 2..4, row 1: column 4
    [[2.0, 3.0, 4.0], [10.0, 0.0, 0.0]]
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from lmforge.align.logprobs import PromptEncoder, entropy_of, token_logprobs
from lmforge.generation.generate import generate
from lmforge.tasks.base import pad_batch
from lmforge.training.precision import autocast
from lmforge.training.state import from_json, to_json

# reward(prompts, responses, rows) -> one score per response; rows are the prompt records (extra fields such
# as an exact answer travel with them)
RewardFn = Callable[[Sequence[str], Sequence[str], Sequence[dict]], Sequence[float]]


def response_index(starts: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) response starts (in aligned coordinates: the position predicting the first response token) and
    lengths -> ``index`` (N, L) long and ``mask`` (N, L), L = the longest response."""
    L = max(int(lengths.max()), 1)
    j = torch.arange(L).unsqueeze(0)  # (1, L)
    mask = (j < lengths.unsqueeze(1)).long()  # (N, L)
    return (starts.unsqueeze(1) + j) * mask, mask


def gather_response(values: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T') per-position values -> (N, L) at the response positions, 0 past each response."""
    return values.gather(1, index) * mask.to(values.dtype)


class KLController:
    """The coefficient of the per-token KL penalty: fixed, or adaptive (Ziegler et al. 2019, section 2.2):
    after each rollout ``e = clip(KL / target - 1, -0.2, 0.2)``, ``coef *= 1 + e * n / horizon`` with KL the
    rollout's mean KL per sequence and n its number of sequences."""

    def __init__(self, coef: float, target: float | None = None, horizon: int = 10000) -> None:
        self.coef, self.target, self.horizon = coef, target, horizon

    def update(self, kl: float, n: int) -> None:
        if self.target:
            error = max(-0.2, min(0.2, kl / self.target - 1))
            self.coef *= 1 + error * n / self.horizon


class RolloutSource:
    """Train data for PPO/GRPO: minibatches of rollouts sampled with the current policy (module docstring).

    Args:
        model: the :class:`~lmforge.align.policy.AlignedPolicy` being trained (its policy samples; its value head,
            if any, gives the old values).
        prompts: prompt records ``{"prompt": text, ...}`` (see :func:`lmforge.align.data.read_prompts`).
        encoder: how prompts become ids (:class:`~lmforge.align.logprobs.PromptEncoder`).
        reward: the reward function (:data:`RewardFn`).
        method: :class:`~lmforge.align.ppo.PPOMethod` or :class:`~lmforge.align.grpo.GRPOMethod`: turns a
            rollout's scores into advantages.
        reference: the frozen reference model, or None for a PEFT policy (its base, adapters off).
        n_prompts: prompts per rollout; ``group`` samples of each (GRPO's group size; 1 for PPO).
        minibatch: sequences per minibatch (one Trainer micro-batch); ppo_epochs: passes over each rollout.
        max_new_tokens, temperature, top_k: sampling settings of the rollouts.
        seed: the source's generator seed (the Trainer's seed plus the rank, so each rank samples its own).
        autocast_dtype: the Trainer's autocast dtype (bf16 or None): pi_old is computed as the update computes
            pi, so the first ratio of a rollout is 1 under bf16 too.
    """

    def __init__(self, model, prompts: Sequence[dict], encoder: PromptEncoder, reward: RewardFn, method,
                 reference=None, n_prompts: int = 8, group: int = 1, minibatch: int = 8, ppo_epochs: int = 4,
                 max_new_tokens: int = 24, temperature: float = 1.0, top_k: int | None = None,
                 seed: int = 0, autocast_dtype: torch.dtype | None = None) -> None:
        self.model, self.prompts, self.encoder, self.reward, self.method = model, list(prompts), encoder, reward, method
        self.reference = reference
        self.n_prompts, self.group, self.minibatch, self.ppo_epochs = n_prompts, group, minibatch, ppo_epochs
        self.max_new_tokens, self.temperature, self.top_k = max_new_tokens, temperature, top_k
        self.prompt_ids = [encoder.prompt(p["prompt"]) for p in self.prompts]
        self.pad_id = encoder.tokenizer.pad_id
        self.generator = torch.Generator().manual_seed(seed)
        self.buffer: dict[str, Any] | None = None  # the current rollout: tensors and its minibatch order
        self.position = 0  # next minibatch of the buffer
        self.rollouts = 0
        self.autocast_dtype = autocast_dtype

    # ------------------------------------------------------------------ the data source protocol
    def __iter__(self):
        return self

    def __next__(self) -> dict[str, Any]:
        if self.buffer is None or self.position >= len(self.buffer["order"]):
            self.buffer, self.position = self._rollout(), 0
        rows = self.buffer["order"][self.position]
        self.position += 1
        batch = {k: v[rows] for k, v in self.buffer["tensors"].items()}
        T = int(batch["attention_mask"].sum(1).max())  # drop columns that are padding in every row
        batch["input_ids"], batch["attention_mask"] = batch["input_ids"][:, :T], batch["attention_mask"][:, :T]
        batch["rollout_metrics"] = dict(self.buffer["metrics"])
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "buffer": self.buffer, "position": self.position,
                "rollouts": self.rollouts, "method": self.method.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = from_json(to_json(state))  # a fresh copy, tensors decoded (a checkpoint's state comes as JSON)
        self.generator.set_state(state["generator"].to(torch.uint8))
        self.buffer, self.position, self.rollouts = state["buffer"], state["position"], state["rollouts"]
        self.method.load_state_dict(state["method"])

    # ------------------------------------------------------------------ one rollout
    def _draw(self, n: int) -> list[int]:
        return torch.randint(len(self.prompts), (n,), generator=self.generator).tolist()

    @torch.no_grad()
    def _rollout(self) -> dict[str, Any]:
        picks = self._draw(self.n_prompts)
        seed = int(torch.randint(2**31 - 1, (1,), generator=self.generator))
        policy = self.model.policy
        device = next(self.model.parameters()).device
        out = generate(policy, [self.prompt_ids[i] for i in picks], strategy="sample",
                       num_return_sequences=self.group, max_new_tokens=self.max_new_tokens,
                       temperature=self.temperature, top_k=self.top_k, seed=seed)
        N = len(picks) * self.group
        owners = [picks[k // self.group] for k in range(N)]  # row k's prompt index
        responses = [seq[:int(n)] for seq, n in zip(out.sequences.tolist(), out.lengths.tolist())]
        rows = [self.prompt_ids[i] + r for i, r in zip(owners, responses)]
        ids, attention = pad_batch(rows, self.pad_id)  # (N, T) right-padded
        starts = torch.tensor([len(self.prompt_ids[i]) - 1 for i in owners])
        lengths = torch.tensor([len(r) for r in responses])
        index, mask = response_index(starts, lengths)  # (N, L)
        texts = self.encoder.tokenizer.decode_batch(responses)
        records = [self.prompts[i] for i in owners]
        scores = torch.tensor([float(s) for s in self.reward([r["prompt"] for r in records], texts, records)])
        ids, attention, index_d, mask_d = (t.to(device) for t in (ids, attention, index, mask))
        old, values, entropy = self._score(self.model, ids, attention, index_d, mask_d, with_values=True)
        ref = self._reference_logps(ids, attention, index_d, mask_d)
        tensors = {"input_ids": ids, "attention_mask": attention, "index": index_d, "action_mask": mask_d,
                   "old_logps": old, "ref_logps": ref}
        kl_seq = ((old - ref) * mask_d).sum(1)  # (N,) KL to the reference per sequence (sampled estimate)
        metrics = {"reward_mean": float(scores.mean()), "reward_std": float(scores.std()) if N > 1 else 0.0,
                   "kl_ref": float(kl_seq.mean()), "response_length": float(lengths.float().mean()),
                   "rollout_entropy": float((entropy * mask_d).sum() / mask_d.sum().clamp(min=1))}
        tensors.update(self.method.prepare(scores.to(device), old, ref, values, mask_d, self.group))
        metrics.update(self.method.rollout_metrics(kl_seq, N))
        self.rollouts += 1
        order = []
        for _ in range(self.ppo_epochs):
            perm = torch.randperm(N, generator=self.generator)
            order += [perm[s:s + self.minibatch] for s in range(0, N, self.minibatch)]
        return {"tensors": {k: v.cpu() for k, v in tensors.items()}, "order": order, "metrics": metrics}

    def _score(self, model, ids, attention, index, mask, with_values: bool = False):
        """Response log-probs (N, L) under ``model`` at the sampling temperature, its values (N, L) and the
        per-token entropy (N, L)."""
        was_training = model.training
        model.eval()
        try:
            with autocast(ids.device, self.autocast_dtype):
                out = model(input_ids=ids, attention_mask=attention)
        finally:
            model.train(was_training)
        logits = out.logits / self.temperature
        logps = gather_response(token_logprobs(logits, ids), index, mask)
        entropy = gather_response(entropy_of(logits), index, mask)
        values = getattr(out, "values", None)
        values = gather_response(values[:, :-1], index, mask) if with_values and values is not None else None
        return logps, values, entropy

    def _reference_logps(self, ids, attention, index, mask) -> torch.Tensor:
        if self.reference is not None:
            return self._score(self.reference, ids, attention, index, mask)[0]
        policy = self.model.policy
        with policy.disable_adapters():
            return self._score(policy, ids, attention, index, mask)[0]
