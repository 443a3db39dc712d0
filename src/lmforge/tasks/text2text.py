"""Text-to-text: every task as input text with a task prefix -> target text (Raffel et al. 2020, T5).

    sst2 sentence: it confirms fincher 's status as a film maker ...   ->  positive
    translate English to Spanish: In the beginning God created ...     ->  En el principio crió Dios ...

A classification task becomes text through ``label_map`` (label -> word, e.g. ``{"0": "negative", "1":
"positive"}``); the generated word is mapped back to its label (a word outside the map counts as wrong,
as in T5), and each label's probability comes from scoring every label word as the target (rank
classification: a softmax over the words' sequence log-likelihoods). A pair is written
``prefix + text + " " + pair_prefix + pair``, e.g. ``"mrpc sentence1: ... sentence2: ..."``.

Several tasks train together through ``TaskSpec.mixture``: one model, one vocabulary, batches drawn from
all tasks. T5's examples-proportional mixing (section 3.5.2) gives task ``m`` the rate
``r_m = min(n_m, K)^(1/T) / sum_n min(n_n, K)^(1/T)`` with cap ``K`` (``mixing_cap``, default: no cap) and
temperature ``T`` (``mixing_temperature``, 1 = proportional; large T tends to equal mixing).

Metrics: ``accuracy`` and ``f1_macro`` for tasks with a label map, BLEU/chrF/ROUGE otherwise; when several
tasks of a mixture are scored together each is reported as ``NAME/metric``, and ``score`` averages each
task's main metric (accuracy, or BLEU/100).

Example:
    >>> mixing_rates([100, 10], cap=None, temperature=1.0)
    [0.9090909090909091, 0.09090909090909091]
    >>> [round(r, 3) for r in mixing_rates([100, 10], cap=20, temperature=1.0)]
    [0.667, 0.333]
"""

from __future__ import annotations

import math
from typing import Any

import torch

import lmforge.tasks.metrics as metrics
from lmforge.tasks.base import text_of
from lmforge.tasks.classification import label_text
from lmforge.tasks.data import Table, TaskDataError
from lmforge.tasks.seq2seq import Seq2SeqTask, target_logprobs
from lmforge.tasks.spec import TaskSpec
from lmforge.errors import UserInputError


def mixing_rates(sizes: list[int], cap: int | None = None, temperature: float = 1.0) -> list[float]:
    """T5's examples-proportional mixing rates with an optional cap and temperature (see module docstring)."""
    weights = [min(n, cap) if cap is not None else n for n in sizes]
    weights = [w ** (1.0 / temperature) for w in weights]
    total = sum(weights)
    return [w / total for w in weights]


class Text2TextTask(Seq2SeqTask):
    """Seq2seq with task prefixes, label words and multi-task mixtures (see the module docstring)."""

    def __init__(self, spec: TaskSpec, tokenizer, config) -> None:
        super().__init__(spec, tokenizer, config)
        self.subs = spec.sub_specs()
        self.words: dict[str, list[list[int]]] = {}
        for name, sub in self.subs.items():
            if sub.label_map:
                ids = tokenizer.encode_batch(list(sub.label_map.values()), add_special_tokens=False)["input_ids"]
                self.words[name] = [w + ([self.eos_id] if self.eos_id is not None else []) for w in ids]

    @property
    def default_metric(self) -> str:
        if self.spec.mixture:
            return "score"
        return "accuracy" if self.spec.label_map else "bleu"

    def encode(self, table: Table, labelled: bool = True, name: str = "") -> list[dict[str, Any]]:
        """Examples of sub-task ``name`` (``""`` without a mixture), tagged with ``task: name``."""
        if name not in self.subs:
            raise UserInputError(f"no task {name!r} in the mixture (tasks: {', '.join(self.subs)})")
        sub = self.subs[name]
        cols = sub.columns()
        table.require(cols.get("text"), cols.get("text_pair"))
        if labelled:
            table.require(cols.get("label"), cols.get("target"))
        sources = []
        for i in range(len(table)):
            text = sub.task_prefix + text_of(table, i, cols["text"])
            if cols.get("text_pair"):
                text += " " + sub.pair_prefix + text_of(table, i, cols["text_pair"])
            sources.append(text)
        targets = None
        if labelled and sub.label_map:
            targets = []
            for i in range(len(table)):
                label = label_text(text_of(table, i, cols["label"]))
                if label not in sub.label_map:
                    raise TaskDataError(f"{table.where(i)}: label {label!r} has no word in the label map "
                                        f"({', '.join(f'{k}={v}' for k, v in sub.label_map.items())})")
                targets.append(sub.label_map[label])
        elif labelled:
            targets = [text_of(table, i, cols["target"]) for i in range(len(table))]
        return self.encode_pairs(table, sources, targets, extra={"task": name})

    def predict(self, model, examples, batch, out):
        texts, logprobs = self.generate(model, examples)
        preds = [{"output": t, "probability": round(math.exp(lp), 6)} for t, lp in zip(texts, logprobs)]
        for name, sub in self.subs.items():
            members = [k for k, e in enumerate(examples) if e.get("task", "") == name]
            if not sub.label_map or not members:
                continue
            inverse = {w: label for label, w in sub.label_map.items()}
            scores = target_logprobs(self, model, [examples[k] for k in members], self.words[name])
            for k, probs in zip(members, torch.softmax(scores, -1).tolist()):
                preds[k]["label"] = inverse.get(preds[k]["output"])  # None: a word outside the map
                preds[k]["probabilities"] = {label: round(p, 6) for label, p in zip(sub.label_map, probs)}
        return preds

    def score(self, examples, predictions):
        out: dict[str, float] = {}
        mains = []
        # Names carry the task ("sentiment/accuracy") only when several tasks are scored together.
        several = len({e.get("task", "") for e in examples}) > 1
        for name, sub in self.subs.items():
            idx = [k for k, e in enumerate(examples) if e.get("task", "") == name]
            if not idx:
                continue
            if sub.label_map:
                inverse = {w: label for label, w in sub.label_map.items()}
                gold = [inverse[examples[k]["gold"]] for k in idx]
                pred = [predictions[k].get("label") or "<none>" for k in idx]
                part = {"accuracy": metrics.accuracy(gold, pred),
                        "f1_macro": metrics.f1(gold, pred, "macro", labels=list(sub.label_map))}
                mains.append(part["accuracy"])
            else:
                part = metrics.generation([predictions[k]["output"] for k in idx], [examples[k]["gold"] for k in idx])
                mains.append(part["bleu"] / 100)
            out.update({f"{name}/{k}" if several else k: v for k, v in part.items()})
        if self.spec.mixture and mains:
            out["score"] = sum(mains) / len(mains)
        return out
