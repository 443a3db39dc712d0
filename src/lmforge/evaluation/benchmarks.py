"""Benchmark tasks by name: what ``--task glue/cola`` means (task type, columns, labels, splits, metrics).

Each entry says how lmforge fine-tunes and scores one task of GLUE (Wang et al. 2019), SuperGLUE (Wang et al.
2019), SQuAD 1.1/2.0 (Rajpurkar et al. 2016, 2018) or SWAG (Zellers et al. 2018). The files are read in their
official layout from the user's folder (:mod:`lmforge.datasets.benchmarks`); the metrics are the
leaderboards'::

    task            metrics                              task            metrics
    glue/cola       MCC                                  superglue/boolq accuracy
    glue/sst2       accuracy                             superglue/cb    accuracy, F1 (macro)
    glue/mrpc, qqp  F1 (positive class), accuracy        superglue/copa  accuracy
    glue/stsb       Pearson, Spearman                    superglue/multirc  F1a (all answers), EM (per question)
    glue/mnli       accuracy matched / mismatched        superglue/rte, wic, wsc  accuracy
    glue/qnli, rte, wnli  accuracy                       squad/v1.1      EM, F1
    glue/ax         MCC (diagnostic, an MNLI model)      squad/v2.0      EM, F1, HasAns/NoAns, best threshold
    swag/swag       accuracy

    task              metrics                            task              metrics
    superglue/record  F1, EM (max over the answers)      race/race         accuracy (dev, test)
    snli/snli         accuracy (dev, test)               sst/sst5          accuracy (dev, test; root labels 0-4)
    scitail/scitail   accuracy (dev, test)               imdb/imdb         accuracy (dev carved, test)
    trec/trec6        accuracy (dev carved, test)

ReCoRD is extractive QA here (the answer is a span of the passage), scored as SuperGLUE's ReCoRD script does:
SQuAD's normalisation, each query's best EM and F1 over its answers. SNLI (Bowman et al. 2015), SciTail (Khot
et al. 2018), RACE (Lai et al. 2017), SST-5 (Socher et al. 2013), IMDb (Maas et al. 2011) and TREC-6 (Li and
Roth 2002) report their labelled test splits beside dev (``accuracy_dev``, ``accuracy_test``); IMDb and TREC
select checkpoints on a dev carved from their training split (:mod:`lmforge.datasets.benchmark_readers`).

    task                  metrics                                      scored on
    conll2003             entity F1, precision, recall (seqeval)       dev (eng.testa), test (eng.testb)
    sts/sts12 ... sts16   Spearman of embedding cosines, no training   each year's subsets together
    sts/stsb, sts/sickr   Spearman of embedding cosines, no training   test
    cnn_dm, xsum          ROUGE-1/2/L/Lsum (rouge-score, stemmed)      validation, test
    wmt14/en-de           BLEU, chrF (sacrebleu)                       newstest2013 (dev), newstest2014 (test)

CoNLL-2003's IOB1 tags are read as IOB2 (:mod:`lmforge.datasets.conll2003`). The STS sets are Sentence-BERT's
Table 1, scored by :mod:`lmforge.evaluation.sts_benchmark` from any encoder; summaries are scored by
:mod:`lmforge.evaluation.summarization` (ROUGE-Lsum over newline-split sentences, as BART and PEGASUS report).

The shipped tasks (``rt-sentiment``, ``bible-next-verse`` ...) are listed beside them.

Example:
    >>> get("glue/cola").spec_fields()["text_column"]
    'sentence'
    >>> score("glue/mrpc", ["1", "0", "1", "1"], ["1", "0", "0", "1"])
    {'f1': 0.8, 'accuracy': 0.75}
    >>> get("glu/cola")
    Traceback (most recent call last):
    ...
    lmforge.errors.UserInputError: unknown task 'glu/cola'; did you mean 'glue/cola'? Known tasks: ...
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from lmforge import datasets
from lmforge.datasets import benchmarks as layouts
from lmforge.datasets import sts_files
from lmforge.datasets.benchmark_readers import TREC_COARSE
from lmforge.evaluation import baselines, summarization
from lmforge.errors import UserInputError
from lmforge.tasks import inference, metrics
from lmforge.tasks.data import benchmark_table, read_table
from lmforge.tasks.settings import finetune_settings
from lmforge.tasks.spec import TASKS as TASK_TYPES


@dataclass(frozen=True)
class Benchmark:
    """One task by name: its lmforge task and columns, label set, splits and leaderboard metrics."""

    name: str
    description: str
    task: str
    columns: dict[str, str]
    labels: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ("accuracy",)
    train: str = "train"
    evals: tuple[str, ...] = ("dev",)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def shipped(self) -> bool:
        return self.name not in layouts.LAYOUTS

    def spec_fields(self) -> dict[str, Any]:
        """TaskSpec fields (task, columns, labels) for ``lmforge finetune``."""
        out = {"task": self.task, **{f"{role}_column": col for role, col in self.columns.items()}, **self.extra}
        if self.labels:
            out["labels"] = list(self.labels)
        return out

    def source(self, split: str) -> str:
        """The ``NAME:SPLIT`` that :func:`lmforge.tasks.data.read_table` reads."""
        return f"{self.name}:{split}"


def _pair(name, description, a, b, label, labels, metric=("accuracy",), **kw):
    return Benchmark(name, description, "classify", {"text": a, "text_pair": b, "label": label}, labels, metric, **kw)


NLI3 = ("contradiction", "entailment", "neutral")
CONLL_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
STS_COLUMNS = {"text": "sentence1", "text_pair": "sentence2", "label": "score"}
ROUGE = ("rouge1", "rouge2", "rougeL", "rougeLsum")
TASKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("glue/cola", "CoLA: is the sentence grammatical? (Warstadt et al.)", "classify",
              {"text": "sentence", "label": "label"}, ("0", "1"), ("mcc",)),
    Benchmark("glue/sst2", "SST-2: movie-review sentence sentiment", "classify",
              {"text": "sentence", "label": "label"}, ("0", "1")),
    _pair("glue/mrpc", "MRPC: are the two news sentences paraphrases?", "#1 String", "#2 String", "Quality",
          ("0", "1"), ("f1", "accuracy")),
    _pair("glue/qqp", "QQP: are the two Quora questions duplicates?", "question1", "question2", "is_duplicate",
          ("0", "1"), ("f1", "accuracy")),
    Benchmark("glue/stsb", "STS-B: sentence similarity, 0-5", "regress",
              {"text": "sentence1", "text_pair": "sentence2", "label": "score"}, (), ("pearson", "spearman")),
    _pair("glue/mnli", "MNLI: entailment, matched and mismatched genres", "sentence1", "sentence2", "gold_label",
          NLI3, evals=("dev_matched", "dev_mismatched")),
    _pair("glue/qnli", "QNLI: does the sentence answer the question?", "question", "sentence", "label",
          ("entailment", "not_entailment")),
    _pair("glue/rte", "RTE: textual entailment", "sentence1", "sentence2", "label", ("entailment", "not_entailment")),
    _pair("glue/wnli", "WNLI: Winograd NLI", "sentence1", "sentence2", "label", ("0", "1")),
    _pair("glue/ax", "AX: GLUE's diagnostic set, scored with an MNLI model (test only)", "sentence1", "sentence2",
          "label", NLI3, ("mcc",), train="", evals=()),
    _pair("superglue/boolq", "BoolQ: yes/no question about a passage", "question", "passage", "label",
          ("false", "true"), evals=("val",)),
    _pair("superglue/cb", "CommitmentBank: 3-way entailment", "premise", "hypothesis", "label", NLI3,
          ("accuracy", "f1_macro"), evals=("val",)),
    Benchmark("superglue/copa", "COPA: the more plausible cause or effect", "multiple-choice",
              {"text": "context", "target": "choice", "label": "label"}, evals=("val",)),
    _pair("superglue/multirc", "MultiRC: is each answer to the question right?", "paragraph", "question_answer",
          "label", ("0", "1"), ("f1a", "em"), evals=("val",)),
    _pair("superglue/rte", "RTE (SuperGLUE copy)", "premise", "hypothesis", "label",
          ("entailment", "not_entailment"), evals=("val",)),
    _pair("superglue/wic", "WiC: is the word used in the same sense?", "sentence1", "sentence2", "label",
          ("false", "true"), evals=("val",)),
    _pair("superglue/wsc", "WSC: does the pronoun refer to the noun phrase?", "text", "question", "label",
          ("false", "true"), evals=("val",)),
    Benchmark("squad/v1.1", "SQuAD 1.1: answer span in a Wikipedia paragraph", "qa",
              {"text": "question", "text_pair": "context", "target": "answers"}, (), ("exact_match", "f1")),
    Benchmark("squad/v2.0", "SQuAD 2.0: answer span, or no answer", "qa",
              {"text": "question", "text_pair": "context", "target": "answers"}, (),
              ("exact_match", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh")),
    Benchmark("swag/swag", "SWAG: the most plausible continuation of a video caption", "multiple-choice",
              {"text": "context", "target": "choice", "label": "label"}, evals=("val",)),
    # ReCoRD, SNLI, SciTail, RACE, SST-5, IMDb, TREC-6 (layouts: datasets/benchmark_readers.py)
    Benchmark("superglue/record", "ReCoRD: the entity that fills the query's @placeholder (a passage span)", "qa",
              {"text": "question", "text_pair": "context", "target": "answers"}, (), ("f1", "exact_match"),
              evals=("val",)),
    _pair("snli/snli", "SNLI: entailment of image-caption pairs", "sentence1", "sentence2", "gold_label", NLI3,
          evals=("dev", "test")),
    _pair("scitail/scitail", "SciTail: does the web sentence entail the science fact?", "premise", "hypothesis",
          "label", ("entails", "neutral"), evals=("dev", "test")),
    Benchmark("race/race", "RACE: English-exam reading comprehension, 4 options", "multiple-choice",
              {"text": "context", "target": "choice", "label": "label"}, evals=("dev", "test")),
    Benchmark("sst/sst5", "SST-5: fine-grained sentence sentiment, 0-4 (SST's trees)", "classify",
              {"text": "sentence", "label": "label"}, ("0", "1", "2", "3", "4"), evals=("dev", "test")),
    Benchmark("imdb/imdb", "IMDb: movie-review sentiment (dev: 10% of train)", "classify",
              {"text": "text", "label": "label"}, ("neg", "pos"), evals=("dev", "test")),
    Benchmark("trec/trec6", "TREC-6: question type, 6 coarse classes (dev: 10% of train)", "classify",
              {"text": "text", "label": "label"}, TREC_COARSE, evals=("dev", "test")),
    # CoNLL-2003, STS (SBERT's Table 1), CNN/DM, XSum, WMT14 (layouts: datasets/conll2003.py, sts_files.py ...)
    Benchmark("conll2003", "CoNLL-2003 English NER: PER, ORG, LOC, MISC (IOB1 read as IOB2)", "tag",
              {"text": "tokens", "label": "tags"}, CONLL_TAGS, ("f1", "precision", "recall"), evals=("dev", "test")),
    *(Benchmark(f"sts/{year}", f"STS{year[-2:]} (SemEval): similarity 0-5, embedding cosine, no training",
                "embedding", STS_COLUMNS, (), ("spearman",), train="", evals=tuple(sts_files.YEARS[year]))
      for year in sts_files.YEARS),
    Benchmark("sts/stsb", "STS benchmark: similarity 0-5, embedding cosine, no training", "embedding",
              STS_COLUMNS, (), ("spearman",), train="", evals=("test",)),
    Benchmark("sts/sickr", "SICK-R: relatedness 1-5, embedding cosine, no training", "embedding", STS_COLUMNS, (),
              ("spearman",), train="", evals=("test",)),
    Benchmark("cnn_dm", "CNN/DailyMail news summarization (highlights)", "seq2seq",
              {"text": "article", "target": "highlights"}, (), ROUGE, evals=("validation", "test")),
    Benchmark("xsum", "XSum: one-sentence BBC summaries", "seq2seq", {"text": "document", "target": "summary"}, (),
              ROUGE, evals=("validation", "test")),
    Benchmark("wmt14/en-de", "WMT14 English -> German news translation", "seq2seq", {"text": "en", "target": "de"},
              (), ("bleu", "chrf"), evals=("dev", "test")),
    # shipped with lmforge
    Benchmark("rt-sentiment", "Rotten Tomatoes sentence sentiment (shipped)", "classify",
              {"text": "text", "label": "label"}, ("0", "1")),
    Benchmark("bible-paraphrase", "KJV/WEB verse pairs: same verse or not (shipped)", "classify",
              {"text": "text1", "text_pair": "text2", "label": "label"}, ("0", "1"), ("accuracy", "f1")),
    Benchmark("bible-next-verse", "pick the verse that follows, from four (shipped, multiple choice)",
              "multiple-choice", {"text": "context", "target": "choice", "label": "label"}),
    Benchmark("kjv-rv1909", "KJV -> Reina-Valera 1909 verse translation (shipped)", "seq2seq",
              {"text": "en", "target": "es"}, (), ("bleu", "chrf")),
    Benchmark("wnut16", "WNUT-16 Twitter named entities (LMFORGE_WNUT16_DIR)", "tag",
              {"text": "tokens", "label": "tags"}, (), ("f1",)),
)}


def names() -> list[str]:
    return list(TASKS)


def get(name: str) -> Benchmark:
    """The task called ``name``; an unknown name lists the known ones with the closest match first."""
    if name in TASKS:
        return TASKS[name]
    # Within its own kind first: a name without a suite ("clasify") is more likely a task type than a task,
    # which a loose match over every name would pick ("glue/cola"); across kinds only when none is close.
    types = [*TASK_TYPES, "instruct", "embedding"]
    own, other = (list(TASKS), types) if "/" in name else (types, list(TASKS))
    close = (difflib.get_close_matches(name.lower(), own, n=1, cutoff=0.6)
             or difflib.get_close_matches(name.lower(), own + other, n=1, cutoff=0.3))
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UserInputError(f"unknown task {name!r}{hint} Known tasks: {', '.join(TASKS)}"
                         " (or a task type: classify, regress, multilabel, tag, qa, multiple-choice, seq2seq, "
                         "text2text)")


# The metric a named task selects its best checkpoint by, where the task type computes the leaderboard's.
_SELECT = {"mcc", "pearson", "spearman", "f1", "accuracy", "exact_match", "best_f1", "rouge1"}


def resolve_task(given: dict):
    """Resolve ``given["task"]`` (the flags of ``lmforge finetune``), when it names a task (e.g. glue/cola), in
    place into the task type, columns, files and metric it stands for, and return its :class:`Benchmark`; None
    for a task type (classify ...). ``given["data_dir"]`` sets the suite's folder variable."""
    name = given.get("task")
    if name is None or name in (*TASK_TYPES, "instruct", "embedding"):
        return None
    bench = get(name)  # an unknown name: the list, with the closest match
    if bench.task == "embedding":  # SBERT's STS sets: scored from an encoder as it is
        raise UserInputError(f"--task {name}: is scored without training; run `lmforge evaluate --task {name} "
                             "--model ENCODER --data-dir DIR`")
    if given.get("data_dir") is not None and name in layouts.LAYOUTS:
        os.environ[layouts.SUITES[layouts.LAYOUTS[name].suite][0]] = str(given["data_dir"])
    given["task"] = bench.task
    for role, column in bench.columns.items():
        if given.get(f"{role}_column") is None:
            given[f"{role}_column"] = column
    if given.get("train") is None and bench.train:
        given["train"] = bench.source(bench.train)
    if given.get("eval") is None and bench.evals:
        given["eval"] = bench.source(bench.evals[0])
    if given.get("metric") is None and bench.metrics[0] in _SELECT and not (
            bench.task == "classify" and bench.metrics[0] == "f1"):
        given["metric"] = bench.metrics[0]
    return bench


