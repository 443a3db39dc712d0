"""Sequence-level tasks: classification (one class), regression (a number, STS-B style), multi-label.

A single text or a pair goes in, in the family's format (:mod:`lmforge.tasks.base`); the pooled vector goes
through a :class:`~lmforge.tasks.heads.SequenceHead`. Labels are read as text, so ``1`` in a TSV and ``1`` in
a JSONL are the same class; the class ids follow :func:`sorted_labels`.

    task        label column          prediction                                metrics
    classify    one class name        label + probability of every class        accuracy, F1 macro/micro, MCC
    regress     a number              score                                     Pearson, Spearman, MSE
    multilabel  list, or "a,b" text   labels with probability > 0.5 + all probs  F1 micro/macro, subset accuracy

Example:
    >>> sorted_labels(["10", "9", "2"]), sorted_labels(["pos", "neg"])
    (['2', '9', '10'], ['neg', 'pos'])
"""

from __future__ import annotations

import math
from typing import Any

import torch

import lmforge.tasks.metrics as metrics
from lmforge.tasks.base import Task, softmax_rows, text_of
from lmforge.tasks.data import Table, TaskDataError


def sorted_labels(labels) -> list[str]:
    """Distinct labels in a stable order: numerically when every label is a number, else as text."""
    unique = sorted(set(labels))
    try:
        return sorted(unique, key=float)
    except ValueError:
        return unique


def label_text(value: Any) -> str:
    """A label cell as text (``1.0`` from a float column reads as ``1``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


class _SequenceTask(Task):
    def _inputs(self, table: Table) -> list[dict[str, Any]]:
        cols = self.columns
        n = len(table)
        texts = [text_of(table, i, cols["text"]) for i in range(n)]
        pairs = [text_of(table, i, cols["text_pair"]) for i in range(n)] if cols.get("text_pair") else None
        ids, types = self.encode_texts(table, texts, pairs)
        if self.spec.input_transform == "gpt1-similarity":  # GPT-1: no natural order, so both: (A, B) and (B, A)
            swapped, _ = self.encode_texts(table, pairs, texts)
            ids = [[x, y] for x, y in zip(ids, swapped)]
        examples = []
        for i in range(n):
            ex = {"row": i, "input_ids": ids[i]}
            if types is not None:
                ex["token_type_ids"] = types[i]
            examples.append(ex)
        return examples

    def _unknown_label(self, table: Table, i: int, label: str) -> TaskDataError:
        known = ", ".join(self.spec.labels[:20]) + (" ..." if len(self.spec.labels) > 20 else "")
        return TaskDataError(f"{table.where(i)}: label {label!r} does not occur in the training data "
                             f"(labels: {known})")

    def collate(self, examples):
        batch = self.collate_inputs(examples)
        if "gold" in examples[0]:
            batch["labels"] = self._label_tensor([e["gold"] for e in examples])
        return batch


class ClassifyTask(_SequenceTask):
    """One class per text (or pair): softmax cross-entropy."""

    default_metric = "accuracy"

    def label_set(self, table: Table) -> list[str]:
        col = self.columns["label"]
        table.require(col)
        return sorted_labels(label_text(text_of(table, i, col)) for i in range(len(table)))

    def encode(self, table: Table, labelled: bool = True) -> list[dict[str, Any]]:
        self.check_columns(table, labelled)
        examples = self._inputs(table)
        if labelled:
            index = {label: k for k, label in enumerate(self.spec.labels)}
            for ex in examples:
                label = label_text(text_of(table, ex["row"], self.columns["label"]))
                if label not in index:
                    raise self._unknown_label(table, ex["row"], label)
                ex["gold"] = index[label]
        return examples

    def _label_tensor(self, gold):
        return torch.tensor(gold, dtype=torch.long)

    def predict(self, model, examples, batch, out):
        labels = self.spec.labels
        preds = []
        for probs in softmax_rows(out.logits):
            best = max(range(len(probs)), key=probs.__getitem__)
            preds.append({"label": labels[best], "probabilities": dict(zip(labels, probs))})
        return preds

    def score(self, examples, predictions):
        gold = [self.spec.labels[e["gold"]] for e in examples]
        return metrics.classification(gold, [p["label"] for p in predictions], labels=self.spec.labels)


class RegressTask(_SequenceTask):
    """A real number per text (or pair): mean squared error on one output."""

    default_metric = "spearman"

    def encode(self, table: Table, labelled: bool = True) -> list[dict[str, Any]]:
        self.check_columns(table, labelled)
        examples = self._inputs(table)
        if labelled:
            for ex in examples:
                raw = text_of(table, ex["row"], self.columns["label"])
                try:
                    value = float(raw)
                except ValueError:
                    raise TaskDataError(f"{table.where(ex['row'])}: label {raw!r} is not a number "
                                        "(task 'regress' needs numeric labels)") from None
                if not math.isfinite(value):
                    raise TaskDataError(f"{table.where(ex['row'])}: label {raw!r} is not a finite number")
                ex["gold"] = value
        return examples

    def _label_tensor(self, gold):
        return torch.tensor(gold, dtype=torch.float32)

    def predict(self, model, examples, batch, out):
        return [{"score": round(float(v), 6)} for v in out.logits.float().squeeze(-1).tolist()]

    def score(self, examples, predictions):
        return metrics.correlations([e["gold"] for e in examples], [p["score"] for p in predictions])


class MultilabelTask(_SequenceTask):
    """Any subset of the classes per text: an independent sigmoid per class, threshold 0.5."""

    default_metric = "f1_micro"

    def _label_list(self, table: Table, i: int) -> list[str]:
        value = table.rows[i].get(self.columns["label"])
        if isinstance(value, (list, tuple)):
            return [label_text(v) for v in value]
        if value is None:
            raise TaskDataError(f"{table.where(i)}: column {self.columns['label']!r} is empty")
        parts = str(value).split(self.spec.label_separator)
        return [p.strip() for p in parts if p.strip()]  # an empty cell is the empty set, which is allowed

    def label_set(self, table: Table) -> list[str]:
        table.require(self.columns["label"])
        return sorted_labels(label for i in range(len(table)) for label in self._label_list(table, i))

    # Opens as ClassifyTask.encode does; the target differs (a multi-hot vector, not one class id).
    def encode(self, table: Table, labelled: bool = True) -> list[dict[str, Any]]:
        self.check_columns(table, labelled)
        examples = self._inputs(table)
        if labelled:
            index = {label: k for k, label in enumerate(self.spec.labels)}
            for ex in examples:
                gold = self._label_list(table, ex["row"])
                for label in gold:
                    if label not in index:
                        raise self._unknown_label(table, ex["row"], label)
                ex["gold"] = sorted({index[label] for label in gold})
        return examples

    def _label_tensor(self, gold):
        target = torch.zeros(len(gold), len(self.spec.labels))
        for row, ids in enumerate(gold):
            target[row, ids] = 1.0
        return target

    def predict(self, model, examples, batch, out):
        labels = self.spec.labels
        preds = []
        for probs in torch.sigmoid(out.logits.float()).tolist():
            preds.append({"labels": [lbl for lbl, p in zip(labels, probs) if p > 0.5],
                          "probabilities": {lbl: round(p, 6) for lbl, p in zip(labels, probs)}})
        return preds

    def score(self, examples, predictions):
        gold = [[self.spec.labels[k] for k in e["gold"]] for e in examples]
        return metrics.multilabel(gold, [p["labels"] for p in predictions], self.spec.labels)
