"""Token classification (NER, POS): one tag per word, predicted at the word's first sub-token.

Words are split into sub-tokens by the model's tokenizer; only the first sub-token of each word carries the
word's tag in training, the others (and special tokens) are labelled -100 and ignored, as in BERT's NER
setup (Devlin et al. 2019, section 5.3)::

    words     Jim     Henson          was  a  puppeteer
    tokens    [CLS]  jim  hen  ##son  was  a  puppet  ##eer  [SEP]
    labels    -100   B-P  I-P  -100   O    O  O       -100   -100

A sentence longer than ``max_length`` tokens is cut; its cut-off words are predicted ``O`` (and counted in
the warning). Metrics are seqeval's entity-level precision, recall and F1 on the word tags.

Example:
    >>> align_labels([None, 0, 1, 1, 2, None], [3, 4, 5])
    [-100, 3, 4, -100, 5, -100]
"""

from __future__ import annotations

from typing import Any

import torch

from lmforge.objectives.base import IGNORE_INDEX
import lmforge.tasks.metrics as metrics
from lmforge.tasks.base import Task, pad_labels, report_truncation
from lmforge.tasks.classification import sorted_labels
from lmforge.tasks.data import Table, TaskDataError


def align_labels(word_ids: list[int | None], word_labels: list[int]) -> list[int]:
    """Per-token labels: the word's label on its first sub-token, -100 on the rest and on special tokens."""
    out, previous = [], None
    for w in word_ids:
        out.append(word_labels[w] if w is not None and w != previous else IGNORE_INDEX)
        previous = w if w is not None else previous
    return out


def first_subtokens(word_ids: list[int | None]) -> dict[int, int]:
    """word index -> position of its first sub-token."""
    first: dict[int, int] = {}
    for pos, w in enumerate(word_ids):
        if w is not None and w not in first:
            first[w] = pos
    return first


class TagTask(Task):
    """Word-level tags from per-token logits (see the module docstring)."""

    default_metric = "f1"

    def _words(self, table: Table, i: int, column: str) -> list[str]:
        value = table.rows[i].get(column)
        words = value.split() if isinstance(value, str) else list(value or [])
        if not words:
            raise TaskDataError(f"{table.where(i)}: column {column!r} is empty")
        return [str(w) for w in words]

    def label_set(self, table: Table) -> list[str]:
        col = self.columns["label"]
        table.require(col)
        tags = sorted_labels(t for i in range(len(table)) for t in self._words(table, i, col))
        # "O" first: the class most tokens have gets id 0, which reads better in logits dumps.
        return (["O"] if "O" in tags else []) + [t for t in tags if t != "O"]

    def encode(self, table: Table, labelled: bool = True) -> list[dict[str, Any]]:
        self.check_columns(table, labelled)
        words = [self._words(table, i, self.columns["text"]) for i in range(len(table))]
        specials = self.config.arch != "decoder"
        enc = self.tokenizer.encode_batch(words, is_split_into_words=True, add_special_tokens=specials,
                                          return_word_ids=True)
        long_rows = [i for i, ids in enumerate(enc["input_ids"]) if len(ids) > self.max_length]
        if long_rows:
            cut = self.tokenizer.encode_batch([words[i] for i in long_rows], is_split_into_words=True,
                                              add_special_tokens=specials, return_word_ids=True,
                                              truncation=True, max_length=self.max_length)
            for j, i in enumerate(long_rows):
                enc["input_ids"][i], enc["word_ids"][i] = cut["input_ids"][j], cut["word_ids"][j]
            report_truncation(table, long_rows, self.max_length, context=self.config.max_seq_len)
        index = {t: k for k, t in enumerate(self.spec.labels)}
        examples = []
        for i in range(len(table)):
            ex = {"row": i, "input_ids": enc["input_ids"][i], "word_ids": enc["word_ids"][i], "n_words": len(words[i])}
            if labelled:
                tags = self._words(table, i, self.columns["label"])
                if len(tags) != len(words[i]):
                    raise TaskDataError(f"{table.where(i)}: {len(words[i])} words but {len(tags)} tags")
                for tag in tags:
                    if tag not in index:
                        raise TaskDataError(f"{table.where(i)}: tag {tag!r} does not occur in the training data "
                                            f"(tags: {', '.join(self.spec.labels)})")
                ex["gold"] = tags
                ex["labels"] = align_labels(ex["word_ids"], [index[t] for t in tags])
            examples.append(ex)
        return examples

    def collate(self, examples):
        batch = self.collate_inputs(examples)
        if "labels" in examples[0]:
            batch["labels"] = pad_labels([e["labels"] for e in examples])
        return batch

    def predict(self, model, examples, batch, out):
        probs = torch.softmax(out.logits.float(), -1)  # (B, T, C)
        best_p, best = probs.max(-1)  # (B, T)
        preds = []
        for b, ex in enumerate(examples):
            first = first_subtokens(ex["word_ids"])
            tags = [self.spec.labels[int(best[b, first[w]])] if w in first else "O" for w in range(ex["n_words"])]
            conf = [round(float(best_p[b, first[w]]), 6) if w in first else None for w in range(ex["n_words"])]
            preds.append({"tags": tags, "probabilities": conf})
        return preds

    def score(self, examples, predictions):
        return metrics.entity_f1([e["gold"] for e in examples], [p["tags"] for p in predictions])
