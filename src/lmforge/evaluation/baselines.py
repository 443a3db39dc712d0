"""Simple baselines beside the fine-tuned models: TF-IDF + logistic regression, an n-gram SVM, a BiLSTM, a CNN.

"Often not much better than simple baselines": the lectures compare pre-trained Transformers with linear models
on n-gram features and with BiLSTM/CNN classifiers on word vectors. Each baseline trains on any ``classify``
task (one text, or a pair) and writes a task folder that ``lmforge evaluate`` and ``predict`` read::

    name          model                                            trained by
    tfidf-logreg  TF-IDF uni+bigrams -> logistic regression        scikit-learn (lmforge.evaluation.linear_baselines)
    ngram-svm     binary uni+bigrams -> linear SVM                 scikit-learn
    bilstm        words -> BiLSTM -> max-pool -> linear            the Trainer (lmforge.evaluation.bilstm_classifier)
    cnn           words -> Kim (2014) CNN -> max-pool -> linear    the Trainer (lmforge.evaluation.cnn_classifier)

The other task types have their own (:mod:`lmforge.evaluation.task_baselines`): ``crf`` and ``bilstm-tagger``
(tag), ``tfidf-ridge`` (regress), ``qa-window`` (qa), ``tfidf-mc`` (multiple-choice), ``lead-3`` (seq2seq,
text2text); :func:`train_baseline`, :func:`evaluate` and :func:`predict` hand those to it.

A pair is read as one text, ``text  [SEP]  pair`` (the linear models see the words of both; the neural ones
read the ``[sep]`` word between them). The neural baselines read words (:mod:`lmforge.evaluation.word_vocab`),
from random or word2vec starting vectors (``vectors``).

Run folder ``OUT``: ``OUT/baseline.json`` (what was trained, on what, and its evaluation), ``OUT/model/`` (the
task folder: ``task.json`` with the spec and the baseline's settings, ``baseline.safetensors``, ``vocab.json``)
and, for the neural ones, the Trainer's checkpoints and ``metrics.jsonl``.

Example:
    >>> import tempfile
    >>> from lmforge.tasks.data import Table
    >>> rows = [{"text": t, "label": l} for t, l in [("good film", "1"), ("bad film", "0"), ("good", "1"),
    ...                                               ("bad", "0")]]
    >>> table = Table("toy", rows, ["text", "label"])
    >>> run = train_baseline("tfidf-logreg", TaskSpec(task="classify"), table, table, out=tempfile.mkdtemp())
    >>> run["eval"]["accuracy"]
    1.0
    >>> [r["prediction"] for r in predict(run["model_dir"], Table("new", [{"text": "so good"}], ["text"]))]
    ['1']
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from lmforge.errors import UserInputError
from lmforge.evaluation import linear_baselines
from lmforge.evaluation.baseline_common import (  # noqa: F401  (their home was here: old imports keep working)
    CLASSIFY_BASELINES,
    NEURAL_DEFAULTS,
    PAIR_SEPARATOR,
    BaselineOptions,
    Checkpointed,
    planned,
    texts_of,
)
from lmforge.evaluation.bilstm_classifier import BiLSTMClassifier
from lmforge.evaluation.cnn_classifier import CNNClassifier
from lmforge.evaluation.elmo_features import (
    FEATURES_KEY,
    ElmoFeatures,
    WithFeatures,
    cased_words,
    check_baseline,
    load_features,
)
from lmforge.evaluation.word_vocab import WordVocab
from lmforge.tasks import metrics
from lmforge.tasks.base import pad_batch, text_of
from lmforge.tasks.classification import label_text, sorted_labels
from lmforge.tasks.data import ExampleBatches, Table, TaskDataError, read_table
from lmforge.tasks.inference import check_prediction_columns, prediction_row, write_predictions
from lmforge.tasks.model import FORMAT, TASK_FILE, read_task_meta
from lmforge.tasks.spec import TaskSpec
from lmforge.training.config import TrainConfig
from lmforge.training.trainer import MODEL_DIR, Trainer, check_fresh_run
from lmforge.utils.io import atomic_dir, atomic_write_text

# Static, as LINEAR is: ``--baseline`` choices must not import scikit-learn or crfsuite (tests/test_cli_lazy.py).
TASK_BASELINES = ("crf", "bilstm-tagger", "tfidf-ridge", "qa-window", "tfidf-mc", "lead-3")
BASELINES = (*CLASSIFY_BASELINES, *TASK_BASELINES)
NEURAL = {"bilstm": BiLSTMClassifier, "cnn": CNNClassifier}
WEIGHTS_FILE, VOCAB_FILE, RUN_FILE = "baseline.safetensors", "vocab.json", "baseline.json"


# ------------------------------------------------------------------------------------------- data
def fits() -> dict[str, tuple[str, ...]]:
    """Each baseline and the task types it trains."""
    from lmforge.evaluation.task_baselines import all_fits

    return all_fits()


def check_spec(spec: TaskSpec, name: str = "tfidf-logreg") -> None:
    """Refuse in one line a baseline that does not train ``spec.task``, naming the ones that do."""
    from lmforge.evaluation.task_baselines import check_fits

    check_fits(name, spec)


def gold_ids(table: Table, spec: TaskSpec) -> list[int]:
    """Each row's label as its index in ``spec.labels``; an unknown label names the row."""
    col = spec.columns()["label"]
    table.require(col)
    index = {label: k for k, label in enumerate(spec.labels)}
    out = []
    for i in range(len(table)):
        label = label_text(text_of(table, i, col))
        if label not in index:
            raise TaskDataError(f"{table.where(i)}: label {label!r} does not occur in the training data "
                                f"(labels: {', '.join(spec.labels)})")
        out.append(index[label])
    return out


