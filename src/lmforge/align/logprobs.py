"""Response log-probabilities: what every preference and policy-gradient loss is written in.

A (prompt, response) pair is one row of ids; ``response_mask`` marks the response's tokens. Token t is
predicted by the logits at t - 1, so the per-token log-probabilities are aligned with ``ids[:, 1:]``::

    logits = model(ids).logits                       (B, T, V)
    logp   = log_softmax(logits[:, :-1]).gather(ids[:, 1:])   (B, T-1)
    mask   = response_mask[:, 1:]                    (B, T-1) 1 where token t+1 belongs to the response
    log pi(y | x) = sum_t logp * mask                (B,)

With a chat template stored beside the policy (``chat_template.json``, written by instruction tuning), the
prompt is the user turn and the response the assistant turn, exactly as instruction tuning and ``lmforge chat``
render them; without one the prompt is encoded as ``lmforge generate`` encodes it and the response follows.
Prompt and response are tokenised separately, so the boundary between them is exact.

Example:
    >>> import torch
    >>> logits = torch.zeros(1, 3, 4)                # a uniform model over 4 tokens
    >>> ids, mask = torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 1]])
    >>> round(float(masked_sum(token_logprobs(logits, ids), mask[:, 1:])[0]), 4)   # 2 * log(1/4)
    -2.7726
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from lmforge.errors import UserInputError
from lmforge.generation.generate import encode_prompt
from lmforge.prompting.instruct import CHAT_TEMPLATE_FILE, ChatTemplate


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), ids (B, T) -> log p(ids[:, t+1] | ids[:, :t+1]) as (B, T-1), in fp32."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) values, (B, T) 0/1 mask -> (B,) sums over the masked positions."""
    return (values * mask.to(values.dtype)).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` over every masked position of the batch (a scalar)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V) -> the entropy of each next-token distribution (B, T-1) (aligned as token_logprobs)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def forward_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The policy's next-token logits (B, T, V) over right-padded rows."""
    return model(input_ids=input_ids, attention_mask=attention_mask).logits


def check_policy(model, source: str | Path) -> None:
    """A policy must be a decoder with an LM head (it generates and scores its own continuations)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "head", None) != "lm" or getattr(cfg, "arch", None) != "decoder":
        what = f"arch={cfg.arch!r}, head={cfg.head!r}" if cfg is not None else type(model).__name__
        raise UserInputError(f"--policy {source}: not a decoder language model ({what}); alignment trains a "
                             "decoder with an LM head, e.g. a folder written by `lmforge pretrain` or `finetune "
                             "--task instruct`")


class PromptEncoder:
    """Encodes prompts (and prompt + response rows) the way the policy reads them.

    Args:
        model: the policy (its config decides the prompt form).
        tokenizer: the policy's tokenizer.
        template: a :class:`ChatTemplate` (a policy that was instruction-tuned), or None for plain text.
    """

    def __init__(self, model, tokenizer, template: ChatTemplate | None = None) -> None:
        self.model, self.tokenizer, self.template = model, tokenizer, template
        self.max_len = model.config.max_seq_len

    @classmethod
    def for_folder(cls, model, tokenizer, folder: str | Path | None) -> "PromptEncoder":
        """The encoder of a policy folder: its chat template when it has one."""
        has = folder is not None and (Path(folder) / CHAT_TEMPLATE_FILE).is_file()
        return cls(model, tokenizer, ChatTemplate.load(folder) if has else None)

    def prompt(self, text: str) -> list[int]:
        """Prompt ids, ending where the response starts (the assistant header, with a template)."""
        if self.template is not None:
            return self.template.encode(self.tokenizer, [{"role": "user", "content": text}],
                                        add_generation_prompt=True)[0]
        return encode_prompt(self.model, self.tokenizer, text)

    def response(self, text: str) -> list[int]:
        """Response ids (with a template: closed by its end-of-turn, as instruction tuning trains it)."""
        if self.template is not None:
            eos = self.tokenizer.special_token("eos") or ""
            tail = self.template.assistant.split("{content}", 1)[1].replace("{eos}", eos).rstrip("\n")
            return self.tokenizer.encode(text + tail, add_special_tokens=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def row(self, prompt: list[int], response: list[int]) -> tuple[list[int], list[int]]:
        """(ids, response_mask) of a prompt followed by a response cut to the context."""
        room = self.max_len - len(prompt)
        response = response[:room]
        return prompt + response, [0] * len(prompt) + [1] * len(response)

