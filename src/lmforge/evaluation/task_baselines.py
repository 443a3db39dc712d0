"""The baselines of the tasks other than ``classify``: tagging, regression, extractive QA, multiple choice, seq2seq.

    name           task(s)              model                                                   module
    crf            tag                  linear-chain CRF on word features (sklearn-crfsuite)    crf_tagger
    bilstm-tagger  tag                  words -> BiLSTM -> linear per word (the Trainer)        bilstm_tagger
    tfidf-ridge    regress              TF-IDF uni+bigrams -> ridge regression (scikit-learn)   ridge_baseline
    qa-window      qa                   sliding-window lexical overlap, nothing learned         qa_window
    tfidf-mc       multiple-choice      the choice most TF-IDF-similar to the context           mc_similarity
    lead-3         seq2seq, text2text   the source's first ``lead`` (3) sentences               lead_n

They write the same task folder as the classification baselines (:mod:`lmforge.evaluation.baselines`):
``task.json`` with the spec and ``{"baseline": {"name", "options"}}``, ``baseline.safetensors`` (empty for
the two that learn nothing), ``vocab.json``, and crfsuite's model file for ``crf``; ``lmforge evaluate`` scores
them with their task's metrics (entity F1; Pearson/Spearman/MSE; SQuAD EM/F1; accuracy; BLEU/chrF/ROUGE) and
``lmforge predict`` writes the predictions the fine-tuned models write (``tags``, ``score``, ``answer``,
``label``, ``output``).

Example:
    >>> import tempfile
    >>> from lmforge.tasks.data import Table
    >>> rows = [{"source": "One. Two. Three. Four.", "target": "One. Two. Three."}]
    >>> run = train("lead-3", TaskSpec(task="seq2seq"), Table("toy", rows, ["source", "target"]), None,
    ...             out=tempfile.mkdtemp())
    >>> [r["prediction"] for r in predict(run["model_dir"], Table("new", [{"source": "A. B. C. D."}], ["source"]))]
    ['A. B. C.']
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from lmforge.errors import UserInputError
from lmforge.evaluation import crf_tagger, lead_n, mc_similarity, qa_window, ridge_baseline
from lmforge.evaluation.baseline_common import (
    CLASSIFY_BASELINES,
    NEURAL_DEFAULTS,
    BaselineOptions,
    Checkpointed,
    planned,
    texts_of,
)
from lmforge.evaluation.bilstm_tagger import IGNORE, BiLSTMTagger
from lmforge.evaluation.elmo_features import FEATURES_KEY, ElmoFeatures, WithFeatures, load_features
from lmforge.evaluation.word_vocab import PAD, UNK, WordVocab
from lmforge.tasks import metrics
from lmforge.tasks.base import pad_batch, text_of
from lmforge.tasks.data import ExampleBatches, Table, TaskDataError
from lmforge.tasks.inference import check_prediction_columns, prediction_row, write_predictions
from lmforge.tasks.model import FORMAT, TASK_FILE, read_task_meta
from lmforge.tasks.multiple_choice import MultipleChoiceTask
from lmforge.tasks.qa import QATask
from lmforge.tasks.spec import TaskSpec
from lmforge.tasks.tagging import TagTask
from lmforge.training.config import TrainConfig
from lmforge.training.trainer import MODEL_DIR, Trainer
from lmforge.utils.io import atomic_dir, atomic_write_text

FITS = {"crf": ("tag",), "bilstm-tagger": ("tag",), "tfidf-ridge": ("regress",), "qa-window": ("qa",),
        "tfidf-mc": ("multiple-choice",), "lead-3": ("seq2seq", "text2text")}
WEIGHTS_FILE, VOCAB_FILE, RUN_FILE = "baseline.safetensors", "vocab.json", "baseline.json"


# ------------------------------------------------------------------------------------------- reading rows
def _reader(cls, spec: TaskSpec):
    """A task object used only for its row readers (``_words``, ``_answers``, ``_choices``), which read the
    spec's columns and need no tokenizer or model: the baselines then accept and refuse rows as fine-tuning does."""
    reader = cls.__new__(cls)
    reader.spec, reader.columns = spec, spec.columns()
    return reader


