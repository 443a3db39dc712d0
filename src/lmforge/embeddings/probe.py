"""Linear probes on frozen representations, one per layer: what does each layer encode linearly?

A probe is deliberately weak (a multinomial logistic regression), so its accuracy measures what the frozen
features make *linearly* available rather than what a strong classifier could learn on top (Tenney et al.
2019, "BERT rediscovers the classical NLP pipeline"; Hewitt & Manning 2019). Every hidden state is probed:

    words (CoNLL) --encoder, frozen--> N+1 x (n_words, D) word vectors (sub-words averaged)
                  --per layer l: StandardScaler -> LogisticRegression--> tag per word
                  --> accuracy and macro-F1 (over tags other than "O") on the evaluation words

Layer 0 (the token embeddings, no context) is the non-contextual baseline the other rows are read against.

Example:
    >>> rows = probe_layers(enc, train_sentences, eval_sentences)          # doctest: +SKIP
    >>> print(format_table(rows))                                          # doctest: +SKIP
    layer  accuracy  macro_f1
    0      0.9012    0.1234
    ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np


def _features(encoder, sentences: Sequence[dict], batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(L, W, D) word vectors of every layer and (W,) tags, W = total words."""
    per_sentence = encoder.word_vectors_all_layers([s["tokens"] for s in sentences], batch_size=batch_size)
    feats = np.concatenate(per_sentence, axis=1)  # (L, W, D)
    tags = np.array([t for s in sentences for t in s["tags"]])
    return feats, tags


def probe_layers(encoder, train: Sequence[dict], eval: Sequence[dict], *, layers: Sequence[int] | None = None,
                 max_iter: int = 300, C: float = 1.0, batch_size: int = 32, seed: int = 0) -> list[dict[str, Any]]:
    """Train one logistic-regression probe per layer on word vectors; score it on ``eval``.

    Args:
        encoder: a :class:`~lmforge.embeddings.SentenceEncoder` (its model stays frozen: no gradient).
        train, eval: sentences ``{"tokens": [...], "tags": [...]}`` (e.g. ``lmforge.datasets.read_conll``).
        layers: hidden-state indices to probe (default: all N+1).
        max_iter, C: LogisticRegression settings (C = inverse L2 strength).

    Returns:
        One ``{"layer", "accuracy", "macro_f1", "train_words", "eval_words"}`` per layer.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if not train or not eval:
        raise ValueError("the probe needs training and evaluation sentences")
    x_train, y_train = _features(encoder, train, batch_size)
    x_eval, y_eval = _features(encoder, eval, batch_size)
    # "O" dominates NER tags; a macro-F1 that counted it would reward predicting "O" everywhere.
    entity_tags = sorted(set(y_train) - {"O"})
    rows = []
    for layer in (layers if layers is not None else range(x_train.shape[0])):
        if len(set(y_train)) < 2:
            raise ValueError("the training sentences hold a single tag: nothing to probe")
        # Scaling matters: deep-layer vectors have a few huge dimensions that stall lbfgs otherwise.
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter, C=C, random_state=seed))
        clf.fit(x_train[layer], y_train)
        pred = clf.predict(x_eval[layer])
        f1 = f1_score(y_eval, pred, labels=entity_tags, average="macro", zero_division=0) if entity_tags else 0.0
        rows.append({"layer": int(layer), "accuracy": float(accuracy_score(y_eval, pred)), "macro_f1": float(f1),
                     "train_words": int(len(y_train)), "eval_words": int(len(y_eval))})
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """A plain aligned table: layer, accuracy, macro_f1."""
    lines = [f"{'layer':<6} {'accuracy':>8} {'macro_f1':>8}"]
    lines += [f"{r['layer']:<6} {r['accuracy']:>8.4f} {r['macro_f1']:>8.4f}" for r in rows]
    return "\n".join(lines)


def plot(rows: Sequence[dict], path: str | Path, title: str = "linear probe per layer") -> Path:
    """Accuracy and macro-F1 against the layer index, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    layers = [r["layer"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    ax.plot(layers, [r["accuracy"] for r in rows], "o-", label="accuracy")
    ax.plot(layers, [r["macro_f1"] for r in rows], "s-", label="macro-F1 (entity tags)")
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylim(0, 1)
    ax.set_xticks(layers)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
