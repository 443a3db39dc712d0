"""Multiple choice (SWAG, COPA, RACE style): score each (context, choice) pair, softmax across the choices.

BERT's recipe for SWAG (Devlin et al. 2019, 4.4): for a context ``c`` and choices ``a_1..a_C``, build the C
pairs ``[CLS] c [SEP] a_k [SEP]``, pool each into one vector ``h_k`` and score it with one shared vector
``w``; the choice probabilities are

    P(k | c) = exp(w . h_k) / sum_j exp(w . h_j)

and the loss is the cross-entropy of the right choice. The pair is written in the family's format
(:mod:`lmforge.tasks.base`), and pooled as its head says: [CLS] (through the pooler) for encoders, the last
token ([EXTRACT]) for decoders, the decoder's final state for encoder-decoders.

Rows hold a context (column ``context``), the choices (a list in column ``choice``, or the columns
``choice0``, ``choice1``, ... - SWAG's layout is ``ending0..ending3`` with ``--target-column ending``) and
the index of the right choice (column ``label``). Every row of a file has the same number of choices; an
empty choice or a label that is not one of the indices is an error naming the row.

Example:
    >>> import torch
    >>> logits = torch.tensor([[0.0, 2.0, 0.0, 0.0]])   # (B, C): one score per pair
    >>> torch.softmax(logits, -1).argmax(-1).tolist()
    [1]
"""

from __future__ import annotations

from typing import Any

import torch

import lmforge.tasks.metrics as metrics
from lmforge.tasks.base import Task, pad_batch, softmax_rows, text_of
from lmforge.tasks.data import Table, TaskDataError


class MultipleChoiceTask(Task):
    """One score per (context, choice) pair and a softmax across the choices (see the module docstring)."""

    default_metric = "accuracy"

    def check_columns(self, table: Table, labelled: bool) -> None:
        table.require(self.columns["text"])
        if labelled:
            table.require(self.columns["label"])
        self._choice_columns(table)

    def _choice_columns(self, table: Table) -> list[str] | None:
        """``choice0, choice1, ...`` when the choices are columns; None when one column holds a list."""
        name = self.columns["target"]
        if name in table.columns:
            return None
        numbered = []
        while f"{name}{len(numbered)}" in table.columns:
            numbered.append(f"{name}{len(numbered)}")
        if len(numbered) < 2:
            raise TaskDataError(f"{table.name}: no column {name!r} (a list of choices) and no columns {name}0, "
                                f"{name}1, ...; the columns are: {', '.join(table.columns)} (choose the choices' "
                                "column with --target-column)")
        return numbered

    def _choices(self, table: Table, i: int, columns: list[str] | None) -> list[str]:
        if columns is None:
            value = table.rows[i].get(self.columns["target"])
            if not isinstance(value, list):
                raise TaskDataError(f"{table.where(i)}: column {self.columns['target']!r} must hold a list of "
                                    f"choices, got {type(value).__name__}")
            for k, choice in enumerate(value):
                if choice is None or not str(choice).strip():
                    raise TaskDataError(f"{table.where(i)}: choice {k} is missing (empty)")
            return [str(c) for c in value]
        out = []
        for k, column in enumerate(columns):
            value = table.rows[i].get(column)
            if value is None or not str(value).strip():
                raise TaskDataError(f"{table.where(i)}: choice {k} (column {column!r}) is missing (empty)")
            out.append(str(value))
        return out

    def encode(self, table: Table, labelled: bool = True) -> list[dict[str, Any]]:
        self.check_columns(table, labelled)
        columns = self._choice_columns(table)
        contexts = [text_of(table, i, self.columns["text"]) for i in range(len(table))]
        choices = [self._choices(table, i, columns) for i in range(len(table))]
        C = len(choices[0])
        for i, row in enumerate(choices):
            if len(row) != C:
                raise TaskDataError(f"{table.where(i)}: {len(row)} choices, but row 1 has {C} (every row needs "
                                    "the same number)")
        # All pairs in one call: (context, choice) for every row and choice, flattened row-major.
        ids, types = self.encode_texts(table, [c for c in contexts for _ in range(C)],
                                       [a for row in choices for a in row])
        examples = []
        for i in range(len(table)):
            ex = {"row": i, "input_ids": ids[i * C:(i + 1) * C]}
            if types is not None:
                ex["token_type_ids"] = types[i * C:(i + 1) * C]
            if labelled:
                raw = text_of(table, i, self.columns["label"])
                try:
                    gold = int(float(raw))
                except ValueError:
                    gold = -1
                if not 0 <= gold < C or str(raw).strip() not in (str(gold), f"{gold}.0"):
                    raise TaskDataError(f"{table.where(i)}: label {raw!r} is not a choice index (0 to {C - 1})")
                ex["gold"] = gold
            examples.append(ex)
        return examples

    def collate(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        B, C = len(examples), len(examples[0]["input_ids"])
        ids, mask = pad_batch([s for e in examples for s in e["input_ids"]], self.pad_id)  # (B*C, T)
        batch = {"input_ids": ids.view(B, C, -1), "attention_mask": mask.view(B, C, -1)}
        if "token_type_ids" in examples[0]:
            types = pad_batch([s for e in examples for s in e["token_type_ids"]], 0)[0]
            batch["token_type_ids"] = types.view(B, C, -1)
        if "gold" in examples[0]:
            batch["labels"] = torch.tensor([e["gold"] for e in examples], dtype=torch.long)
        return batch

    def predict(self, model, examples, batch, out):
        preds = []
        for probs in softmax_rows(out.logits):  # (B, C)
            preds.append({"label": max(range(len(probs)), key=probs.__getitem__), "probabilities": probs})
        return preds

    def score(self, examples, predictions):
        return {"accuracy": metrics.accuracy([e["gold"] for e in examples], [p["label"] for p in predictions])}
