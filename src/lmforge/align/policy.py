"""The model an alignment run trains: the policy, plus PPO's value head, as one module for the Trainer.

    AlignedPolicy(policy, value_head)
        forward(input_ids, attention_mask) -> logits (B, T, V), values (B, T) (None without a value head)
        saved_model  -> the policy alone (PEFT adapters merged): OUT/model is an ordinary model folder

The policy's dropout stays off while it trains: PPO's probability ratio pi / pi_old must be 1 before the first
update of a rollout, and the rollouts themselves are sampled in eval mode (InstructGPT and TRL do the same).

Example:
    >>> import lmforge
    >>> gpt = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)
    >>> model = AlignedPolicy(gpt, value_head=True)
    >>> out = model(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long))
    >>> tuple(out.logits.shape), tuple(out.values.shape)
    ((1, 3, 50), (1, 3))
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class PolicyOutput:
    logits: torch.Tensor  # (B, T, V)
    values: torch.Tensor | None = None  # (B, T): the value of the state after token t


class AlignedPolicy(nn.Module):
    """``policy`` (a decoder LM, or a PEFT model of one) and, for PPO, a scalar value head on its last states."""

    def __init__(self, policy: nn.Module, value_head: bool = False) -> None:
        super().__init__()
        self.policy = policy
        d = policy.config.d_model
        self.value_head = nn.Linear(d, 1) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)  # start at V = bias = 0: the first advantages are the returns
            nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.policy.config

    def train(self, mode: bool = True) -> "AlignedPolicy":
        super().train(mode)
        self.policy.eval()  # no dropout in the policy (see the module docstring); the value head has none
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> PolicyOutput:
        out = self.policy(input_ids=input_ids, attention_mask=attention_mask)
        values = None
        if self.value_head is not None:
            values = self.value_head(out.last_hidden_state.float()).squeeze(-1)  # (B, T)
        return PolicyOutput(out.logits, values)

    @property
    def saved_model(self) -> nn.Module:
        """The policy as an ordinary model: a PEFT policy's adapters merged into a copy of its base."""
        if hasattr(self.policy, "merge_and_unload"):
            return copy.deepcopy(self.policy).merge_and_unload()
        return self.policy
