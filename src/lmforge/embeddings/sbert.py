"""Sentence-BERT fine-tuning and evaluation (Reimers & Gurevych 2019).

A siamese network: the *same* encoder embeds every side of a pair or triplet, the pooled vectors go into
one of the losses of :mod:`lmforge.embeddings.losses`, and the gradient reaches the Transformer through the
pooling. The rows a loss needs:

    loss     columns                                        shipped data
    triplet  anchor, positive, negative                     bible-triplets
    mnrl     anchor, positive [, negative]                  bible-triplets (the negative is a hard one)
             or text1, text2 with label >= 1 (positives)    bible-paraphrase
    cosine   text1, text2, label (target cosine, 0/1 here)  bible-paraphrase
    softmax  text1, text2, label (class index, e.g. NLI's)  bible-paraphrase (2 classes: paraphrase or not)

Training is the :class:`~lmforge.training.Trainer` with a loss: :class:`SentenceTuples` tokenises the S sides
of B tuples into (S, B, T) ids, and :class:`SiameseLoss` embeds them with the model and applies the loss, a
mean over the B tuples. The softmax loss also trains a classifier on (u, v, |u - v|): the Trainer then trains
:class:`PairClassifier` (the encoder and the classifier), and saves its encoder. So a run has checkpoints, exact
resume, bf16 autocast, gradient accumulation and AdamW without decay on biases, norms and embeddings, as every
lmforge run does.

Evaluation on held-out pairs:
    * :func:`evaluate_sts`: Spearman correlation of cos(text1, text2) with the label.
    * :func:`evaluate_retrieval`: each positive pair's text1 is a query; the corpus is every text2 of the set
      (the hard negatives included); recall@k and MRR of the paired text2.

Example (a sketch: a few minutes of training on two CPU cores)::

    from lmforge.embeddings import SentenceEncoder
    enc = SentenceEncoder.load("all-MiniLM-L6-v2")
    train_embedding(enc, "bible-triplets:train", loss="mnrl", out="runs/sbert", max_steps=200)
    evaluate_retrieval(enc, datasets.load("bible-paraphrase", "test"))
    # {'recall@1': ..., 'recall@5': ..., 'recall@10': ..., 'mrr': ..., 'queries': ...}
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from lmforge import checkpoint, datasets
from lmforge.embeddings.encoder import SentenceEncoder, hidden_states
from lmforge.embeddings.losses import EMBEDDING_LOSSES, SoftmaxClassifier, loss_function
from lmforge.embeddings.pooling import pool
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.tasks.data import ExampleBatches
from lmforge.training.config import TrainConfig
from lmforge.training.logging import METRICS_FILE, read_metrics
from lmforge.training.state import seed_all
from lmforge.training.trainer import LossOutput, Trainer
from lmforge.utils.io import atomic_write_text, make_folder, read_text_file

EMBEDDING_FILE = "embedding.json"  # pooling settings saved beside a trained model


def read_rows(source: str | Path | Sequence[dict]) -> list[dict[str, Any]]:
    """Rows from a list of dicts, a registry name ``"bible-triplets:train"`` or a TSV/JSONL file."""
    if not isinstance(source, (str, Path)):
        return list(source)
    text = str(source)
    name, _, split = text.partition(":")
    if name in datasets.names() and not Path(text).exists():
        return datasets.load(name, split or "train")
    file = Path(text)
    if not file.exists():
        raise InputFileNotFound(f"{file}: not found (give a TSV/JSONL file or a data set such as bible-triplets:train)")
    if file.suffix == ".jsonl":
        return [json.loads(line) for line in read_text_file(file).splitlines() if line.strip()]
    return datasets.read_tsv(file)


def loss_columns(rows: Sequence[dict], loss: str) -> list[tuple]:
    """The tuples a loss consumes: (a, p, n), (a, p[, n]) or (u, v, label). Raises on missing columns."""
    loss_function(loss)  # a bad name is named before the columns
    if not rows:
        raise UserInputError("no training rows")
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
    if loss == "softmax":
        return [(r["text1"], r["text2"], _class_index(r["label"])) for r in rows]
    return [(r["text1"], r["text2"], float(r["label"])) for r in rows]


def _class_index(label) -> int:
    value = float(label)
    if value < 0 or value != int(value):
        raise UserInputError(f"loss 'softmax' needs class indices 0, 1, ... in the label column (got {label!r})")
    return int(value)


def _need(keys: set, columns: tuple[str, ...], loss: str) -> None:
    missing = [c for c in columns if c not in keys]
    if missing:
        raise UserInputError(f"loss {loss!r} needs columns {', '.join(columns)}; missing {', '.join(missing)} "
                             f"(have {', '.join(sorted(keys))})")


class SentenceTuples:
    """The Trainer's batch transform for Sentence-BERT: B tuples -> their S sides tokenised together.

    Returns ``input_ids`` and ``attention_mask`` (S, B, T), padded to the longest text of any side, and for
    the cosine loss the target ``scores`` (B,), for the softmax loss the target ``classes`` (B,). Stateless: it
    draws no random numbers.
    """

    def __init__(self, tokenizer, loss: str, max_length: int) -> None:
        self.tokenizer, self.loss, self.max_length = tokenizer, loss, max_length

    def __call__(self, batch: Sequence[tuple]) -> dict[str, torch.Tensor]:
        columns = list(zip(*batch))
        texts = columns[:2] if self.loss in ("cosine", "softmax") else columns
        enc = self.tokenizer.encode_batch([t for side in texts for t in side], padding=True, truncation=True,
                                          max_length=self.max_length)
        shape = (len(texts), len(batch), -1)
        out = {k: torch.tensor(enc[k]).view(shape) for k in ("input_ids", "attention_mask")}  # (S, B, T)
        if self.loss == "cosine":
            out["scores"] = torch.tensor(columns[2], dtype=torch.float32)  # (B,)
        if self.loss == "softmax":
            out["classes"] = torch.tensor(columns[2], dtype=torch.long)  # (B,)
        return out


class PairClassifier(torch.nn.Module):
    """What the softmax loss trains: the encoder and SBERT's classifier on (u, v, |u - v|). A finished run
    saves the encoder (:attr:`saved_model`); the classifier only serves training."""

    def __init__(self, model: torch.nn.Module, num_labels: int) -> None:
        super().__init__()
        self.model = model
        self.classifier = SoftmaxClassifier(model.config.d_model, num_labels)

    @property
    def config(self):
        return self.model.config

    @property
    def saved_model(self) -> torch.nn.Module:
        return self.model


class SiameseLoss:
    """The Trainer's ``loss``: one encoder embeds every side of a tuple, then a loss of
    :mod:`lmforge.embeddings.losses` compares the pooled vectors; its mean is over the B tuples."""

    def __init__(self, loss: str, pooling: str) -> None:
        self.loss, self.pooling = loss_function(loss), pooling

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        S, B, T = batch["input_ids"].shape
        ids, mask = batch["input_ids"].view(S * B, T), batch["attention_mask"].view(S * B, T)
        encoder = model.model if isinstance(model, PairClassifier) else model
        # The losses compare cosines at a temperature of 1/20: fp32 keeps them apart under bf16 autocast.
        vectors = pool(hidden_states(encoder, ids, mask)[-1], mask, self.pooling).float().view(S, B, -1)
        extra = (batch["scores"],) if "scores" in batch else ()
        if "classes" in batch:
            extra = (batch["classes"], model.classifier)
        return LossOutput(self.loss(*vectors.unbind(0), *extra), B)

    def count_targets(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["input_ids"].size(1))


class _AtLeast:
    """Batches of at least ``rows`` rows from ``ExampleBatches`` (same position state). MNRL skips a lone
    pair: with no in-batch negative its loss is identically zero, and the step would only decay the weights."""

    def __init__(self, batches: ExampleBatches, rows: int) -> None:
        self.batches, self.rows = batches, rows

    def __iter__(self):
        return (b for b in self.batches if len(b) >= self.rows)

    def state_dict(self) -> dict[str, Any]:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state)


def train_embedding(encoder: SentenceEncoder, train: str | Path | Sequence[dict], *, loss: str = "mnrl",
                    out: str | Path | None = None, pooling: str = "mean", epochs: float = 1,
                    max_steps: int | None = None, batch_size: int = 16, lr: float = 2e-5, warmup: float = 0.1,
                    seed: int = 0, eval_pairs: str | Path | Sequence[dict] | None = None,
                    progress: bool = False, run: str | Path | None = None, **train_settings: Any) -> dict[str, Any]:
    """Fine-tune ``encoder`` in place as a Sentence-BERT model with the :class:`~lmforge.training.Trainer`;
    optionally save it and evaluate.

    The Trainer brings checkpoints and exact resume (``run``), bf16 autocast (``precision``), gradient
    accumulation (``grad_accum``) and AdamW without decay on biases, norms and embeddings. The learning rate
    warms up linearly over ``warmup`` of the steps, then decays linearly to 0.

    Args:
        encoder: the model + tokenizer to train (its ``model`` is updated in place).
        train: rows, a data set ``name:split`` or a file (see :func:`read_rows`).
        loss: one of :data:`~lmforge.embeddings.losses.EMBEDDING_LOSSES` (``mnrl``, ``triplet``, ``cosine``,
            ``softmax``: a classifier on (u, v, |u - v|) over the label's classes, trained with the encoder).
        out: folder to save the trained model (+ tokenizer + ``embedding.json``) into; None = ``RUN/model``
            when ``run`` is given, else don't save.
        pooling: pooling used for training and recorded for inference.
        epochs, max_steps: passes over the data (may be fractional); ``max_steps`` stops earlier.
        batch_size: tuples per micro-batch (for MNRL, also the number of candidates per anchor).
        lr, warmup: AdamW peak learning rate; warm-up as a share of the steps.
        seed: shuffling and dropout seed.
        eval_pairs: held-out ``text1, text2, label`` rows for :func:`evaluate_sts` and :func:`evaluate_retrieval`.
        progress: show a progress bar.
        run: the Trainer's run folder (``checkpoints/``, ``metrics.jsonl``, ``model/``); None = a temporary one.
        train_settings: further :class:`~lmforge.training.TrainConfig` settings, e.g. ``resume=True``,
            ``precision="bf16"``, ``grad_accum=2``, ``save_every=100``, ``device="cuda"``.

    Returns:
        ``{"steps", "loss" (mean of the last epoch's steps), "seconds", **eval metrics, "model_dir"}``, and
        ``"stopped_by"`` (SIGINT or SIGTERM) for a run stopped before its last step.
    """
    tuples = loss_columns(read_rows(train), loss)
    siamese = SiameseLoss(loss, pooling)
    rows = 2 if loss == "mnrl" else 1
    full, rest = divmod(len(tuples), batch_size)
    if full + (rest >= rows) == 0:
        raise UserInputError(f"loss {loss!r} needs at least {rows} training rows")
    per_epoch = math.ceil((full + (rest >= rows)) / int(train_settings.get("grad_accum", 1)))  # optimizer steps
    total = max(1, math.ceil(per_epoch * epochs))
    total = min(max_steps, total) if max_steps else total
    settings = {"max_steps": total, "batch_size": batch_size, "lr": lr, "schedule": "linear",
                "warmup": int(warmup * total), "weight_decay": 0.01, "grad_clip": 1.0, "seed": seed,
                "eval_every": 0, "save_every": 0, "progress": progress, "tensorboard": False,
                "device": "cuda" if encoder.device.type == "cuda" else "cpu", **train_settings}
    config = TrainConfig.from_dict(settings, source="train_embedding")
    info = {"pooling": pooling, "normalize": True, "loss": loss}
    files = {EMBEDDING_FILE: json.dumps(info, indent=2) + "\n"}
    started = time.time()
    with contextlib.ExitStack() as stack:
        folder = Path(run) if run is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        trained = encoder.model
        if loss == "softmax":
            trained = PairClassifier(encoder.model, max(2, 1 + max(t[2] for t in tuples)))
        trainer = Trainer(trained, SentenceTuples(encoder.tokenizer, loss, encoder.max_length),
                          _AtLeast(ExampleBatches(tuples, batch_size, seed=seed), rows), config, out=folder,
                          tokenizer=encoder.tokenizer, loss=siamese, model_files=files, job="embedding")
        fitted = trainer.fit()
        losses = [r["loss"] for r in read_metrics(folder / METRICS_FILE)]
    encoder.eval()
    last_epoch = losses[-((fitted.step - 1) % per_epoch + 1):] if losses else []
    result: dict[str, Any] = {"steps": fitted.step, "loss": float(np.mean(last_epoch)) if last_epoch else None,
                              "seconds": round(time.time() - started, 2), "summary": fitted.summary()}
    if fitted.model_dir is None:  # stopped by a signal, with a checkpoint to resume from
        return {**result, "stopped_by": fitted.stopped_by}
    if eval_pairs is not None:
        pairs = read_rows(eval_pairs)
        result.update(evaluate_sts(encoder, pairs, pooling=pooling))
        result.update(evaluate_retrieval(encoder, pairs, pooling=pooling))
    if out is not None and (run is None or Path(out) != fitted.model_dir):
        result["model_dir"] = str(checkpoint.save(encoder.model, out, tokenizer=encoder.tokenizer, extra_files=files))
    elif run is not None:
        result["model_dir"] = str(fitted.model_dir)
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
        raise UserInputError("retrieval evaluation needs pairs with label 1")
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
                       max_steps: int | None = None, epochs: float = 1, batch_size: int = 16, lr: float = 2e-5,
                       warmup: float = 0.1, seed: int = 0, max_length: int | None = None, progress: bool = True,
                       **train_settings: Any) -> dict[str, Any]:
    """The ``lmforge finetune --task embedding`` recipe: load a body, train it as Sentence-BERT, save, evaluate.

    Args:
        model: lmforge model folder, Hugging Face folder or preset name (anything ``lmforge finetune --model``
            takes).
        train: rows / ``name:split`` / file for :func:`train_embedding` (e.g. ``"bible-triplets:train"``).
        out: run folder: the Trainer's ``checkpoints/`` and ``metrics.jsonl``, the model in ``OUT/model`` (with
            ``embedding.json``) and the evaluation in ``OUT/metrics.json``.
        eval: held-out ``text1, text2, label`` pairs (e.g. ``"bible-paraphrase:dev"``), scored before and after.
        loss, pooling, max_steps, epochs, batch_size, lr, warmup, seed: see :func:`train_embedding`.
        tokenizer, random_init: as for ``lmforge finetune``.
        train_settings: further TrainConfig settings (``resume=True`` continues ``OUT`` from its last
            checkpoint; ``precision``, ``grad_accum``, ``save_every`` (default 500), ``device`` (default
            ``auto``), ...).

    Returns:
        ``{"before": eval metrics, "after": train_embedding's result}``.
    """
    seed_all(seed)  # a random initialisation must not differ between a run and its resumption
    body, tok = checkpoint.load_body(model, tokenizer=tokenizer, random_init=random_init)
    encoder = SentenceEncoder(body, tok, max_length=max_length, pooling=pooling)
    out = make_folder(out)
    pairs = read_rows(eval) if eval is not None else None
    before = {}
    if pairs is not None:
        before = {**evaluate_sts(encoder, pairs, pooling=pooling),
                  **evaluate_retrieval(encoder, pairs, pooling=pooling)}
    after = train_embedding(encoder, train, loss=loss, run=out, pooling=pooling, epochs=epochs,
                            max_steps=max_steps, batch_size=batch_size, lr=lr, warmup=warmup, seed=seed,
                            eval_pairs=pairs, progress=progress,
                            **{"device": "auto", "save_every": 500, **train_settings})  # as for the other tasks
    result = {"before": before, "after": after}
    if "stopped_by" not in after:
        atomic_write_text(out / "metrics.json", json.dumps(result, indent=2) + "\n")
    return result


def run_embedding_finetune(args) -> int:
    """``lmforge finetune --task embedding``: Sentence-BERT training from finetune's parsed flags; prints a
    one-line summary and returns the exit code.

    Reads ``model, train, out`` (required) and, when present, ``eval, loss, tokenizer, random_init, pooling,
    max_steps, epochs, batch_size, lr, warmup_ratio, seed, max_length, progress`` and any other TrainConfig
    setting (``resume``, ``precision``, ``grad_accum``, ``save_every``, ``device``, ...). Flags that were not
    given are absent attributes (finetune parses with ``argument_default=SUPPRESS``) or None.
    """
    def flag(name, default=None):
        value = getattr(args, name, None)
        return default if value is None else value

    for name in ("model", "train", "out"):
        if flag(name) is None:
            raise UserInputError(f"--task embedding needs --{name}")
    loss = flag("loss", "mnrl")
    if loss not in EMBEDDING_LOSSES:
        raise UserInputError(f"--loss {loss!r}: use one of {', '.join(EMBEDDING_LOSSES)}")
    recipe = ("max_steps", "batch_size", "lr", "seed", "progress")  # passed by name below
    settings = {k: v for k, v in vars(args).items()
                if k in TrainConfig.__dataclass_fields__ and k not in recipe and v is not None
                and k not in ("model", "tokenizer", "out")}
    result = finetune_embedding(
        flag("model"), flag("train"), out=flag("out"), eval=flag("eval"), loss=loss, tokenizer=flag("tokenizer"),
        random_init=bool(flag("random_init", False)), pooling=flag("pooling", "mean"),
        max_steps=flag("max_steps"), epochs=flag("epochs", 1), batch_size=flag("batch_size", 16),
        lr=flag("lr", 2e-5), warmup=flag("warmup_ratio", 0.1), seed=flag("seed", 0),
        max_length=flag("max_length"), progress=bool(flag("progress", True)), **settings)
    after = result["after"]
    if "stopped_by" in after:
        print(f"stopped by {after['stopped_by']} at step {after['steps']}; continue with the same command and "
              "--resume", file=sys.stderr)
        return 128 + int(getattr(signal, after["stopped_by"]))
    shown = {k: after[k] for k in ("spearman", "recall@1", "recall@10", "mrr") if after.get(k) is not None}
    print(f"done: {after['steps']} steps, loss {after['loss']:.4f}; " +
          ", ".join(f"{k} {v:.4f}" for k, v in shown.items()) + f"; model -> {after['model_dir']}")
    if after.get("summary"):
        print(after["summary"])
    return 0
