"""Extractive question answering (SQuAD v1.1 and 2.0): the answer is a span of the context, or none.

The input is the pair (question, context) in the family's format; a :class:`~lmforge.tasks.heads.SpanHead`
gives every token a start and an end logit. Training targets are the tokens holding the first and last
character of the answer (from the character offsets of the tokenizer).

Span decoding rule (Devlin et al. 2019, 4.2; Seo et al. 2017): among context tokens, choose the pair
``i <= j < i + max_answer_length`` maximising ``start[i] + end[j]``, and answer with the context's characters
from token ``i``'s first to token ``j``'s last. Its probability is ``softmax(start)[i] * softmax(end)[j]``
over the context tokens.

SQuAD 2.0 (Rajpurkar et al. 2018) adds questions the context cannot answer. As in BERT (Devlin et al. 2019,
4.3), "no answer" is the span that starts and ends at the first token ([CLS]): its score is
``s_null = start[0] + end[0]``, and the model answers with its best span ``s_best`` only when
``s_best > s_null + tau``. Every prediction carries ``null_score_diff = s_null - s_best``; ``tau``
(``TaskSpec.null_threshold``) is chosen on dev to maximise F1: the scores report the best threshold
(``best_f1_thresh``, from :func:`lmforge.tasks.metrics.squad_v2`); ``lmforge evaluate --tune-null-threshold``
on dev stores it in the task folder, and evaluate/predict also take one with ``--null-threshold``. A row with no answer is an empty answer list (``{"text": [], "answer_start": []}`` or
``[]``); once the training data has one, the task predicts "no answer" (threshold 0 unless set); without
any (SQuAD v1.1) it always answers with a span.

Answers are read from an ``answers`` column that holds SQuAD's ``{"text": [...], "answer_start": [...]}``, a
list of such ``{"text", "answer_start"}`` dicts, or plain text (then an ``answer_start`` column gives the
character offset, or the first occurrence in the context is used). Several gold answers count as in SQuAD:
the best match scores. Encoder and encoder-decoder models only: a causal decoder reading the question first
cannot look ahead in the context, so it is refused rather than trained badly.

Example:
    >>> import torch
    >>> best_span(torch.tensor([0., 5, 1, 0]), torch.tensor([0., 1, 4, 9]), allowed=[1, 2], max_len=30)
    (1, 2)
    >>> null_score_diff(torch.tensor([3., 5, 1, 0]), torch.tensor([4., 1, 4, 9]), 1, 2)  # (3 + 4) - (5 + 4)
    -2.0
"""

from __future__ import annotations

from typing import Any

import torch

import lmforge.tasks.metrics as metrics
from lmforge.tasks.base import Task, report_truncation, text_of
from lmforge.tasks.data import Table, TaskDataError, warn