def task_settings(given: dict) -> dict:
    """A fine-tuning run's settings (:func:`lmforge.tasks.settings.finetune_settings`) from the flags, a task
    name resolved first; a named task keeps its official label set, not the one its training file happens to have."""
    bench = resolve_task(given)
    settings = finetune_settings(given)
    if bench is not None and bench.labels and not settings["task"].get("labels"):
        settings["task"]["labels"] = list(bench.labels)
    return settings


def where(name: str) -> str:
    """Where a task's data comes from, in one line."""
    if name in layouts.LAYOUTS:
        suite = layouts.LAYOUTS[name].suite
        env, source = layouts.SUITES[suite]
        return f"--data-dir or ${env} ({source})"
    return "shipped" if datasets.info(name).shipped else "--data-dir or $LMFORGE_WNUT16_DIR"


def table(name: str, split: str, data_dir=None):
    """One split of a task as a :class:`~lmforge.tasks.data.Table` (a benchmark from ``data_dir``, else shipped)."""
    if name in layouts.LAYOUTS:
        return benchmark_table(name, split, data_dir)
    return read_table(f"{name}:{split}")


def evaluate(model_dir, name: str, data_dir=None, batch_size: int = 32, device: str = "cpu") -> dict[str, float]:
    """The leaderboard's metrics of a fine-tuned task folder on every evaluation split of task ``name``.

    A task with several evaluation splits reports each metric per split, named by the split's last part
    (MNLI: ``accuracy_matched``, ``accuracy_mismatched``).
    """
    bench = get(name)
    if bench.task == "embedding":
        raise UserInputError(f"{name}: is scored from an encoder, with no task folder: run `lmforge evaluate --task "
                             f"{name} --model ENCODER --data-dir DIR`")
    if not bench.evals:
        raise UserInputError(f"{name} has no labelled evaluation split (it is scored on its test set by the "
                             "leaderboard); predict it with `lmforge predict`")
    out: dict[str, float] = {}
    for split in bench.evals:
        scores = score_table(model_dir, name, table(name, split, data_dir), batch_size, device)
        suffix = f"_{split.rsplit('_', 1)[-1]}" if len(bench.evals) > 1 else ""
        out.update({f"{k}{suffix}": v for k, v in scores.items()})
    return out


