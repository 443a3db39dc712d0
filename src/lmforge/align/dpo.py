"""Direct Preference Optimization (Rafailov et al. 2023), with the IPO and conservative-DPO variants.

DPO fits the policy to preference pairs (x, y_w, y_l) without a reward model or sampling: the KL-regularised
RL optimum gives the implicit reward r(x, y) = beta * log(pi(y|x) / pi_ref(y|x)), and the Bradley-Terry
likelihood of the preferences becomes a loss on log-probabilities::

    h    = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]
    sigmoid (DPO)       L = -log sigmoid(beta * h)
    conservative (cDPO) L = -(1 - eps) log sigmoid(beta * h) - eps * log sigmoid(-beta * h)   labels flipped w.p. eps
    ipo (Azar et al.)   L = (h - 1 / (2 * beta))^2                                           a bounded target margin

The log-probabilities are sums over the response tokens only (:mod:`lmforge.align.logprobs`). The reference is
a frozen copy of the starting policy, or log-probabilities computed once before training
(:func:`precompute_reference`), or, when the policy trains LoRA adapters, the same model with its adapters
switched off (``disable_adapters``): no second copy in memory. Logged per step: ``reward_chosen`` and
``reward_rejected`` (the implicit rewards beta * log-ratio), their ``margin`` and ``accuracy`` (the share of
pairs whose chosen reward is higher).

Example:
    >>> import torch
    >>> pc, pr = torch.tensor([-5.0]), torch.tensor([-7.0])     # policy log-probs of chosen, rejected
    >>> rc, rr = torch.tensor([-6.0]), torch.tensor([-6.0])     # reference log-probs
    >>> loss, chosen, rejected = dpo_loss(pc, pr, rc, rr, beta=0.5)
    >>> round(float(loss[0]), 4), float(chosen[0]), float(rejected[0])      # -log sigmoid(0.5 * 2)
    (0.3133, 0.5, -0.5)
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from lmforge.align.data import check_prompt_length
from lmforge.align.logprobs import PromptEncoder, forward_logits, masked_sum, token_logprobs
from lmforge.config import ConfigError
from lmforge.tasks.base import pad_batch
from lmforge.training.trainer import LossOutput

VARIANTS = ("sigmoid", "ipo")


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float = 0.1, variant: str = "sigmoid", label_smoothing: float = 0.0,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair losses (B,) and the implicit rewards of the chosen and rejected responses (B,) each.

    Args:
        policy_chosen, policy_rejected, ref_chosen, ref_rejected: (B,) sequence log-probabilities.
        beta: strength of the KL regularisation (the temperature of the implicit reward).
        variant: ``sigmoid`` (DPO; with ``label_smoothing`` > 0 conservative DPO) or ``ipo``.
        label_smoothing: cDPO's eps, the assumed share of flipped preference labels (sigmoid only).
    """
    if variant not in VARIANTS:
        raise ConfigError(f"DPO variant {variant!r} is not one of {', '.join(VARIANTS)}")
    chosen_ratio = policy_chosen - ref_chosen  # (B,)
    rejected_ratio = policy_rejected - ref_rejected  # (B,)
    h = chosen_ratio - rejected_ratio  # (B,)
    if variant == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def encode_pairs(pairs: Sequence[dict[str, str]], encoder: PromptEncoder) -> list[dict[str, Any]]:
    """Preference rows -> examples: the ids and response masks of prompt+chosen and of prompt+rejected."""
    examples = []
    for row in pairs:
        prompt = encoder.prompt(row["prompt"])
        check_prompt_length(prompt, row["where"], encoder.max_len)
        example = {}
        for side in ("chosen", "rejected"):
            ids, mask = encoder.row(prompt, encoder.response(row[side]))
            example[side] = ids
            example[side + "_mask"] = mask
        examples.append(example)
    return examples


class PairCollator:
    """Objective for the Trainer: examples -> one batch of 2B right-padded rows, the B chosen rows first.

    ``input_ids``, ``attention_mask``, ``response_mask`` (2B, T); ``ref_logps`` (2B,) when the examples carry
    precomputed reference log-probabilities.
    """

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows = [e["chosen"] for e in examples] + [e["rejected"] for e in examples]
        masks = [e["chosen_mask"] for e in examples] + [e["rejected_mask"] for e in examples]
        ids, attention = pad_batch(rows, self.pad_id)
        batch = {"input_ids": ids, "attention_mask": attention, "response_mask": pad_batch(masks, 0)[0]}
        if "ref_chosen" in examples[0]:
            batch["ref_logps"] = torch.tensor([e["ref_chosen"] for e in examples] +
                                              [e["ref_rejected"] for e in examples], dtype=torch.float32)
        return batch


