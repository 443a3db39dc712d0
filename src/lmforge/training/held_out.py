r"""Whether a pre-trained causal LM has learnt more than word frequencies, from what its run folder recorded.

A model folder ``RUN/model`` (or ``RUN/best``) of ``lmforge pretrain --objective clm`` has, beside it,
``RUN/metrics.jsonl`` (its held-out ``eval_loss``) and ``RUN/config.yaml`` (its ``data`` folder, whose
``manifest.json`` holds the training tokens' unigram entropy, :mod:`lmforge.data.unigram`). Both are nats per
token: a held-out loss within :data:`MARGIN` of the unigram entropy means the model predicts little beyond
each token's frequency, and greedy decoding repeats the most frequent tokens (a three-minute model writes one
quote mark after another). :func:`frequency_note` says so in one line; it says nothing when either number is unknown
(a folder outside its run, another objective, data prepared before the entropy was recorded, no evaluation).

Example::

    >>> note = frequency_note(6.41, 6.60)
    >>> print(note.replace(": expect", ":\nexpect"))
    note: this model's held-out loss (6.41 nats) is within 1.0 of a unigram model's (6.60: each token guessed from its frequency):
    expect frequent tokens repeated, not sentences; train longer (docs/guide.md#pre-training)
    >>> frequency_note(5.5, 6.60) is None
    True
"""

from __future__ import annotations

import json
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.training.config import read_settings
from lmforge.training.logging import METRICS_FILE, read_metrics

# How close to the unigram entropy a held-out loss still means "frequencies, hardly any context": within one nat
# the model is less than e = 2.7 times surer of the next token than token counts are. Measured (2026-12-02):
# gpt-tiny after 100 steps on the shipped corpus (byte-BPE 8192) is 0.52 nats under the entropy (5.91 against
# 6.43) and greedy decoding still writes ", and the very very very very ..."; half a nat would miss it.
MARGIN = 1.0
# Objectives whose eval_loss is the cross-entropy of every next corpus token, comparable with the entropy.
OBJECTIVES = ("clm",)


def frequency_note(eval_loss: float | None, unigram: float | None) -> str | None:
    """The one-line note for a held-out loss near the unigram entropy; None if not near or either unknown."""
    if eval_loss is None or unigram is None or eval_loss < unigram - MARGIN:
        return None
    return (f"note: this model's held-out loss ({eval_loss:.2f} nats) is within {MARGIN:.1f} of a unigram model's "
            f"({unigram:.2f}: each token guessed from its frequency): expect frequent tokens repeated, not sentences; "
            "train longer (docs/guide.md#pre-training)")


def held_out_loss(model_dir: str | Path) -> float | None:
    """The held-out loss of ``RUN/model`` (the last evaluation) or ``RUN/best`` (the lowest), from
    ``RUN/metrics.jsonl``; None when there is none."""
    model_dir = Path(model_dir)
    path = model_dir.parent / METRICS_FILE
    if model_dir.name not in ("model", "best") or not path.is_file():
        return None
    losses = [r["eval_loss"] for r in read_metrics(path) if isinstance(r.get("eval_loss"), (int, float))]
    if not losses:
        return None
    return min(losses) if model_dir.name == "best" else losses[-1]


def training_unigram_entropy(model_dir: str | Path) -> float | None:
    """The unigram entropy of the data the run of ``model_dir`` trained on (``RUN/config.yaml``'s ``data``
    manifest), for a causal LM run; None when unknown."""
    config = Path(model_dir).parent / "config.yaml"
    if not config.is_file():
        return None
    settings = read_settings(config)
    if settings.get("objective") not in OBJECTIVES or not settings.get("data"):
        return None
    manifest = Path(settings["data"]) / "manifest.json"
    if not manifest.is_file():
        return None
    value = json.loads(manifest.read_text(encoding="utf-8")).get("unigram_entropy")
    return float(value) if isinstance(value, (int, float)) else None


def note_for(model_dir: str | Path) -> str | None:
    """:func:`frequency_note` for a model folder inside its run folder. Never raises: a note that cannot be
    worked out (a damaged metrics file, a moved data folder) is simply not given."""
    try:
        return frequency_note(held_out_loss(model_dir), training_unigram_entropy(model_dir))
    except (LmforgeError, OSError, ValueError, KeyError, TypeError):
        return None