def score_table(model_dir, name: str, data, batch_size: int = 32, device: str = "cpu",
                overrides: dict[str, Any] | None = None) -> dict[str, float]:
    """The leaderboard's metrics of a fine-tuned task folder on labelled rows of task ``name`` (a
    :class:`~lmforge.tasks.data.Table`: a split read by :func:`table`, or the same rows from a file).

    ``overrides``: column names of rows laid out otherwise (``label_column`` also names the gold labels), as
    ``lmforge evaluate --text-column`` gives them.
    """
    bench = get(name)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if bench.task == "seq2seq" and "rougeLsum" in bench.metrics:  # summaries: ROUGE as the papers report it
        preds = (baselines.predict(model_dir, data) if baselines.is_baseline(model_dir) else
                 inference.predict(model_dir, data, overrides=overrides, batch_size=batch_size, device=device))
        column = overrides.get("target_column") or bench.columns["target"]
        data.require(column)
        return score(name, [row.get(column) for row in data.rows], [p["prediction"] for p in preds])
    if bench.task in ("qa", "seq2seq", "tag"):  # the task's own scoring is the leaderboard's
        scores = (baselines.evaluate(model_dir, data) if baselines.is_baseline(model_dir) else  # crf, lead-3 ...
                  inference.evaluate(model_dir, data, overrides=overrides, batch_size=batch_size, device=device))
        return {m: scores[m] for m in bench.metrics if m in scores}
    column = overrides.get("label_column") or bench.columns["label"]
    data.require(column)  # the gold labels (a test split's rows have none)
    preds = (baselines.predict(model_dir, data) if baselines.is_baseline(model_dir) else
             inference.predict(model_dir, data, overrides=overrides, batch_size=batch_size, device=device))
    gold = [row.get(column) for row in data.rows]
    return score(name, gold, [p["prediction"] for p in preds], [row.get("question_id") for row in data.rows])