def _tag_rows(table: Table, spec: TaskSpec, labelled: bool) -> tuple[list[list[str]], list[list[str]] | None]:
    r = _reader(TagTask, spec)
    table.require(r.columns["text"], r.columns["label"] if labelled else None)
    words = [r._words(table, i, r.columns["text"]) for i in range(len(table))]
    if not labelled:
        return words, None
    tags = [r._words(table, i, r.columns["label"]) for i in range(len(table))]
    for i, (w, t) in enumerate(zip(words, tags)):
        if len(w) != len(t):
            raise TaskDataError(f"{table.where(i)}: {len(w)} words but {len(t)} tags")
    return words, tags


def _texts(table: Table, spec: TaskSpec) -> list[str]:
    return texts_of(table, spec)  # as the classification baselines read a text (+ pair)


def _numbers(table: Table, spec: TaskSpec) -> list[float]:
    col = spec.columns()["label"]
    table.require(col)
    out = []
    for i in range(len(table)):
        try:
            out.append(float(text_of(table, i, col)))
        except ValueError:
            raise TaskDataError(f"{table.where(i)}: column {col!r} holds {text_of(table, i, col)!r}, not a number") \
                from None
    return out


def _qa_rows(table: Table, spec: TaskSpec, labelled: bool):
    r = _reader(QATask, spec)
    table.require(r.columns["text"], r.columns["text_pair"], r.columns["target"] if labelled else None)
    questions = [text_of(table, i, r.columns["text"]) for i in range(len(table))]
    contexts = [text_of(table, i, r.columns["text_pair"]) for i in range(len(table))]
    golds = [[a for a, _ in r._answers(table, i, contexts[i])] for i in range(len(table))] if labelled else None
    return questions, contexts, golds


def _mc_rows(table: Table, spec: TaskSpec, labelled: bool):
    r = _reader(MultipleChoiceTask, spec)
    r.check_columns(table, labelled)
    columns = r._choice_columns(table)
    contexts = [text_of(table, i, r.columns["text"]) for i in range(len(table))]
    choices = [r._choices(table, i, columns) for i in range(len(table))]
    for i, row in enumerate(choices):
        if len(row) != len(choices[0]):
            raise TaskDataError(f"{table.where(i)}: {len(row)} choices, but row 1 has {len(choices[0])}")
    if not labelled:
        return contexts, choices, None
    gold = []
    for i in range(len(table)):
        raw = text_of(table, i, r.columns["label"])
        try:
            g = int(float(raw))
        except ValueError:
            g = -1
        if not 0 <= g < len(choices[i]):
            raise TaskDataError(f"{table.where(i)}: label {raw!r} is not a choice index (0 to {len(choices[i]) - 1})")
        gold.append(g)
    return contexts, choices, gold


def _seq_rows(table: Table, spec: TaskSpec, labelled: bool):
    cols = spec.columns()
    table.require(cols["text"], cols.get("target") if labelled else None)
    sources = [text_of(table, i, cols["text"]) for i in range(len(table))]
    return sources, [text_of(table, i, cols["target"]) for i in range(len(table))] if labelled else None


