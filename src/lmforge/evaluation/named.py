"""A benchmark task by name wherever a task is taken: ``lmforge evaluate``, ``predict`` and ``distill``.

``lmforge finetune --task glue/sst2 --data-dir DIR`` resolves a name into its task type, columns, labels,
files and metric (:func:`lmforge.evaluation.benchmarks.resolve_task`); experiment grids and ``lmforge benchmark``
go through the same function. This module gives the other verbs the same name::

    lmforge evaluate --model RUN --task glue/sst2 --data-dir DIR              dev: the leaderboard's metrics
    lmforge evaluate --model RUN --task glue/mnli --data-dir DIR --out D      both dev splits, D/scores.json
    lmforge evaluate --model RUN --task glue/sst2 --data-dir DIR --split test --out D    D/SST-2.tsv
    lmforge evaluate --model RUN --task glue/sst2 --data dev.parquet          the same metrics on a file's rows
    lmforge predict  --model RUN --task glue/sst2 --data-dir DIR --split test --output p.jsonl
    lmforge distill  --teacher RUN --task glue/sst2 --data-dir DIR --out R    train/eval from the layout

An evaluation split (GLUE's ``dev``; MNLI's ``dev_matched`` and ``dev_mismatched``, reported as
``accuracy_matched`` ...) is scored with the leaderboard's metrics (:func:`benchmarks.score_table`); a test
split has no labels, so its predictions are written in the leaderboard's submission format
(:func:`lmforge.evaluation.benchmark_suite.write_submission`: ``index<TAB>prediction``, GLUE's file names).

Example:
    >>> is_name("glue/sst2"), is_name("classify"), is_name(None)
    (True, False, False)
    >>> unlabelled_splits("glue/mnli")
    ['test_matched', 'test_mismatched']
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lmforge.datasets import benchmarks as layouts
from lmforge.errors import UserInputError
from lmforge.evaluation import baselines, benchmark_suite, benchmarks
from lmforge.tasks import inference
from lmforge.tasks.data import read_table
from lmforge.tasks.model import read_task_meta
from lmforge.tasks.spec import TASKS as TASK_TYPES
from lmforge.utils.io import atomic_write_text

OTHER_TASKS = ("instruct", "embedding")  # finetune's own recipes, not benchmark names
SCORES_FILE = benchmark_suite.SCORES_FILE


def is_name(task: str | None) -> bool:
    """Whether ``task`` names a task (``glue/sst2``, ``rt-sentiment``) rather than a task type (``classify``)."""
    return task is not None and task not in (*TASK_TYPES, *OTHER_TASKS)


def use_data_dir(name: str, data_dir: str | Path | None) -> None:
    """Read ``name``'s ``NAME:SPLIT`` sources from ``data_dir`` (the suite's variable, as ``finetune`` sets it:
    a resumed run, a grid cell's process and a distillation's evaluations read the same folder)."""
    if data_dir is not None and name in layouts.LAYOUTS:
        os.environ[layouts.SUITES[layouts.LAYOUTS[name].suite][0]] = str(data_dir)


def use_data_dir_of(source: str | None, data_dir: str | Path | None) -> None:
    """``--data glue/sst2:dev --data-dir DIR`` without ``--task``: read that ``NAME:SPLIT`` from ``DIR``."""
    if source is not None and data_dir is not None and ":" in str(source):
        use_data_dir(str(source).partition(":")[0], data_dir)


def unlabelled_splits(name: str) -> list[str]:
    """The splits of ``name``'s layout that are neither its training nor its evaluation splits: the unlabelled
    test sets the leaderboard scores."""
    bench = benchmarks.get(name)
    files = layouts.LAYOUTS[name].files if name in layouts.LAYOUTS else {}
    return [s for s in files if s not in (bench.train, *bench.evals)]


def _splits(name: str, split: str | None, first_only: bool) -> list[str]:
    bench = benchmarks.get(name)
    if split is None:
        if not bench.evals:
            if unlabelled_splits(name):
                return unlabelled_splits(name)
            raise UserInputError(f"{name} has no evaluation split; name one with --split")
        return list(bench.evals[:1] if first_only else bench.evals)
    known = list(layouts.LAYOUTS[name].files) if name in layouts.LAYOUTS else None
    if known is not None and split not in known:
        raise UserInputError(f"--split {split}: {name} has no split {split!r} (splits: {', '.join(known)})")
    return [split]


def check_folder(model_dir: str | Path, name: str) -> None:
    """Refuse a task folder fine-tuned for another task type than ``name``'s (a regressor scored as SST-2)."""
    bench = benchmarks.get(name)
    meta = read_task_meta(model_dir) if Path(model_dir).is_dir() else None
    if meta is not None and "spec" in meta and meta["spec"].get("task") != bench.task:
        raise UserInputError(f"{model_dir} was fine-tuned for task {meta['spec'].get('task')!r}; {name} is a "
                             f"{bench.task!r} task")


