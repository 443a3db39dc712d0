"""Causal language modelling (GPT): predict every next token.

GPT (Radford et al., 2018, "Improving Language Understanding by Generative Pre-Training", §3.1) maximises
sum_t log P(x_t | x_<t). The model never shifts, so the labels are aligned here: a block x of T + 1 tokens
gives ``input_ids = x[:-1]`` and ``labels = x[1:]``, and the loss is CE(logits[:, t], labels[:, t]). The
causal mask is the model's job: ``attention_mask`` only marks padding.

Blocks of equal length (packed text, the usual case) give a batch with no padding at all. Ragged
sequences are right-padded, with ``labels = -100`` wherever the target is padding.

The objective draws no random numbers. ``state_dict()`` is empty and exists so that every objective
offers the same resume interface.

Example::

    >>> clm = CausalLM(pad_token_id=0)
    >>> batch = clm([[5, 6, 7, 8], [9, 10]])
    >>> batch["input_ids"].tolist(), batch["labels"].tolist()
    ([[5, 6, 7], [9, 0, 0]], [[6, 7, 8], [10, -100, -100]])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmforge.objectives.base import next_token_batch


class CausalLM:
    """Next-token collator: sequences of T_i + 1 tokens -> ``input_ids``, ``attention_mask``, ``labels`` (B, T)."""

    def __init__(self, *, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        input_ids, real, labels = next_token_batch(
            examples, self.pad_token_id, 2, "causal LM needs sequences of at least 2 tokens (one input, one target)")
        return {"input_ids": input_ids, "attention_mask": real.long(), "labels": labels}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"CausalLM is stateless; got unexpected state keys {sorted(state)}")