def sequence_logps(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(2B,) summed log-probabilities of each row's response tokens under ``model``."""
    logits = forward_logits(model, batch["input_ids"], batch["attention_mask"])  # (2B, T, V)
    return masked_sum(token_logprobs(logits, batch["input_ids"]), batch["response_mask"][:, 1:])


def reference_context(model, reference):
    """How the reference pass runs: a separate model, or the policy itself with its adapters off (LoRA)."""
    if reference is not None:
        return reference, contextlib.nullcontext()
    if hasattr(model, "disable_adapters"):
        return model, model.disable_adapters()
    raise ConfigError("DPO needs a reference: a frozen model, precomputed log-probabilities, or a PEFT policy "
                      "whose base serves as the reference")


@torch.no_grad()
def reference_logps(model, reference, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(2B,) reference log-probabilities of the batch's responses (eval mode, no gradient)."""
    ref, switched = reference_context(model, reference)
    was_training = ref.training
    ref.eval()
    try:
        with switched:
            return sequence_logps(ref, batch).float()
    finally:
        ref.train(was_training)


@torch.no_grad()
def precompute_reference(reference, examples: list[dict[str, Any]], pad_id: int, batch_size: int = 8,
                         device: str | torch.device = "cpu") -> None:
    """Store each example's reference log-probabilities (``ref_chosen``, ``ref_rejected``) in place: the
    reference model is then needed no more during training."""
    collate = PairCollator(pad_id)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        batch = {k: v.to(device) for k, v in collate(chunk).items()}
        # A PEFT policy scores as its base (adapters off); any other model as itself.
        logps = reference_logps(reference, None if hasattr(reference, "disable_adapters") else reference, batch)
        B = len(chunk)
        for i, e in enumerate(chunk):
            e["ref_chosen"], e["ref_rejected"] = float(logps[i]), float(logps[B + i])


class DPOLoss:
    """The Trainer's ``loss`` for DPO / IPO / cDPO (see the module docstring); a mean over the batch's pairs.

    Args:
        reference: the frozen reference model (eval mode, no gradient), or None when the batches carry
            ``ref_logps`` or the policy is a PEFT model (its base is the reference).
        beta, variant, label_smoothing: see :func:`dpo_loss`.
    """

    def __init__(self, reference=None, beta: float = 0.1, variant: str = "sigmoid", label_smoothing: float = 0.0
                 ) -> None:
        if variant not in VARIANTS:
            raise ConfigError(f"--variant {variant!r} is not one of {', '.join(VARIANTS)}")
        if not 0 <= label_smoothing < 0.5:
            raise ConfigError(f"--cdpo-epsilon {label_smoothing}: must be in [0, 0.5)")
        if beta <= 0:
            raise ConfigError(f"--beta {beta}: must be > 0")
        self.reference = reference.eval().requires_grad_(False) if reference is not None else None
        self.beta, self.variant, self.label_smoothing = beta, variant, label_smoothing

    def count_targets(self, batch: dict[str, torch.Tensor]) -> int:
        return batch["input_ids"].shape[0] // 2  # pairs

    def __call__(self, model, batch: dict[str, torch.Tensor]) -> LossOutput:
        B = batch["input_ids"].shape[0] // 2
        policy = sequence_logps(model, batch)  # (2B,)
        ref = batch["ref_logps"] if "ref_logps" in batch else reference_logps(model, self.reference, batch)
        losses, chosen, rejected = dpo_loss(policy[:B], policy[B:], ref[:B], ref[B:], self.beta, self.variant,
                                            self.label_smoothing)
        margin = chosen - rejected
        metrics = {"reward_chosen": float(chosen.mean()), "reward_rejected": float(rejected.mean()),
                   "margin": float(margin.mean()), "accuracy": float((margin > 0).float().mean()),
                   "logp_chosen": float(policy[:B].detach().mean()), "logp_rejected": float(policy[B:].detach().mean())}
        return LossOutput(losses.mean(), B, metrics)