def best_span(start: torch.Tensor, end: torch.Tensor, allowed: list[int], max_len: int) -> tuple[int, int]:
    """(i, j) positions maximising ``start[i] + end[j]`` over allowed ``i <= j < i + max_len``."""
    idx = torch.tensor(allowed, dtype=torch.long)
    s, e = start[idx].float(), end[idx].float()  # (A,)
    scores = s[:, None] + e[None, :]  # (A, A): row = start, column = end
    pos = idx.float()
    gap = pos[None, :] - pos[:, None]  # token distance from start to end
    scores = scores.masked_fill((gap < 0) | (gap >= max_len), float("-inf"))
    flat = int(scores.argmax())
    return int(idx[flat // len(idx)]), int(idx[flat % len(idx)])


def null_score_diff(start: torch.Tensor, end: torch.Tensor, i: int, j: int) -> float:
    """``s_null - s_best``: the [CLS] span's score (position 0) minus the chosen span ``(i, j)``'s."""
    return float(start[0] + end[0] - start[i] - end[j])


class QATask(Task):
    """Answer spans from start/end logits (see the module docstring)."""

    default_metric = "f1"

    def check_columns(self, table: Table, labelled: bool) -> None:
        if self.config.arch == "decoder":
            raise TaskDataError("task 'qa' needs an encoder or encoder-decoder model: a causal decoder cannot "
                                "see the context after each token (use seq2seq/text2text for generative QA)")
        super().check_columns(table, labelled)

    def _answers(self, table: Table, i: int, context: str) -> list[tuple[str, int]]:
        """Gold (text, character start) pairs of row ``i``; none for an unanswerable question (SQuAD 2.0)."""
        value = table.rows[i].get(self.columns["target"])
        if isinstance(value, dict) and "text" in value:
            texts, starts = list(value["text"]), list(value.get("answer_start") or [None] * len(value["text"]))
            pairs = list(zip(texts, starts))
        elif isinstance(value, list):
            pairs = [(a["text"], a.get("answer_start")) if isinstance(a, dict) else (str(a), None) for a in value]
        elif value is None or not str(value).strip():
            raise TaskDataError(f"{table.where(i)}: column {self.columns['target']!r} is empty (an unanswerable "
                                "question's answers are an empty list)")
        else:
            start = table.rows[i].get("answer_start")
            pairs = [(str(value), int(start) if start not in (None, "") else None)]
        out = []
        for text, start in pairs:
            if start is None:
                start = context.find(text)
            if start < 0 or context[start:start + len(text)] != text:
                raise TaskDataError(f"{table.where(i)}: answer {text!r} is not in the context"
                                    + (f" at character {start}" if start >= 0 else ""))
            out.append((text, int(start)))
        return out

    def encode(self, table: Table, labelled: bool = True) -> list[dict[str, Any]]:
        self.check_columns(table, labelled)
        cols = self.columns
        questions = [text_of(table, i, cols["text"]) for i in range(len(table))]
        contexts = [text_of(table, i, cols["text_pair"]) for i in range(len(table))]
        tok = self.tokenizer
        enc = tok.encode_batch(questions, contexts, return_offsets=True, return_word_ids=True)
        long_rows = [i for i, ids in enumerate(enc["input_ids"]) if len(ids) > self.max_length]
        if long_rows:
            cut = tok.encode_batch([questions[i] for i in long_rows], [contexts[i] for i in long_rows],
                                   return_offsets=True, return_word_ids=True, truncation=True,
                                   max_length=self.max_length)
            for j, i in enumerate(long_rows):
                for key in ("input_ids", "token_type_ids", "offsets", "sequence_ids"):
                    enc[key][i] = cut[key][j]
            report_truncation(table, long_rows, self.max_length, context=self.config.max_seq_len)
        examples, lost = [], []
        for i in range(len(table)):
            context_tokens = [p for p, s in enumerate(enc["sequence_ids"][i]) if s == 1]
            ex = {"row": i, "input_ids": enc["input_ids"][i], "offsets": enc["offsets"][i],
                  "context_tokens": context_tokens, "context": contexts[i]}
            if self.config.type_vocab_size >= 2:
                ex["token_type_ids"] = enc["token_type_ids"][i]
            if labelled:
                answers = self._answers(table, i, contexts[i])
                ex["gold"] = [a for a, _ in answers]
                span = self._token_span(ex, *answers[0]) if answers else (0, 0)  # no answer: the [CLS] span
                if span is None:
                    lost.append(i)
                    span = (0, 0)  # the answer was cut off; evaluation keeps the row, training drops it
                ex["labels"] = list(span)
            examples.append(ex)
        if lost:
            warn(f"{table.name}: {len(lost)} answers lie beyond the first {self.max_length} tokens (first: "
                 f"{table.where(lost[0]).split(': ', 1)[1]}); those rows are not used for training")
            for i in lost:
                examples[i]["answer_cut"] = True
        return examples

    def _token_span(self, ex: dict[str, Any], text: str, start: int) -> tuple[int, int] | None:
        end = start + len(text)  # exclusive character end
        offsets = ex["offsets"]
        inside = [p for p in ex["context_tokens"] if offsets[p][1] > start and offsets[p][0] < end]
        if not inside:
            return None
        return inside[0], inside[-1]

    def collate(self, examples):
        batch = self.collate_inputs(examples)
        if "labels" in examples[0]:
            batch["labels"] = torch.tensor([e["labels"] for e in examples], dtype=torch.long)
        return batch

    def predict(self, model, examples, batch, out):
        preds = []
        for b, ex in enumerate(examples):
            allowed = ex["context_tokens"]
            if not allowed:
                preds.append({"answer": "", "start": 0, "end": 0, "probability": 0.0})
                continue
            start, end = out.logits[b, :, 0], out.logits[b, :, 1]
            i, j = best_span(start, end, allowed, self.spec.max_answer_length)
            idx = torch.tensor(allowed)
            p_start = torch.softmax(start[idx].float(), 0)[allowed.index(i)]
            p_end = torch.softmax(end[idx].float(), 0)[allowed.index(j)]
            a, z = ex["offsets"][i][0], ex["offsets"][j][1]
            pred = {"answer": ex["context"][a:z], "start": a, "end": z, "probability": round(float(p_start * p_end), 6),
                    "null_score_diff": round(null_score_diff(start, end, i, j), 6)}
            threshold = self.spec.null_threshold
            if threshold is not None:
                pred["span"] = pred["answer"]
                if pred["null_score_diff"] > threshold:
                    pred.update(answer="", start=0, end=0)
            preds.append(pred)
        return preds

    def score(self, examples, predictions):
        golds = [e["gold"] for e in examples]
        if self.spec.null_threshold is None and all(golds):
            return metrics.qa([p["answer"] for p in predictions], golds)
        return metrics.squad_v2([p.get("span", p["answer"]) for p in predictions], golds,
                                [p["null_score_diff"] for p in predictions], self.spec.null_threshold or 0.0)
