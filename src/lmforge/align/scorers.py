"""Reward functions for PPO, GRPO and ``make-pairs``: a reward model, a fine-tuned classifier, or Python code.

    --reward RUN/best                         a task folder: ``finetune --task reward`` (the scalar score) or
                                              ``finetune --task classify`` (a chosen label's log-prob, prob or margin)
    --reward lmforge.align.grpo:exact_answer_reward     any callable reward(prompts, responses, rows) -> scores

A reward model reads text: the policy's responses are decoded and encoded again with the reward model's own
tokenizer, in the input format it was trained with (a reward model: prompt and response as its text pair; a
classifier: the prompt and the response as one text, as a review's opening and its continuation). A classifier
scores the label ``--reward-label`` (default: its last label, e.g. ``1`` or ``pos``) as

    logprob   log p(label | text)
    prob      p(label | text)                      (Ziegler et al. 2019's positive-sentiment reward)
    margin    logit(label) - max other logit

Example:
    >>> reward = resolve_reward("lmforge.align.grpo:exact_answer_reward")
    >>> reward(["1+1="], ["2"], [{"answer": "2"}])
    [1.0]
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

import torch

from lmforge.errors import UserInputError
from lmforge.model_folder import TOKENIZER_FILE
from lmforge.tasks.data import Table
from lmforge.tasks.model import load_task_model, read_task_meta
from lmforge.tasks.registry import build_task
from lmforge.tasks.spec import TaskSpec
from lmforge.tokenization import Tokenizer

KINDS = ("logprob", "prob", "margin")


class ModelReward:
    """A task folder as a reward function (see the module docstring).

    Args:
        folder: a ``reward`` or ``classify`` task folder with its tokenizer.
        kind: for a classifier, ``logprob``, ``prob`` or ``margin``.
        label: for a classifier, the label whose score is the reward (default: its last label).
        batch_size: texts scored per forward pass.
    """

    def __init__(self, folder: str | Path, kind: str = "prob", label: str | None = None, batch_size: int = 32,
                 device: str | torch.device = "cpu") -> None:
        folder = Path(folder)
        meta = read_task_meta(folder)
        if meta is None:
            raise UserInputError(f"--reward {folder}: not a task folder (no task.json); train a reward model with "
                                 "`lmforge finetune --task reward` or a classifier with `--task classify`")
        spec = TaskSpec.from_dict(meta["spec"], source=str(folder / "task.json"))
        if spec.task not in ("reward", "classify"):
            raise UserInputError(f"--reward {folder}: a {spec.task!r} model; a reward is a 'reward' or 'classify' "
                                 "task folder")
        if not (folder / TOKENIZER_FILE).is_file():
            raise UserInputError(f"--reward {folder}: no {TOKENIZER_FILE}; the reward model reads the responses as "
                                 "text and needs its own tokenizer")
        if kind not in KINDS:
            raise UserInputError(f"--reward-kind {kind!r} is not one of {', '.join(KINDS)}")
        if spec.task == "classify":
            label = label if label is not None else spec.labels[-1]
            if label not in spec.labels:
                raise UserInputError(f"--reward-label {label!r}: the classifier {folder} has labels "
                                     f"{', '.join(spec.labels)}")
            self.label = spec.labels.index(label)
        self.spec, self.kind, self.batch_size, self.device = spec, kind, batch_size, device
        self.model = load_task_model(folder, device=str(device)).eval()
        self.tokenizer = Tokenizer.load(folder)
        if self.tokenizer.vocab_size > self.model.body.config.vocab_size:
            raise UserInputError(f"--reward {folder}: its tokenizer ({self.tokenizer.vocab_size} tokens) is not the "
                                 f"one its model was trained with ({self.model.body.config.vocab_size} embeddings)")
        self.task = build_task(spec, self.tokenizer, self.model.body.config)

    def _encode(self, prompts: Sequence[str], responses: Sequence[str]) -> list[dict]:
        table = Table("reward input", [{}] * len(prompts), [])
        if self.spec.task == "reward":
            ids, types = self.task.encode_texts(table, list(prompts), list(responses))
        else:
            ids, types = self.task.encode_texts(table, [p + r for p, r in zip(prompts, responses)])
        return [{"input_ids": x, **({"token_type_ids": types[i]} if types is not None else {})}
                for i, x in enumerate(ids)]

    @torch.no_grad()
    def __call__(self, prompts: Sequence[str], responses: Sequence[str], rows: Sequence[dict] | None = None
                 ) -> list[float]:
        examples = self._encode(prompts, responses)
        scores: list[float] = []
        for start in range(0, len(examples), self.batch_size):
            batch = self.task.collate_inputs(examples[start:start + self.batch_size])
            logits = self.model(**{k: v.to(self.device) for k, v in batch.items()}).logits.float()  # (B, C)
            scores += self._score(logits).tolist()
        return scores

    def _score(self, logits: torch.Tensor) -> torch.Tensor:
        if self.spec.task == "reward":
            return logits.squeeze(-1)
        k = self.label
        if self.kind == "margin":
            others = torch.cat([logits[:, :k], logits[:, k + 1:]], dim=1)
            return logits[:, k] - others.max(1).values
        logp = torch.log_softmax(logits, -1)[:, k]
        return logp.exp() if self.kind == "prob" else logp


def resolve_reward(spec: str, kind: str = "prob", label: str | None = None, device: str | torch.device = "cpu"):
    """``--reward`` as a function: a task folder (:class:`ModelReward`) or ``module:callable``."""
    path = Path(spec)
    if path.is_dir():
        return ModelReward(path, kind, label, device=device)
    if ":" in spec and not path.exists():
        module, _, name = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise UserInputError(f"--reward {spec}: cannot import {name!r} from {module!r} ({exc})") from None
        if not callable(fn):
            raise UserInputError(f"--reward {spec}: {name!r} is not callable")
        return fn
    raise UserInputError(f"--reward {spec}: neither a task folder nor module:function")
