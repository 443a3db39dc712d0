"""Reward models (Christiano et al. 2017; Stiennon et al. 2020; Ouyang et al. 2022): a scalar score of a
response, learned from comparisons with the Bradley-Terry model.

The probability that a labeller prefers y_w to y_l is modelled as sigmoid(r(x, y_w) - r(x, y_l)), so the
reward model r (any body with a scalar head on its pooled state: the last token of a decoder, [CLS] of an
encoder) minimises the negative log-likelihood of the comparisons::

    L = -mean log sigmoid(r(x, y_w) - r(x, y_l))          = log 2 when the two scores are equal

``lmforge finetune --task reward --train PAIRS`` trains one on (prompt, chosen, rejected) rows (the
``prompt``/``chosen``/``rejected`` columns; the prompt is the first text of the model's pair format, the
response the second) and evaluates ``pairwise_accuracy``: the share of pairs whose chosen response scores
higher. The result is a task folder; :mod:`lmforge.align.scorers` turns it (or a fine-tuned classifier) into
the reward function of PPO, GRPO and ``lmforge align make-pairs``.

Example:
    >>> import math, torch
    >>> round(float(bradley_terry_loss(torch.tensor([0.3, -1.0]), torch.tensor([0.3, -1.0]))), 6) == round(math.log(2), 6)
    True
    >>> pairwise_accuracy([2.0, 0.5, 1.0], [1.0, 0.7, 0.0])
    0.6666666666666666
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from lmforge.align.data import PAIR_FIELDS, field_text
from lmforge.tasks.base import Task
from lmforge.tasks.data import Table, TaskDataError


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """-mean log sigmoid(chosen - rejected) over (B,) scores."""
    return -F.logsigmoid(chosen.float() - rejected.float()).mean()


def pairwise_accuracy(chosen: Sequence[float], rejected: Sequence[float]) -> float:
    """The share of pairs whose chosen score is strictly higher."""
    return sum(c > r for c, r in zip(chosen, rejected)) / max(len(chosen), 1)


class RewardTask(Task):
    """Preference pairs -> a scalar head trained with :func:`bradley_terry_loss` (the ``reward`` task).

    A batch holds the B chosen rows and then the B rejected rows; ``labels`` (B,) only marks the batch as
    labelled (the head's pairwise loss reads the order).
    """

    default_metric = "pairwise_accuracy"

    def check_columns(self, table: Table, labelled: bool) -> None:
        table.require(*(self.columns[f] for f in PAIR_FIELDS))

    def encode(self, table: Table, labelled: bool = True) -> list[dict[str, Any]]:
        self.check_columns(table, labelled)
        cols = self.columns
        n = len(table)
        prompts = [field_text(table, i, cols["prompt"], allow_empty=True) for i in range(n)]
        sides = {side: [field_text(table, i, cols[side]) for i in range(n)] for side in ("chosen", "rejected")}
        for i in range(n):
            if sides["chosen"][i] == sides["rejected"][i]:
                raise TaskDataError(f"{table.where(i)}: fields {cols['chosen']!r} and {cols['rejected']!r} are the "
                                    "same text; a comparison needs two different responses (drop the row)")
        encoded = {side: self.encode_texts(table, prompts, texts) for side, texts in sides.items()}
        examples = []
        for i in range(n):
            ex: dict[str, Any] = {"row": i, "input_ids": encoded["chosen"][0][i],
                                  "rejected_ids": encoded["rejected"][0][i]}
            if encoded["chosen"][1] is not None:
                ex["token_type_ids"], ex["rejected_types"] = encoded["chosen"][1][i], encoded["rejected"][1][i]
            if labelled:
                ex["gold"] = 1
            examples.append(ex)
        return examples

    def collate(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows = list(examples) + [{"input_ids": e["rejected_ids"],
                                  **({"token_type_ids": e["rejected_types"]} if "rejected_types" in e else {})}
                                 for e in examples]
        batch = self.collate_inputs(rows)
        if "gold" in examples[0]:
            batch["labels"] = torch.ones(len(examples), dtype=torch.long)
        return batch

    def predict(self, model, examples, batch, out):
        scores = out.logits.float().squeeze(-1).tolist()  # (2B,)
        B = len(examples)
        return [{"chosen_score": round(scores[i], 6), "rejected_score": round(scores[B + i], 6)} for i in range(B)]

    def score(self, examples, predictions):
        return {"pairwise_accuracy": pairwise_accuracy([p["chosen_score"] for p in predictions],
                                                       [p["rejected_score"] for p in predictions])}
