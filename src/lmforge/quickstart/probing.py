"""Stage 10: a linear probe per layer: how much sentiment can a logistic regression read off each layer?

Each review is encoded by a frozen model; every hidden state (0 = the token embeddings, then one per block)
is mean-pooled into one vector per review, and one logistic regression per layer is fitted on training
reviews and scored on test reviews (Alain & Bengio 2016; Tenney et al. 2019). The probe is deliberately
weak, so its accuracy shows what the representation makes *linearly* available. Three encoders: bert-tiny
as pre-trained here, the same architecture with random weights (what the probe finds without any
pre-training), and all-MiniLM-L6-v2 when installed.

(:func:`lmforge.embeddings.probe.probe_layers` probes word-level tags from CoNLL files; sentiment is a
sentence label, hence this sentence-level variant built from the same pieces.)
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lmforge import datasets
from lmforge.checkpoint import load_body
from lmforge.embeddings import SentenceEncoder
from lmforge.embeddings.pooling import pool
from lmforge.quickstart.budget import count_for
from lmforge.quickstart.context import SEED, Context
from lmforge.quickstart.retrieval import encoders

TRAIN_ROWS, TEST_ROWS = 2000, 1000
FLOOR = 300  # reviews, training and test together
ENCODING_SHARE = 0.7  # of the stage's time; the rest fits the regressions
BATCH = 64
PROBE_C = 0.1  # inverse L2 strength of the probes


def layer_features(encoder, texts: list[str], batch_size: int = BATCH, precision=None) -> np.ndarray:
    """(L + 1, N, D) mean-pooled hidden states of every layer for ``texts`` (one forward pass per batch), under
    the autocast context ``precision`` when given."""
    import contextlib

    import torch

    chunks = []
    encoder.eval()
    with torch.no_grad(), precision if precision is not None else contextlib.nullcontext():
        for start in range(0, len(texts), batch_size):
            batch = encoder.tokenize(texts[start:start + batch_size])
            states = encoder.hidden_states(batch["input_ids"], batch["attention_mask"])
            chunks.append(torch.stack([pool(h, batch["attention_mask"], "mean") for h in states]).float().cpu())
    return torch.cat(chunks, dim=1).numpy()


def probe_accuracy(x_train: np.ndarray, y_train: list, x_test: np.ndarray, y_test: list) -> float:
    """Test accuracy of a standardised logistic regression fitted on ``(x_train, y_train)``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # Fewer reviews than dimensions make the classes separable: without a firm L2 penalty lbfgs chases an
    # unbounded solution for its whole iteration budget, and the probe overfits anyway.
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=PROBE_C, max_iter=300, random_state=0))
    clf.fit(x_train, y_train)
    return float((clf.predict(x_test) == np.asarray(y_test)).mean())


def probing(ctx: Context, seconds: float) -> dict[str, Any]:
    """Stage ``probing``."""
    import importlib.util

    if importlib.util.find_spec("sklearn") is None:
        return {"skipped": "scikit-learn is not installed", "summary": "skipped: pip install scikit-learn"}
    import torch

    start = time.perf_counter()
    train, test = datasets.load("rt-sentiment", "train"), datasets.load("rt-sentiment", "test")
    (pretrained, (bert, _)), *others = encoders(ctx).items()  # bert-tiny first, then MiniLM if installed
    torch.manual_seed(SEED)  # the same random weights on every run
    random_body, tok = load_body(str(ctx.path(ctx.result("pretrain-bert")["model_dir"])), random_init=True)
    found = {pretrained: bert,
             "bert-tiny (random weights)": SentenceEncoder(random_body.to(ctx.device).eval(), tok, pooling="mean")}
    found.update({name: encoder for name, (encoder, _) in others})
    # Size the probe sets to the time: encode one batch with every encoder, keep a share of the stage's time
    # for the regressions, and split the reviews that fit 2:1 between training and test.
    timed = time.perf_counter()
    for encoder in found.values():
        layer_features(encoder, [r["text"] for r in train[:BATCH]], precision=ctx.inference())
    per_review = (time.perf_counter() - timed) / BATCH
    left = (seconds - (time.perf_counter() - start)) * ENCODING_SHARE
    n = count_for(left, per_review, ctx.scaled(TRAIN_ROWS + TEST_ROWS, floor=FLOOR), floor=FLOOR)
    train, test = train[:n * 2 // 3], test[:n - n * 2 // 3]
    layers: dict[str, list[float]] = {}
    for name, encoder in found.items():
        x_train = layer_features(encoder, [r["text"] for r in train], precision=ctx.inference())
        x_test = layer_features(encoder, [r["text"] for r in test], precision=ctx.inference())
        y_train, y_test = [r["label"] for r in train], [r["label"] for r in test]
        layers[name] = [probe_accuracy(x_train[l], y_train, x_test[l], y_test) for l in range(x_train.shape[0])]
        best = int(np.argmax(layers[name]))
        ctx.log(f"{name}: best layer {best} ({layers[name][best]:.3f}); " +
                " ".join(f"{a:.2f}" for a in layers[name]))
    majority = max(sum(r["label"] == c for r in test) for c in (0, 1)) / len(test)
    best = {name: {"layer": int(np.argmax(acc)), "accuracy": max(acc)} for name, acc in layers.items()}
    shown = ", ".join(f"{'random' if 'random' in name else name.split(' (')[0]} {b['accuracy']:.3f}"
                      for name, b in best.items())
    return {"train_examples": len(train), "test_examples": len(test), "layers": layers, "best": best,
            "majority_baseline": majority, "summary": f"best-layer probe accuracy: {shown}"}
