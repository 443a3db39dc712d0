"""Sentence-BERT fine-tuning and evaluation (Reimers & Gurevych 2019).

A siamese network: the *same* encoder embeds every side of a pair or triplet, the pooled vectors go into
one of the losses of :mod:`lmforge.embeddings.losses`, and the gradient reaches the Transformer through the
pooling. The rows a loss needs:

    loss     columns                                        shipped data
    triplet  anchor, positive, negative                     bible-triplets
    mnrl     anchor, positive [, negative]                  bible-triplets (the negative is a hard one)
             or text1, text2 with label >= 1 (positives)    bible-paraphrase
    cosine   text1, text2, label (target cosine, 0/1 here)  bible-paraphrase

Evaluation on held-out pairs:
    * :func:`evaluate_sts`: Spearman correlation of cos(text1, text2) with the label.
    * :func:`evaluate_retrieval`: each positive pair's text1 is a query; the corpus is every text2 of the set
      (the hard negatives included); recall@k and MRR of the paired text2.

Example:
    >>> from lmforge.embeddings import SentenceEncoder
    >>> enc = SentenceEncoder.load("runs/minilm")                              # doctest: +SKIP
    >>> train_embedding(enc, "bible-triplets:train", loss="mnrl", out="runs/sbert", max_steps=200)  # doctest: +SKIP
    >>> evaluate_retrieval(enc, lmforge.datasets.load("bible-paraphrase", "test"))  # doctest: +SKIP
    {'recall@1': ..., 'recall@5': ..., 'recall@10': ..., 'mrr': ..., 'queries': ...}
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from lmforge.embeddings.encoder import SentenceEncoder
from lmforge.embeddings.losses import LOSSES

EMBEDDING_FILE = "embedding.json"  # pooling settings saved beside a trained model


def read_rows(source: str | Path | Sequence[dict]) -> list[dict[str, Any]]:
    """Rows from a list of dicts, a registry name ``"bible-triplets:train"`` or a TSV/JSONL file."""
    if not isinstance(source, (str, Path)):
        return list(source)
    import lmforge.datasets as datasets

    text = str(source)
    name, _, split = text.partition(":")
    if name in datasets.names() and not Path(text).exists():
        return datasets.load(name, split or "train")
    file = Path(text)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: not found (give a TSV/JSONL file or a data set such as bible-triplets:train)")
    if file.suffix == ".jsonl":
        return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    return datasets.read_tsv(file)


def loss_columns(rows: Sequence[dict], loss: str) -> list[tuple]:
    """The tuples a loss consumes: (a, p, n), (a, p[, n]) or (u, v, label). Raises on missing columns."""
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r}: use one of {', '.join(LOSSES)}")
    if not rows:
        raise ValueError("no training rows")
    keys = set(rows[0])
    if loss == "triplet":
        _need(keys, ("anchor", "positive", "negative"), loss)
        return [(r["anchor"], r["positive"], r["negative"]) for r in rows]
    if loss == "mnrl":
        if {"anchor", "positive"} <= keys:
            return [(r["anchor"], r["positive"]) + ((r["negative"],) if "negative" in keys else ()) for r in rows]
        _need(keys, ("text1", "text2", "label"), loss)
        # in-batch negatives need positive pairs only; the labelled negatives would be false positives
        return [(r["text1"], r["text2"]) for r in rows if float(r["label"]) >= 1]
    _need(keys, ("text1", "text2", "label"), loss)
    return [(r["text1"], r["text2"], float(r["label"])) for r in rows]


def _need(keys: set, columns: tuple[str, ...], loss: str) -> None:
    missing = [c for c in columns if c not in keys]
    if missing:
        raise ValueError(f"loss {loss!r} needs columns {', '.join(columns)}; missing {', '.join(missing)} "
                         f"(have {', '.join(sorted(keys))})")


def batch_loss(encoder: SentenceEncoder, batch: Sequence[tuple], loss: str, pooling: str) -> torch.Tensor:
    """The loss of one batch of tuples (see :func:`loss_columns`); differentiable w.r.t. the encoder."""
    def embed(texts):
        ids = encoder.tokenize(list(texts))
        return encoder(ids["input_ids"], ids["attention_mask"], pooling=pooling)  # (B, D)

    columns = list(zip(*batch))
    if loss == "cosine":
        labels = torch.tensor(columns[2], device=encoder.device)
        return LOSSES[loss](embed(columns[0]), embed(columns[1]), labels)
    return LOSSES[loss](*(embed(c) for c in columns))


def train_embedding(encoder: SentenceEncoder, train: str | Path | Sequence[dict], *, loss: str = "mnrl",
                    out: str | Path | None = None, pooling: str = "mean", epochs: int = 1,
                    max_steps: int | None = None, batch_size: int = 16, lr: float = 2e-5, warmup: float = 0.1,
                    seed: int = 0, eval_pairs: str | Path | Sequence[dict] | None = None,
                    progress: bool = False) -> dict[str, Any]:
    """Fine-tune ``encoder`` in place as a Sentence-BERT model; optionally save it and evaluate.

    Args:
        encoder: the model + tokenizer to train (its ``model`` is updated in place).
        train: rows, a data set ``name:split`` or a file (see :func:`read_rows`).
        loss: ``triplet``, ``mnrl`` or ``cosine``.
        out: folder to save the trained model (+ tokenizer + ``embedding.json``) into; None = don't save.
        pooling: pooling used for training and recorded for inference.
        epochs, max_steps: passes over the data; ``max_steps`` stops earlier.
        batch_size: tuples per step (for MNRL, also the number of candidates per anchor).
        lr, warmup: AdamW peak learning rate; linear warm-up over this fraction of steps, then linear decay.
        seed: shuffling and dropout seed.
        eval_pairs: held-out ``text1, text2, label`` rows for :func:`evaluate_sts` and :func:`evaluate_retrieval`.

    Returns:
        ``{"steps", "loss" (mean of the last epoch's steps), "seconds", **eval metrics, "model_dir"}``.
    """
    tuples = loss_columns(read_rows(train), loss)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    per_epoch = math.ceil(len(tuples) / batch_size)
    total = min(max_steps, per_epoch * epochs) if max_steps else per_epoch * epochs
    params = [p for p in encoder.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    warm = max(1, int(warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm))))
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=total, desc=f"sbert/{loss}", unit="step")
    encoder.train()
    step, losses, started = 0, [], time.time()
    while step < total:
        order = list(range(len(tuples)))
        rng.shuffle(order)
        losses = []
        for start in range(0, len(order), batch_size):
            if step >= total:
                break
            batch = [tuples[i] for i in order[start:start + batch_size]]
            if loss == "mnrl" and len(batch) < 2:
                continue  # a lone pair has no in-batch negative: the loss would be identically zero
            value = batch_loss(encoder, batch, loss, pooling)
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            sched.step()
            step += 1
            losses.append(value.item())
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
    if bar is not None:
        bar.close()
    encoder.eval()
    result: dict[str, Any] = {"steps": step, "loss": float(np.mean(losses)) if losses else None,
                              "seconds": round(time.time() - started, 2)}
    if eval_pairs is not None:
        pairs = read_rows(eval_pairs)
        result.update(evaluate_sts(encoder, pairs, pooling=pooling))
        result.update(evaluate_retrieval(encoder, pairs, pooling=pooling))
    if out is not None:
        from lmforge import checkpoint

        settings = {"pooling": pooling, "normalize": True, "loss": loss}
        result["model_dir"] = str(checkpoint.save(encoder.model, out, tokenizer=encoder.tokenizer,
                                                  extra_files={EMBEDDING_FILE: json.dumps(settings, indent=2) + "\n"}))
    return result


def evaluate_sts(encoder: SentenceEncoder, pairs: Sequence[dict], *, pooling: str | None = None,
                 layer: int | str = -1, batch_size: int = 64) -> dict[str, float]:
    """Spearman (and Pearson) correlation of cos(text1, text2) with ``label``, as in SBERT's STS tables.

    Both are None when every label is the same (a correlation is then undefined).
    """
    from scipy.stats import pearsonr, spearmanr

    u = encoder.encode([p["text1"] for p in pairs], pooling=pooling, layer=layer, batch_size=batch_size)
    v = encoder.encode([p["text2"] for p in pairs], pooling=pooling, layer=layer, batch_size=batch_size)
    cos = (u * v).sum(1)  # rows are unit vectors
    labels = np.array([float(p["label"]) for p in pairs])
    if len(set(labels.tolist())) < 2:  # a correlation with constant labels is undefined
        return {"spearman": None, "pearson": None}
    return {"spearman": float(spearmanr(cos, labels).statistic), "pearson": float(pearsonr(cos, labels).statistic)}


def evaluate_retrieval(encoder: SentenceEncoder, pairs: Sequence[dict], *, ks: Sequence[int] = (1, 5, 10),
                       pooling: str | None = None, layer: int | str = -1, batch_size: int = 64,
                       positive_label: float = 1.0) -> dict[str, float]:
    """Recall@k and MRR: the queries are the positive pairs' ``text1``; the corpus is every distinct ``text2``.

    A pair is positive when ``label >= positive_label`` (rows without a label count as positive).

    Returns ``{"recall@k": fraction of queries whose partner ranks in the top k, "mrr": mean 1/rank, "queries"}``.
    """
    corpus = sorted({p["text2"] for p in pairs})
    where = {t: i for i, t in enumerate(corpus)}
    positives = [p for p in pairs if float(p.get("label", positive_label)) >= positive_label]
    if not positives:
        raise ValueError("retrieval evaluation needs pairs with label 1")
    q = encoder.encode([p["text1"] for p in positives], pooling=pooling, layer=layer, batch_size=batch_size)
    d = encoder.encode(corpus, pooling=pooling, layer=layer, batch_size=batch_size)
    return retrieval_metrics(q @ d.T, np.array([where[p["text2"]] for p in positives]), ks)


def retrieval_metrics(scores: np.ndarray, gold: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Recall@k and MRR from a (Q, N) score matrix and the (Q,) index of each query's relevant document.

    Ties count against the query (rank = 1 + number of documents scoring at least as high, other than gold),
    so a constant scorer cannot look good.

    Example:
        >>> retrieval_metrics(np.array([[0.9, 0.1], [0.8, 0.2]]), np.array([0, 0]), ks=(1,))
        {'recall@1': 1.0, 'mrr': 1.0, 'queries': 2}
    """
    gold_scores = scores[np.arange(len(gold)), gold][:, None]  # (Q, 1)
    ranks = (scores >= gold_scores).sum(1)  # gold itself counts once: rank 1 = best
    out = {f"recall@{k}": float((ranks <= k).mean()) for k in ks}
    out["mrr"] = float((1.0 / ranks).mean())
    out["queries"] = int(len(gold))
    return out


def finetune_embedding(model, train, *, out: str | Path, eval: str | Path | Sequence[dict] | None = None,
                       loss: str = "mnrl", tokenizer=None, random_init: bool = False, pooling: str = "mean",
                       max_steps: int | None = None, epochs: int = 1, batch_size: int = 16, lr: float = 2e-5,
                       warmup: float = 0.1, seed: int = 0, max_length: int | None = None,
                       progress: bool = True) -> dict[str, Any]:
    """The ``lmforge finetune --task embedding`` recipe: load a body, train it as Sentence-BERT, save, evaluate.

    Args:
        model: lmforge model folder, Hugging Face folder or preset name (anything ``lmforge finetune --model``
            takes).
        train: rows / ``name:split`` / file for :func:`train_embedding` (e.g. ``"bible-triplets:train"``).
        out: run folder; the model goes to ``OUT/model`` (with ``embedding.json``) and the metrics to
            ``OUT/metrics.json``.
        eval: held-out ``text1, text2, label`` pairs (e.g. ``"bible-paraphrase:dev"``), scored before and after.
        loss, pooling, max_steps, epochs, batch_size, lr, warmup, seed: see :func:`train_embedding`.
        tokenizer, random_init: as for ``lmforge finetune``.

    Returns:
        ``{"before": eval metrics, "after": train_embedding's result}``.
    """
    from lmforge.tasks.finetune import load_body
    from lmforge.utils.io import atomic_write_text

    body, tok = load_body(model, tokenizer=tokenizer, random_init=random_init)
    encoder = SentenceEncoder(body, tok, max_length=max_length, pooling=pooling)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = read_rows(eval) if eval is not None else None
    before = {}
    if pairs is not None:
        before = {**evaluate_sts(encoder, pairs, pooling=pooling),
                  **evaluate_retrieval(encoder, pairs, pooling=pooling)}
    after = train_embedding(encoder, train, loss=loss, out=out / "model", pooling=pooling, epochs=epochs,
                            max_steps=max_steps, batch_size=batch_size, lr=lr, warmup=warmup, seed=seed,
                            eval_pairs=pairs, progress=progress)
    result = {"before": before, "after": after}
    atomic_write_text(out / "metrics.json", json.dumps(result, indent=2) + "\n")
    return result