def score(name: str, gold: Sequence, pred: Sequence, groups: Sequence | None = None) -> dict[str, float]:
    """The leaderboard's metrics of ``name`` from gold and predicted labels (scores for STS-B).

    ``groups`` (MultiRC): the question of each answer, for EM (a question counts when all its answers are right).
    """
    bench = get(name)
    if bench.task == "tag":  # tag sequences (CoNLL-2003): seqeval's entity-level scores
        words = [[list(t.split()) if isinstance(t, str) else list(t) for t in side] for side in (gold, pred)]
        return {m: v for m, v in metrics.entity_f1(*words).items() if m in bench.metrics}
    if bench.task == "seq2seq":  # reference and generated texts: ROUGE for summaries, else BLEU and chrF
        refs, hyps = [str(g) for g in gold], [str(p) for p in pred]
        if "rougeLsum" in bench.metrics:
            return summarization.rouge(hyps, refs)
        return {m: {"bleu": metrics.bleu, "chrf": metrics.chrf}[m](hyps, refs) for m in bench.metrics}
    gold, pred = [str(g) for g in gold], [str(p) for p in pred]
    out: dict[str, float] = {}
    for metric in bench.metrics:
        if metric == "accuracy":
            out[metric] = metrics.accuracy(gold, pred)
        elif metric == "mcc":
            out[metric] = metrics.mcc(gold, pred)
        elif metric in ("f1", "f1a"):  # F1 of the positive class ("1"): MRPC, QQP; MultiRC's F1 over answers
            if not set(gold) | set(pred) <= {"0", "1"}:
                raise UserInputError(f"{name}: {metric} needs labels 0/1, got {sorted(set(gold) | set(pred))}")
            out[metric] = metrics.f1([int(g) for g in gold], [int(p) for p in pred], average="binary")
        elif metric == "f1_macro":
            out[metric] = metrics.f1(gold, pred, average="macro", labels=list(bench.labels))
        elif metric in ("pearson", "spearman"):
            out.update({k: v for k, v in metrics.correlations([float(g) for g in gold],
                                                              [float(p) for p in pred]).items() if k == metric})
        elif metric == "em":
            questions: dict[Any, bool] = {}
            for g, p, q in zip(gold, pred, groups or range(len(gold))):
                questions[q] = questions.get(q, True) and g == p
            out[metric] = sum(questions.values()) / max(len(questions), 1)
    return out