# ------------------------------------------------------------------------------------------- the folder
def _save(path: Path, name: str, spec: TaskSpec, options, tensors: dict, vocabulary, files: dict | None = None,
          extra: dict | None = None):
    meta = {"format": FORMAT, "version": 1, "spec": spec.to_dict(),
            "baseline": {"name": name, "options": asdict(options)}, **(extra or {})}
    with atomic_dir(path) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / VOCAB_FILE).write_text(json.dumps(vocabulary, ensure_ascii=False) + "\n", encoding="utf-8")
        for filename, data in (files or {}).items():
            (tmp / filename).write_bytes(data)
        (tmp / TASK_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return path


class Loaded:
    """A saved task baseline: ``name``, ``spec``, ``options`` and what it predicts with (``model``)."""

    def __init__(self, path: str | Path) -> None:
        meta = read_task_meta(path)
        self.path = Path(path)
        self.spec = TaskSpec.from_dict(meta["spec"], source=str(self.path / TASK_FILE))
        self.name, self.options = meta["baseline"]["name"], BaselineOptions(**meta["baseline"]["options"])
        tensors = load_file(str(self.path / WEIGHTS_FILE))
        vocabulary = json.loads((self.path / VOCAB_FILE).read_text(encoding="utf-8"))
        if self.name == "crf":
            self.model = crf_tagger.load(self.path)
        elif self.name == "bilstm-tagger":
            self.vocab = WordVocab(vocabulary)
            self.elmo = load_features(meta, self.path / TASK_FILE)
            self.model = _tagger_module(len(self.vocab), len(self.spec.labels), self.options, self.elmo)
            self.model.load_state_dict(tensors)
            self.model.eval()
        elif self.name == "tfidf-ridge":
            self.model = ridge_baseline.from_state(tensors, vocabulary, self.options.alpha)
        elif self.name == "tfidf-mc":
            self.model = mc_similarity.from_state(tensors, vocabulary)
        else:
            self.model = None

    def predictions(self, table: Table) -> list[dict[str, Any]]:
        """The prediction payload of each row (the keys the fine-tuned task models predict)."""
        spec, o = self.spec, self.options
        if self.name == "crf":
            return [{"tags": t} for t in crf_tagger.predict(self.model, _tag_rows(table, spec, False)[0])]
        if self.name == "bilstm-tagger":
            return [{"tags": t} for t in self._tag(_tag_rows(table, spec, False)[0])]
        if self.name == "tfidf-ridge":
            return [{"score": round(float(v), 6)} for v in self.model.predict(_texts(table, spec))]
        if self.name == "qa-window":
            questions, contexts, _ = _qa_rows(table, spec, False)
            out = []
            for q, c in zip(questions, contexts):
                text, start, end = qa_window.answer(q, c, o.window, o.max_answer_words)
                out.append({"answer": text, "start": start, "end": end})
            return out
        if self.name == "tfidf-mc":
            contexts, choices, _ = _mc_rows(table, spec, False)
            sims = mc_similarity.similarities(self.model, contexts, choices)
            return [{"label": int(s.argmax()), "scores": [round(float(v), 6) for v in s]} for s in sims]
        sources, _ = _seq_rows(table, spec, False)
        return [{"output": lead_n.lead(s, o.lead)} for s in sources]

    @torch.no_grad()
    def _tag(self, sentences: list[list[str]], batch_size: int = 256) -> list[list[str]]:
        out = []
        for start in range(0, len(sentences), batch_size):
            chunk = sentences[start:start + batch_size]
            batch = _collate_tags([_tag_example(self.vocab, s, self.elmo) for s in chunk], self.elmo)
            best = self.model(**batch).logits.argmax(-1)  # (B, T)
            out += [[self.spec.labels[int(k)] for k in best[b, :len(s)]] for b, s in enumerate(chunk)]
        return out

    def scores(self, table: Table) -> dict[str, float]:
        spec = self.spec
        if spec.task == "tag":
            gold = _tag_rows(table, spec, True)[1]
            return metrics.entity_f1(gold, [p["tags"] for p in self.predictions(table)])
        if spec.task == "regress":
            return metrics.correlations(_numbers(table, spec), [p["score"] for p in self.predictions(table)])
        if spec.task == "qa":
            return metrics.qa([p["answer"] for p in self.predictions(table)], _qa_rows(table, spec, True)[2])
        if spec.task == "multiple-choice":
            gold = _mc_rows(table, spec, True)[2]
            return {"accuracy": metrics.accuracy(gold, [p["label"] for p in self.predictions(table)])}
        refs = _seq_rows(table, spec, True)[1]
        return metrics.generation([p["output"] for p in self.predictions(table)], refs)


def _tag_ids(vocab: WordVocab, words: list[str]) -> list[int]:
    return [vocab.index.get(w.lower(), 1) for w in words] or [1]


def _tagger_module(vocab_size: int, n_tags: int, options, elmo: ElmoFeatures | None = None):
    module = BiLSTMTagger(vocab_size, n_tags, options.embed_dim, options.hidden, dropout=options.dropout,
                          feature_dim=elmo.dim if elmo is not None else 0)
    return module if elmo is None else WithFeatures(module, elmo)


def _tag_example(vocab: WordVocab, words: list[str], elmo: ElmoFeatures | None) -> dict[str, Any]:
    """A sentence's inputs: word ids (+ the biLM's pieces of the same words, in their case, with ELMo)."""
    return {"input_ids": _tag_ids(vocab, words), **(elmo.pieces(words) if elmo is not None else {})}


def _collate_tags(examples: list[dict[str, Any]], elmo: ElmoFeatures | None = None) -> dict[str, torch.Tensor]:
    batch = {"input_ids": pad_batch([e["input_ids"] for e in examples], 0)[0]}
    if "labels" in examples[0]:
        batch["labels"] = pad_batch([e["labels"] for e in examples], IGNORE)[0]
    if elmo is not None:
        batch.update(elmo.collate(examples))
    return batch


# ------------------------------------------------------------------------------------------- train, score
def all_fits() -> dict[str, tuple[str, ...]]:
    """Every baseline (classification's too) and the task types it trains."""
    return {**{name: ("classify",) for name in CLASSIFY_BASELINES}, **FITS}


def check_fits(name: str, spec: TaskSpec) -> None:
    """Refuse, in one line naming the baselines that do fit, a baseline that does not train ``spec.task``."""
    fits = all_fits()
    if spec.task not in fits.get(name, ("classify",)):
        fitting = [b for b, tasks in fits.items() if spec.task in tasks]
        raise UserInputError(f"--baseline {name} does not train --task {spec.task}; "
                             + (f"for {spec.task} choose: {', '.join(fitting)}" if fitting
                                else f"no baseline trains {spec.task} (baselines: {', '.join(fits)})"))


class TaggerTrainer(Trainer):
    """The Trainer, checkpointing the BiLSTM tagger's tensors and writing its task folder as ``OUT/model``."""

    def __init__(self, module, name: str, spec: TaskSpec, options, vocab: WordVocab, *args, **kwargs) -> None:
        super().__init__(module, *args, **kwargs)
        self.tagger, self.name, self.spec, self.options, self.vocab = module, name, spec, options, vocab
        # the biLM's folder and digests (its weights stay there), for a task folder that reads ELMo features
        self.extra = {FEATURES_KEY: {"elmo": module.elmo.record()}} if isinstance(module, WithFeatures) else None

    def checkpoint_module(self):
        return Checkpointed(self.tagger, self.name, self.options, self.spec.labels)

    def save_model(self) -> Path:
        state = {k: v.detach().contiguous().cpu() for k, v in self.tagger.state_dict().items()}
        return _save(self.out / MODEL_DIR, self.name, self.spec, self.options, state, self.vocab.words,
                     extra=self.extra)


def train(name: str, spec: TaskSpec, train_table: Table, eval_table: Table | None, *, out: str | Path,
          config=None, options=None, epochs: float | None = None, log=None,
          elmo: ElmoFeatures | None = None) -> dict[str, Any]:
    """Train (or, for qa-window and lead-3, only set up) baseline ``name``; write ``out`` as
    :func:`lmforge.evaluation.baselines.train_baseline` does. ``elmo``: frozen biLM features for
    ``bilstm-tagger`` (:mod:`lmforge.evaluation.elmo_features`)."""
    check_fits(name, spec)
    config = config or TrainConfig(**{**NEURAL_DEFAULTS, "progress": False, "tensorboard": False})
    options = options or BaselineOptions()
    out = Path(out)
    model_dir = out / MODEL_DIR
    if eval_table is not None:  # bad evaluation rows fail now, not after training
        _check_labelled(eval_table, spec)
    if spec.task == "tag":
        words, tags = _tag_rows(train_table, spec, True)
        if not spec.labels:  # the tag set in fine-tuning's order ("O" first)
            spec = spec.replace(labels=_reader(TagTask, spec).label_set(train_table))
    if name == "crf":
        data = crf_tagger.fit(words, tags, options.c1, options.c2, options.max_iterations)
        _save(model_dir, name, spec, options, {}, [], {crf_tagger.MODEL_FILE: data})
    elif name == "bilstm-tagger":
        torch.manual_seed(config.seed)
        counts = Counter(w.lower() for row in words for w in row)
        kept = sorted((w for w, c in counts.items() if c >= options.min_count), key=lambda w: (-counts[w], w))
        vocab = WordVocab([PAD, UNK, *kept])
        module = _tagger_module(len(vocab), len(spec.labels), options, elmo)
        with torch.no_grad():
            module.embed.weight.copy_(vocab.vectors(options.vectors, options.embed_dim, [" ".join(r) for r in words],
                                                    config.seed))
        index = {t: k for k, t in enumerate(spec.labels)}

        def examples(ws, ts):
            # A tag the training data lacks cannot be predicted; it is scored as wrong, not trained on.
            return [{**_tag_example(vocab, w, elmo), "labels": [index.get(t, IGNORE) for t in tg]}
                    for w, tg in zip(ws, ts)]

        train_examples = examples(words, tags)
        eval_examples = examples(*_tag_rows(eval_table, spec, True)) if eval_table is not None else None
        config = planned(config, epochs, len(train_examples), None if eval_examples is None else len(eval_examples))
        eval_batches = None if eval_examples is None else ExampleBatches(eval_examples, config.batch_size,
                                                                         shuffle=False)
        if log:
            log(f"{name}: {len(vocab)} words, {sum(p.numel() for p in module.parameters()) / 1e6:.2f}M parameters "
                f"| {len(train_examples)} train sentences | {config.max_steps} steps x {config.batch_size} "
                f"| lr {config.lr:g}" + (f" | ELMo from {elmo.source['path']} (frozen)" if elmo is not None else ""))
        TaggerTrainer(module, name, spec, options, vocab, partial(_collate_tags, elmo=elmo),
                      ExampleBatches(train_examples, config.batch_size, seed=config.seed), config, out=out,
                      eval_data=eval_batches).fit()
    elif name == "tfidf-ridge":
        pipe = ridge_baseline.pipeline(options.alpha).fit(_texts(train_table, spec), _numbers(train_table, spec))
        _save(model_dir, name, spec, options, *ridge_baseline.to_state(pipe))
    elif name == "tfidf-mc":
        contexts, choices, _ = _mc_rows(train_table, spec, False)
        v = mc_similarity.fit(contexts + [a for row in choices for a in row])
        _save(model_dir, name, spec, options, *mc_similarity.to_state(v))
    else:  # qa-window, lead-3: nothing to learn; the training rows are only checked
        _check_labelled(train_table, spec)
        _save(model_dir, name, spec, options, {}, [])
    result = {"baseline": name, "options": asdict(options), "seed": config.seed, "model_dir": str(model_dir),
              "train": train_table.path, "eval": None, "counts": {"train": len(train_table)}}
    if elmo is not None:
        result[FEATURES_KEY] = {"elmo": elmo.source["path"]}
    if eval_table is not None:
        result["eval"] = evaluate(model_dir, eval_table)
        result["eval_data"] = eval_table.path
    atomic_write_text(out / RUN_FILE, json.dumps(result, indent=2) + "\n")
    return result


def _check_labelled(table: Table, spec: TaskSpec) -> None:
    """Read every labelled row of ``table`` as scoring will, so that a bad row fails before training."""
    if spec.task == "tag":
        _tag_rows(table, spec, True)
    elif spec.task == "regress":
        _texts(table, spec)
        _numbers(table, spec)
    elif spec.task == "qa":
        _qa_rows(table, spec, True)
    elif spec.task == "multiple-choice":
        _mc_rows(table, spec, True)
    else:
        _seq_rows(table, spec, True)


def evaluate(path: str | Path, table: Table) -> dict[str, float]:
    """The task's scores of the baseline in ``path`` on labelled rows, and ``examples``."""
    return {**Loaded(path).scores(table), "examples": len(table)}


def predict(path: str | Path, table: Table, output: str | Path | None = None) -> list[dict[str, Any]]:
    """One row per input (its columns, ``prediction`` and ``prediction_<key>``), written to ``output`` if given."""
    check_prediction_columns(table)
    loaded = Loaded(path)
    rows = [prediction_row(table.rows[i], table.columns, p) for i, p in enumerate(loaded.predictions(table))]
    if output is not None:
        write_predictions(rows, output)
    return rows
