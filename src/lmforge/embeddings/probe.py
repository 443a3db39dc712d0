"""Linear probes on frozen representations, one per layer: what does each layer encode linearly?

A probe is deliberately weak (a multinomial logistic regression), so its accuracy measures what the frozen
features make *linearly* available rather than what a strong classifier could learn on top (Tenney et al.
2019, "BERT rediscovers the classical NLP pipeline"; Hewitt & Manning 2019). Every hidden state is probed:

    words (CoNLL) --encoder, frozen--> N+1 x (n_words, D) word vectors (sub-words averaged)
                  --per layer l: StandardScaler -> LogisticRegression--> tag per word
                  --> accuracy and macro-F1 (over tags other than "O") on the evaluation words

Layer 0 (the token embeddings, no context) is the non-contextual baseline the other rows are read against.

``scalar_mix=True`` adds one more row, ``"scalar-mix"``: ELMo's task-specific combination of all layers
(Peters et al. 2018, eq. 1), ``gamma * sum_l softmax(s)_l * z_l``. The weights ``s`` are learned for the task,
jointly with a linear softmax classifier, on the training words; ``z_l`` is layer l standardised with the
training statistics (ELMo's layer-normalised variant: otherwise the layer with the largest scale would win
the mix). The mixed vectors then go through the same probe as every other row, and the row records the
learned weights (``mix_weights``, summing to one).

Example:
    >>> import pathlib, tempfile, lmforge
    >>> from lmforge.embeddings import SentenceEncoder
    >>> from lmforge.tokenization import train_tokenizer
    >>> tags = {"john": "B-per", "mary": "B-per", "paris": "B-loc", "london": "B-loc"}  # fixed by the word
    >>> texts = ["john met mary in paris", "mary saw john in london", "paris is far from london"] * 10
    >>> sentences = [{"tokens": t.split(), "tags": [tags.get(w, "O") for w in t.split()]} for t in texts]
    >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
    >>> _ = corpus.write_text("\\n".join(texts))
    >>> tok = train_tokenizer([corpus], kind="wordpiece", family="bert", vocab_size=100, show_progress=False)
    >>> enc = SentenceEncoder(lmforge.build_model("bert-tiny", vocab_size=len(tok), n_layers=2), tok)  # untrained
    >>> rows = probe_layers(enc, sentences[:21], sentences[21:])   # CoNLL sentences, e.g. WNUT-16's
    >>> print(format_table(rows))  # doctest: +ELLIPSIS
    layer      accuracy macro_f1
    0          ...
    1          ...
    2          ...
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lmforge.errors import UserInputError
from lmforge.nn.scalar_mix import ScalarMix
from lmforge.utils.io import atomic_write_bytes


def _features(encoder, sentences: Sequence[dict], batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(L, W, D) word vectors of every layer and (W,) tags, W = total words."""
    per_sentence = encoder.word_vectors_all_layers([s["tokens"] for s in sentences], batch_size=batch_size)
    feats = np.concatenate(per_sentence, axis=1)  # (L, W, D)
    tags = np.array([t for s in sentences for t in s["tags"]])
    return feats, tags


def probe_layers(encoder, train: Sequence[dict], eval: Sequence[dict], *, layers: Sequence[int] | None = None,
                 scalar_mix: bool = False, max_iter: int = 300, C: float = 1.0, batch_size: int = 32,
                 seed: int = 0) -> list[dict[str, Any]]:
    """Train one logistic-regression probe per layer on word vectors; score it on ``eval``.

    Args:
        encoder: a :class:`~lmforge.embeddings.SentenceEncoder` (its model stays frozen: no gradient).
        train, eval: sentences ``{"tokens": [...], "tags": [...]}`` (e.g. ``lmforge.datasets.read_conll``).
        layers: hidden-state indices to probe (default: all N+1).
        scalar_mix: also probe ELMo's learned scalar mix of all N+1 layers (a last row, ``layer="scalar-mix"``).
        max_iter, C: LogisticRegression settings (C = inverse L2 strength).

    Returns:
        One ``{"layer", "accuracy", "macro_f1", "train_words", "eval_words"}`` per layer (+ ``mix_weights`` on
        the scalar-mix row).
    """
    if not train or not eval:
        raise UserInputError("the probe needs training and evaluation sentences")
    x_train, y_train = _features(encoder, train, batch_size)
    x_eval, y_eval = _features(encoder, eval, batch_size)
    if len(set(y_train)) < 2:
        raise UserInputError("the training sentences hold a single tag: nothing to probe")
    rows = [{"layer": int(layer), **_fit_and_score(x_train[layer], y_train, x_eval[layer], y_eval, max_iter, C, seed)}
            for layer in (layers if layers is not None else range(x_train.shape[0]))]
    if scalar_mix:
        weights, (mixed_train, mixed_eval) = learn_scalar_mix(x_train, y_train, [x_train, x_eval], seed=seed)
        rows.append({"layer": "scalar-mix", **_fit_and_score(mixed_train, y_train, mixed_eval, y_eval, max_iter, C,
                                                             seed), "mix_weights": [float(w) for w in weights]})
    return rows