def evaluate(model_dir: str | Path, name: str, *, data=None, split: str | None = None,
             data_dir: str | Path | None = None, out: str | Path | None = None,
             overrides: dict[str, Any] | None = None, batch_size: int = 32, device: str = "cpu",
             limit: int | None = None, log=print) -> dict[str, Any]:
    """The leaderboard's metrics of a task folder on task ``name``, and for a test split its submission file.

    Args:
        data: score these rows (a file, ``DIR:SPLIT`` or ``NAME:SPLIT``) instead of the layout's splits.
        split: one split of the layout (default: every evaluation split; a task with none: its test splits).
        out: folder for ``scores.json`` (the metrics) and the submission files (needed for a test split).
        overrides: column names of ``data`` laid out otherwise than the benchmark.
        limit: the first N rows of each split only.
        log: receives one line per submission file written.

    Returns:
        ``{"scores": {metric: value}, "submission": {file name: rows}}``; several evaluation splits report
        each metric per split (``accuracy_matched``, ``accuracy_mismatched``).
    """
    check_folder(model_dir, name)
    use_data_dir(name, data_dir)
    scores: dict[str, float] = {}
    submission: dict[str, int] = {}
    if data is not None:
        table = read_table(data)
        scores = benchmarks.score_table(model_dir, name, table.head(limit) if limit else table, batch_size, device,
                                        overrides)
        splits: list[str] = []
    else:
        splits = _splits(name, split, first_only=False)
    tests = [s for s in splits if s in unlabelled_splits(name)]
    if tests and out is None:
        raise UserInputError(f"--split {tests[0]}: {name}'s test split has no labels; evaluate writes its "
                             "submission file there: give --out DIR")
    scored = [s for s in splits if s not in tests]
    for s in splits:
        table = benchmarks.table(name, s, data_dir)
        table = table.head(limit) if limit else table
        if s in tests:
            file = benchmark_suite.submission_file(name, s)
            if file is None:
                raise UserInputError(f"--split {s}: lmforge knows no submission format for {name}; write its "
                                     f"predictions with `lmforge predict --task {name} --split {s}`")
            submission[file] = benchmark_suite.write_submission(model_dir, name, s, Path(out) / file, data_dir,
                                                                table, batch_size, device)
            log(f"wrote {submission[file]} predictions to {Path(out) / file}")
            continue
        result = benchmarks.score_table(model_dir, name, table, batch_size, device, overrides)
        suffix = f"_{s.rsplit('_', 1)[-1]}" if len(scored) > 1 else ""
        scores.update({f"{k}{suffix}": v for k, v in result.items()})
    if out is not None and scores:
        atomic_write_text(Path(out) / SCORES_FILE, json.dumps(scores, indent=2) + "\n")
    return {"scores": scores, "submission": submission}


def predict(model_dir: str | Path, name: str, output: str | Path, *, data=None, split: str | None = None,
            data_dir: str | Path | None = None, overrides: dict[str, Any] | None = None, batch_size: int = 32,
            device: str = "cpu") -> list[dict[str, Any]]:
    """Predictions for every row of ``name``'s ``split`` (default: its first evaluation split), or of ``data``,
    written to ``output`` (as :func:`lmforge.tasks.inference.predict`)."""
    check_folder(model_dir, name)
    use_data_dir(name, data_dir)
    table = read_table(data) if data is not None else benchmarks.table(name, _splits(name, split, True)[0], data_dir)
    if baselines.is_baseline(model_dir):
        return baselines.predict(model_dir, table, output)
    return inference.predict(model_dir, table, output, overrides=overrides, batch_size=batch_size, device=device)


def scores_baseline(bench: benchmarks.Benchmark | None) -> bool:
    """Whether ``finetune --baseline`` on ``bench`` is scored by :func:`score_baseline_run` rather than by the
    baseline's own task scores: a summarization task by name (cnn_dm, xsum), whose ROUGE-Lsum they lack."""
    return bench is not None and bench.task == "seq2seq" and "rougeLsum" in bench.metrics


def score_baseline_run(result: dict[str, Any], name: str, eval_source: str) -> dict[str, Any]:
    """Score a baseline run (``finetune --baseline``'s result) on ``eval_source`` with task ``name``'s metrics,
    and record them in its ``baseline.json`` as the baseline's own evaluation would be."""
    table = read_table(eval_source)
    result = {**result, "eval": {**benchmarks.score_table(result["model_dir"], name, table), "examples": len(table)},
              "eval_data": table.path}
    atomic_write_text(Path(result["model_dir"]).parent / baselines.RUN_FILE, json.dumps(result, indent=2) + "\n")
    return result


def distill_sources(name: str, data_dir: str | Path | None) -> tuple[str, str | None]:
    """``(train, eval)`` sources of task ``name`` for task distillation (a classification task)."""
    bench = benchmarks.get(name)
    if bench.task != "classify":
        raise UserInputError(f"--task {name}: task distillation takes classification tasks; {name} is a "
                             f"{bench.task!r} task")
    if not bench.train:
        raise UserInputError(f"--task {name}: has no training split to distil on")
    use_data_dir(name, data_dir)
    return bench.source(bench.train), (bench.source(bench.evals[0]) if bench.evals else None)
