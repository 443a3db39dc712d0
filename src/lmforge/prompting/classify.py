"""Prompt-based classification: template + verbalizer (+ demonstrations, + calibration) -> label probabilities.

    for each query:  prompt = demonstrations + template(query)              (zero-shot when shots=0)
                     p(label) = softmax over labels of the verbalizer scores
    calibrate=True:  p <- calibrate(p, mean p(label | same demonstrations + content-free input))  (Zhao et al. 2021)

The content-free prediction is computed once per distinct demonstration set (one set for zero-shot; one per
query for knn). For MLM encoders the "[MASK]" content-free input is skipped: it would be a second mask in a
cloze prompt.

Example:
    >>> # result = classify(model, tok, Template("{x} It was {z}."), Verbalizer({"1": "good", "0": "bad"}),
    >>> #                   rows, pool=train_rows, shots=4, selection="balanced", calibrate=True)
    >>> # result.predictions[:3], result.probs.shape                     -> ['1', '0', '0'], (N, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from lmforge.prompting.calibration import CONTENT_FREE, calibrate as apply_calibration, content_free_prediction
from lmforge.prompting.icl import FewShot, row_texts
from lmforge.prompting.template import Template
from lmforge.prompting.verbalizer import Verbalizer
from lmforge.errors import UserInputError


@dataclass
class ClassifyResult:
    predictions: list[str]  # predicted label per query
    probs: torch.Tensor  # (N, C) label probabilities (calibrated when asked)
    labels: list[str]  # column order of probs
    demonstrations: list[list[int]]  # pool indices used for each query


def classify(model, tokenizer, template: Template, verbalizer: Verbalizer, rows: Sequence[dict], *,
             pool: Sequence[dict] | None = None, shots: int = 0, selection: str = "random", order: str | None = None,
             separator: str = "\n\n", seed: int = 0, calibrate: bool = False, reduction: str = "sum",
             use_cache: bool = True) -> ClassifyResult:
    """Classify ``rows`` (dicts with ``text`` [, ``text2``]) by prompting; see the module docstring."""
    if shots and not pool:
        raise UserInputError(f"{shots}-shot prompting needs a pool of demonstrations")
    fs = FewShot(template, verbalizer, k=shots, selection=selection, order=order, separator=separator, seed=seed)
    chosen = fs.select(pool or [], rows, model, tokenizer)
    contexts = [fs.context(pool or [], idx) for idx in chosen]
    prompts = [fs.prompt(c, r) for c, r in zip(contexts, rows)]
    scores = verbalizer.score(model, tokenizer, prompts, reduction=reduction, use_cache=use_cache)  # (N, C)
    probs = scores.softmax(-1)
    if calibrate and len(rows):
        free = [t for t in CONTENT_FREE if not (model.config.arch == "encoder" and t == "[MASK]")]
        n_slots = len(row_texts(rows[0]))
        cache: dict[str, torch.Tensor] = {}
        for c in dict.fromkeys(contexts):
            cf = [fs.prompt(c, (t,) * n_slots) for t in free]
            cache[c] = content_free_prediction(
                verbalizer.score(model, tokenizer, cf, reduction=reduction, use_cache=use_cache))
        probs = torch.stack([apply_calibration(p[None], cache[c])[0] for p, c in zip(probs, contexts)])
    labels = verbalizer.labels
    return ClassifyResult([labels[i] for i in probs.argmax(-1).tolist()], probs, labels, chosen)