def _table(data) -> Table:
    return data if isinstance(data, Table) else read_table(data)


# ------------------------------------------------------------------------------------------- the models
class Baseline:
    """A trained baseline: ``name``, ``spec``, and per-class probabilities (or SVM scores) of texts."""

    def __init__(self, name: str, spec: TaskSpec, options: BaselineOptions, pipe=None, module=None,
                 vocab: WordVocab | None = None) -> None:
        self.name, self.spec, self.options = name, spec, options
        self.pipe, self.module, self.vocab = pipe, module, vocab

    @property
    def probabilistic(self) -> bool:
        return self.name != "ngram-svm"

    @property
    def elmo(self) -> ElmoFeatures | None:
        """The frozen biLM's features the module reads (``--features elmo=``), or None."""
        return self.module.elmo if isinstance(self.module, WithFeatures) else None

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [self.vocab.encode(t)[:self.options.max_words] or [1] for t in texts]  # an empty text reads <unk>

    def inputs(self, texts: list[str]) -> list[dict[str, Any]]:
        """Each text's model inputs: ``input_ids`` (+ the biLM's pieces of the same words, with ELMo)."""
        out = [{"input_ids": ids} for ids in self.encode(texts)]
        if self.elmo is not None:
            for example, text in zip(out, texts):
                example.update(self.elmo.pieces(cased_words(text)[:self.options.max_words]))
        return out

    def collate(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """A batch of :meth:`inputs` (``gold`` labels, when the examples have them, as ``labels``)."""
        batch = {"input_ids": pad_batch([e["input_ids"] for e in examples], 0)[0]}
        if "gold" in examples[0]:
            batch["labels"] = torch.tensor([e["gold"] for e in examples], dtype=torch.long)
        if self.elmo is not None:
            batch.update(self.elmo.collate(examples))
        return batch

    @torch.no_grad()
    def scores(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        """(N, C) class probabilities (SVM: decision values), columns in ``spec.labels`` order."""
        n_labels = len(self.spec.labels)
        out = np.full((len(texts), n_labels), -np.inf if not self.probabilistic else 0.0)
        if self.pipe is not None:
            if self.probabilistic:
                values = self.pipe.predict_proba(texts)
            else:
                values = self.pipe.decision_function(texts)
                values = np.stack([-values, values], 1) if values.ndim == 1 else values
            out[:, self.pipe.named_steps["classifier"].classes_] = values  # classes never trained on stay 0/-inf
            return out
        self.module.eval()
        examples = self.inputs(texts)
        for start in range(0, len(examples), batch_size):
            batch = self.collate(examples[start:start + batch_size])
            out[start:start + batch_size] = torch.softmax(self.module(**batch).logits.float(), -1).numpy()
        return out


def _neural(name: str, n_labels: int, vocab_size: int, options: BaselineOptions, elmo: ElmoFeatures | None = None):
    if name == "bilstm":
        module = BiLSTMClassifier(vocab_size, n_labels, options.embed_dim, options.hidden, dropout=options.dropout,
                                  feature_dim=elmo.dim if elmo is not None else 0)
        return module if elmo is None else WithFeatures(module, elmo)
    return CNNClassifier(vocab_size, n_labels, options.embed_dim, options.filters, dropout=options.dropout)


def save_baseline(baseline: Baseline, path: str | Path, extra: dict | None = None) -> Path:
    """Write the task folder of a baseline atomically (module docstring)."""
    if baseline.pipe is not None:
        tensors, vocabulary = linear_baselines.to_state(baseline.pipe)
    else:
        tensors = {k: v.detach().contiguous().cpu() for k, v in baseline.module.state_dict().items()}
        vocabulary = baseline.vocab.words
    meta = {"format": FORMAT, "version": 1, "spec": baseline.spec.to_dict(),
            "baseline": {"name": baseline.name, "options": asdict(baseline.options)}, **(extra or {})}
    if baseline.module is not None and baseline.elmo is not None:  # the biLM's folder and digests, not its weights
        meta[FEATURES_KEY] = {"elmo": baseline.elmo.record()}
    with atomic_dir(path) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / VOCAB_FILE).write_text(json.dumps(vocabulary, ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / TASK_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return Path(path)


def is_baseline(path: str | Path) -> bool:
    """Whether ``path`` is a baseline's task folder."""
    meta = read_task_meta(path) if Path(path).is_dir() else None
    return bool(meta and "baseline" in meta)


def _name_of(path: str | Path) -> str | None:
    meta = read_task_meta(path) if Path(path).is_dir() else None
    return (meta or {}).get("baseline", {}).get("name")


def load_baseline(path: str | Path) -> Baseline:
    """The baseline saved in task folder ``path``."""
    meta = read_task_meta(path)
    if not meta or "baseline" not in meta:
        raise UserInputError(f"{path}: not a baseline's task folder (no baseline entry in {TASK_FILE})")
    spec = TaskSpec.from_dict(meta["spec"], source=str(Path(path) / TASK_FILE))
    name, options = meta["baseline"]["name"], BaselineOptions(**meta["baseline"]["options"])
    tensors = load_file(str(Path(path) / WEIGHTS_FILE))
    vocabulary = json.loads((Path(path) / VOCAB_FILE).read_text(encoding="utf-8"))
    if name in linear_baselines.LINEAR:
        return Baseline(name, spec, options, pipe=linear_baselines.from_state(name, tensors, vocabulary, options.C))
    vocab = WordVocab(vocabulary)
    module = _neural(name, len(spec.labels), len(vocab), options, load_features(meta, Path(path) / TASK_FILE))
    module.load_state_dict(tensors)
    return Baseline(name, spec, options, module=module, vocab=vocab)


class BaselineTrainer(Trainer):
    """The Trainer, checkpointing the baseline's tensors and writing its task folder as ``OUT/model``."""

    def __init__(self, baseline: Baseline, *args, **kwargs) -> None:
        super().__init__(baseline.module, *args, **kwargs)
        self.baseline = baseline

    def checkpoint_module(self):
        b = self.baseline
        return Checkpointed(b.module, b.name, b.options, b.spec.labels)

    def save_model(self) -> Path:
        return save_baseline(self.baseline, self.out / MODEL_DIR)


# ------------------------------------------------------------------------------------------- train, score
def train_baseline(name: str, spec: TaskSpec, train, eval=None, *, out: str | Path, config: TrainConfig | None = None,
                   options: BaselineOptions | None = None, epochs: float | None = None, log=None,
                   features: dict[str, str] | None = None) -> dict[str, Any]:
    """Train baseline ``name`` on ``train`` (a file, ``NAME:SPLIT`` or a Table), score it on ``eval``, write ``out``.

    ``config``: the Trainer's settings for the neural baselines (steps, batch size, lr, seed); the linear ones
    read only its ``seed``. ``epochs``: set the neural baselines' ``max_steps`` to this many passes over ``train``. Returns ``{"model_dir", "eval", "counts"}`` (also written to ``OUT/baseline.json``).
    ``features``: ``{"elmo": BILM_DIR}`` feeds a frozen biLM's scalar-mixed layers into ``bilstm`` and
    ``bilstm-tagger`` beside their word embeddings (:mod:`lmforge.evaluation.elmo_features`).
    """
    if name not in BASELINES:
        raise UserInputError(f"unknown baseline {name!r}; choose one of {', '.join(BASELINES)}")
    check_spec(spec, name)
    check_baseline(features, name)
    elmo = ElmoFeatures.from_folder(features["elmo"]) if features and "elmo" in features else None
    if name in TASK_BASELINES:
        from lmforge.evaluation import task_baselines

        if (Path(out) / MODEL_DIR).exists():
            raise UserInputError(f"{out} already holds a trained model ({Path(out) / MODEL_DIR}); choose another --out")
        check_fresh_run(Path(out), False)
        return task_baselines.train(name, spec, _table(train), _table(eval) if eval is not None else None, out=out,
                                    config=config, options=options, epochs=epochs, log=log, elmo=elmo)
    config = config or TrainConfig(**{**NEURAL_DEFAULTS, "progress": False, "tensorboard": False})
    options = options or BaselineOptions()
    out = Path(out)
    check_fresh_run(out, config.resume)
    if (out / MODEL_DIR).exists() and not config.resume:
        raise UserInputError(f"{out} already holds a trained model ({out / MODEL_DIR}); choose another --out")
    train_table = _table(train)
    eval_table = _table(eval) if eval is not None else None
    texts = texts_of(train_table, spec)
    if not spec.labels:
        spec = spec.replace(labels=sorted_labels(label_text(text_of(train_table, i, spec.columns()["label"]))
                                                 for i in range(len(train_table))))
    gold = gold_ids(train_table, spec)
    if eval_table is not None:  # fail on bad evaluation rows now, not after training
        eval_texts, eval_gold = texts_of(eval_table, spec), gold_ids(eval_table, spec)
    if name in linear_baselines.LINEAR:
        pipe = linear_baselines.pipeline(name, options.C, config.seed).fit(texts, gold)
        baseline = Baseline(name, spec, options, pipe=pipe)
        save_baseline(baseline, out / MODEL_DIR)
    else:
        torch.manual_seed(config.seed)
        vocab = WordVocab.build(texts, options.min_count)
        module = _neural(name, len(spec.labels), len(vocab), options, elmo)
        with torch.no_grad():
            module.embed.weight.copy_(vocab.vectors(options.vectors, options.embed_dim, texts, config.seed))
        baseline = Baseline(name, spec, options, module=module, vocab=vocab)
        examples = [{**x, "gold": g} for x, g in zip(baseline.inputs(texts), gold)]
        eval_examples = None if eval_table is None else [
            {**x, "gold": g} for x, g in zip(baseline.inputs(eval_texts), eval_gold)]
        config = planned(config, epochs, len(examples), None if eval_examples is None else len(eval_examples))
        eval_batches = None if eval_examples is None else ExampleBatches(eval_examples, config.batch_size,
                                                                         shuffle=False)
        if log:
            log(f"{name}: {len(vocab)} words, {sum(p.numel() for p in module.parameters()) / 1e6:.2f}M parameters "
                f"| {len(examples)} train examples | {config.max_steps} steps x {config.batch_size} | lr {config.lr:g}"
                + (f" | ELMo from {elmo.source['path']} (frozen; {elmo.dim} wide)" if elmo is not None else ""))
        BaselineTrainer(baseline, baseline.collate, ExampleBatches(examples, config.batch_size, seed=config.seed),
                        config, out=out, eval_data=eval_batches).fit()
    result = {"baseline": name, "options": asdict(options), "seed": config.seed, "model_dir": str(out / MODEL_DIR),
              "train": train_table.path, "eval": None, "counts": {"train": len(train_table)}}
    if elmo is not None:
        result[FEATURES_KEY] = {"elmo": elmo.source["path"]}
    if eval_table is not None:
        result["eval"] = evaluate(out / MODEL_DIR, eval_table)
        result["eval_data"] = eval_table.path
    atomic_write_text(out / RUN_FILE, json.dumps(result, indent=2) + "\n")
    return result


def _labelled(baseline: Baseline, table: Table) -> tuple[np.ndarray, list[int]]:
    return baseline.scores(texts_of(table, baseline.spec)), gold_ids(table, baseline.spec)


def evaluate(path: str | Path, data, limit: int | None = None) -> dict[str, float]:
    """``{"loss" (probabilistic baselines), accuracy, f1_macro, f1_micro, mcc, "examples"}`` of a baseline's
    folder on labelled data."""
    table = _table(data)
    if limit is not None:
        table = table.head(limit)
    if _name_of(path) in TASK_BASELINES:
        from lmforge.evaluation import task_baselines

        return task_baselines.evaluate(path, table)
    baseline = load_baseline(path)
    scores, gold = _labelled(baseline, table)
    labels = baseline.spec.labels
    pred = [labels[k] for k in scores.argmax(1)]
    out = metrics.classification([labels[g] for g in gold], pred, labels=labels)
    if baseline.probabilistic:
        out = {"loss": float(-np.mean(np.log(np.maximum(scores[np.arange(len(gold)), gold], 1e-12)))), **out}
    return {**out, "examples": len(table)}


def predict(path: str | Path, data, output: str | Path | None = None) -> list[dict[str, Any]]:
    """One prediction per row (the input columns, ``prediction``, and ``prediction_probabilities`` or SVM
    ``prediction_scores``), as :func:`lmforge.tasks.inference.predict` writes them, to ``output`` (.jsonl, .tsv,
    .csv) when given."""
    if _name_of(path) in TASK_BASELINES:
        from lmforge.evaluation import task_baselines

        return task_baselines.predict(path, _table(data), output)
    baseline, table = load_baseline(path), _table(data)
    check_prediction_columns(table)
    scores = baseline.scores(texts_of(table, baseline.spec))
    labels = baseline.spec.labels
    key = "probabilities" if baseline.probabilistic else "scores"
    rows = [prediction_row(table.rows[i], table.columns,
                           {"label": labels[int(values.argmax())],
                            key: {label: round(float(v), 6) for label, v in zip(labels, values)}})
            for i, values in enumerate(scores)]
    if output is not None:
        write_predictions(rows, output)
    return rows