def _fit_and_score(x_train: np.ndarray, y_train: np.ndarray, x_eval: np.ndarray, y_eval: np.ndarray,
                   max_iter: int, C: float, seed: int) -> dict[str, Any]:
    """Standardise -> multinomial logistic regression on (W, D) features; accuracy and entity macro-F1."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # "O" dominates NER tags; a macro-F1 that counted it would reward predicting "O" everywhere.
    entity_tags = sorted(set(y_train) - {"O"})
    # Scaling matters: deep-layer vectors have a few huge dimensions that stall lbfgs otherwise.
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter, C=C, random_state=seed))
    clf.fit(x_train, y_train)
    pred = clf.predict(x_eval)
    f1 = f1_score(y_eval, pred, labels=entity_tags, average="macro", zero_division=0) if entity_tags else 0.0
    return {"accuracy": float(accuracy_score(y_eval, pred)), "macro_f1": float(f1),
            "train_words": int(len(y_train)), "eval_words": int(len(y_eval))}


def learn_scalar_mix(x: np.ndarray, y: np.ndarray, apply_to: Sequence[np.ndarray] = (), *, epochs: int = 30,
                     lr: float = 1e-2, batch_size: int = 1024, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """Learn ELMo's layer weights for a tagging task (see the module docstring).

    Args:
        x: (L, W, D) word vectors of every layer; y: (W,) tags.
        apply_to: further (L, W', D) arrays to mix with the learned weights (e.g. train and eval features).

    Returns:
        ``(weights (L,) summing to one, [(W', D) mixed array for each of apply_to])``. The mixed arrays are
        ``sum_l w_l z_l`` with z_l standardised by the statistics of ``x``; gamma is left out, since any
        probe standardises its input anyway.
    """
    import torch

    mean, std = x.mean(1, keepdims=True), x.std(1, keepdims=True) + 1e-6  # (L, 1, D) each
    classes, target = np.unique(y, return_inverse=True)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    z = torch.from_numpy(((x - mean) / std).astype(np.float32))  # (L, W, D)
    t = torch.from_numpy(target)
    mix, head = ScalarMix(x.shape[0]), torch.nn.Linear(x.shape[2], len(classes))
    # The L mixing scalars must travel O(1) in a few hundred steps; at the classifier's rate they barely move.
    optimizer = torch.optim.Adam([{"params": mix.parameters(), "lr": 10 * lr}, {"params": head.parameters()}], lr=lr)
    for _ in range(epochs):
        for idx in torch.randperm(z.shape[1], generator=g).split(batch_size):
            loss = torch.nn.functional.cross_entropy(head(mix(list(z[:, idx]))), t[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    weights = mix.weights.detach().numpy()
    mixed = [np.einsum("l,lwd->wd", weights, (a - mean) / std).astype(np.float32) for a in apply_to]
    return weights, mixed


def format_table(rows: Sequence[dict]) -> str:
    """A plain aligned table: layer, accuracy, macro_f1 (and the learned weights of a scalar-mix row)."""
    lines = [f"{'layer':<10} {'accuracy':>8} {'macro_f1':>8}"]
    for r in rows:
        weights = "  weights " + " ".join(f"{w:.2f}" for w in r["mix_weights"]) if "mix_weights" in r else ""
        lines.append(f"{r['layer']:<10} {r['accuracy']:>8.4f} {r['macro_f1']:>8.4f}{weights}")
    return "\n".join(lines)


def plot(rows: Sequence[dict], path: str | Path, title: str = "linear probe per layer") -> Path:
    """Accuracy and macro-F1 against the layer index, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    per_layer = [r for r in rows if r["layer"] != "scalar-mix"]
    layers = [r["layer"] for r in per_layer]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    ax.plot(layers, [r["accuracy"] for r in per_layer], "o-", label="accuracy")
    ax.plot(layers, [r["macro_f1"] for r in per_layer], "s-", label="macro-F1 (entity tags)")
    ticks, labels = list(layers), [str(layer) for layer in layers]
    for r in rows:
        if r["layer"] == "scalar-mix":  # drawn one step to the right of the last layer, as unjoined markers
            x = (max(layers) if layers else 0) + 1
            ax.plot([x], [r["accuracy"]], "o", color="C0")
            ax.plot([x], [r["macro_f1"]], "s", color="C1")
            ticks.append(x)
            labels.append("mix")
    ax.set_xlabel("layer (0 = embeddings; mix = learned scalar mix)")
    ax.set_ylim(0, 1)
    ax.set_xticks(ticks, labels)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path
