"""A benchmark suite end to end: fine-tune and evaluate every task, the leaderboard's table, and submission files.

``lmforge benchmark glue --model M --data-dir D --out RUN`` does what BERT's GLUE table needed (Devlin et al.
2019, Table 1): one fine-tuning run per task, each scored on its dev set with the leaderboard's metric, and the
test sets predicted in the format gluebenchmark.com accepts::

    RUN/cola/, RUN/sst2/ ...      one ordinary fine-tuning run folder per task (best/, model/, metrics.jsonl ...)
    RUN/cola/scores.json          the task's dev metrics (lmforge.evaluation.benchmarks.evaluate)
    RUN/table.md, results.json    the table: every metric x 100, each task's score, and the average
    RUN/submission/CoLA.tsv ...   "index<TAB>prediction" per test row; MNLI-m/-mm; AX.tsv from the MNLI model

The leaderboard's average (Wang et al. 2019, GLUE): a task with two metrics (MRPC and QQP: F1 and accuracy;
STS-B: Pearson and Spearman) or two evaluation sets (MNLI: matched and mismatched) scores their unweighted
mean; the average is over the tasks' scores, AX (a diagnostic) left out::

    score(task) = mean of its metrics x 100          GLUE score = mean over the nine tasks of score(task)

A task whose run finished is not trained again, and one that was interrupted resumes from its last checkpoint,
so the same command continues a suite where it stopped. The runs are made one after the other.

Example:
    >>> average({"glue/mrpc": {"f1": 0.8, "accuracy": 0.7}, "glue/cola": {"mcc": 0.5}})
    (62.5, {'glue/mrpc': 75.0, 'glue/cola': 50.0})
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from lmforge.datasets import benchmarks as layouts
from lmforge.errors import UserInputError
from lmforge.evaluation import benchmarks
from lmforge.tasks.inference import predict
from lmforge.tasks.run import run_finetune
from lmforge.utils.io import atomic_write_text
from lmforge.utils.runs import model_folder

# suite -> its tasks, each with its test splits and their submission files (AX: scored by the MNLI model)
SUITES: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "glue": {"glue/cola": (("test", "CoLA.tsv"),), "glue/sst2": (("test", "SST-2.tsv"),),
             "glue/mrpc": (("test", "MRPC.tsv"),), "glue/stsb": (("test", "STS-B.tsv"),),
             "glue/qqp": (("test", "QQP.tsv"),),
             "glue/mnli": (("test_matched", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv")),
             "glue/qnli": (("test", "QNLI.tsv"),), "glue/rte": (("test", "RTE.tsv"),),
             "glue/wnli": (("test", "WNLI.tsv"),)},
}
DIAGNOSTIC = {"glue": ("glue/mnli", "glue/ax", "test", "AX.tsv")}  # (model's task, task, split, file)
SUBMISSION_DIR, TABLE_FILE, RESULTS_FILE, SCORES_FILE = "submission", "table.md", "results.json", "scores.json"


def average(scores: dict[str, dict[str, float]]) -> tuple[float, dict[str, float]]:
    """(the leaderboard's average, each task's score): the mean of a task's metrics x 100, then over tasks."""
    per_task = {name: 100 * sum(m.values()) / len(m) for name, m in scores.items()}
    return sum(per_task.values()) / max(len(per_task), 1), per_task


def _short(name: str) -> str:
    return name.split("/", 1)[1]


def _index(row: dict[str, Any], k: int):
    """A test row's id as the leaderboard reads it (GLUE: ``index``; QQP: ``id``), else its position."""
    return row.get("index", row.get("id", k))


def submission_file(name: str, split: str) -> str | None:
    """The leaderboard's file name for ``name``'s test ``split`` (``glue/mnli``, ``test_matched``: MNLI-m.tsv);
    None where lmforge knows no submission format."""
    suite = layouts.LAYOUTS[name].suite if name in layouts.LAYOUTS else None
    files = dict(SUITES.get(suite, {}).get(name, ()))
    if suite in DIAGNOSTIC and DIAGNOSTIC[suite][1:3] == (name, split):
        return DIAGNOSTIC[suite][3]
    return files.get(split)


def write_submission(model, name: str, split: str, file: Path, data_dir, table=None, batch_size: int = 32,
                     device: str = "cpu") -> int:
    """Predict ``name``'s ``split`` (or the rows of ``table``) with the task folder ``model`` and write ``file``
    as the leaderboard reads it: ``index<TAB>prediction`` per row. Returns the number of rows."""
    table = table if table is not None else benchmarks.table(name, split, data_dir)
    rows = predict(model, table, batch_size=batch_size, device=device)
    lines = [f"{_index(table.rows[k], k)}\t{p['prediction']}" for k, p in enumerate(rows)]
    atomic_write_text(file, "index\tprediction\n" + "".join(line + "\n" for line in lines))
    return len(lines)


def run_suite(suite: str, given: dict[str, Any], out: str | Path, tasks: list[str] | None = None,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tune, evaluate and predict every task of ``suite`` (or the ``tasks`` named, e.g. ``["cola"]``).

    ``given``: the flags of ``lmforge finetune`` shared by every task (``model``, ``data_dir``, ``max_steps`` ...).
    Returns what ``RUN/results.json`` holds: ``scores`` per task, ``task_scores``, ``average``, ``submission``.
    """
    if suite not in SUITES:
        raise UserInputError(f"unknown benchmark suite {suite!r} (known: {', '.join(SUITES)})")
    names = list(SUITES[suite])
    if tasks:
        wanted = [t if "/" in t else f"{suite}/{t}" for t in tasks]
        unknown = [t for t in wanted if t not in names]
        if unknown:
            raise UserInputError(f"--tasks {', '.join(unknown)}: not in {suite} (its tasks: "
                                 f"{', '.join(_short(n) for n in names)})")
        names = [n for n in names if n in wanted]
    out, data_dir = Path(out), given.get("data_dir")
    for name in names:  # every training and dev file is there before the first run starts
        bench = benchmarks.get(name)
        for split in (bench.train, *bench.evals):
            layouts.path(name, split, data_dir)
    scores: dict[str, dict[str, float]] = {}
    submission: dict[str, int] = {}
    for name in names:
        run = out / _short(name)
        if not (run / "model").is_dir():
            resume = (run / "checkpoints").is_dir()
            log(f"{name}: {'resuming' if resume else 'fine-tuning'} in {run}")
            settings = benchmarks.task_settings({**given, "task": name, "out": str(run), "resume": resume})
            run_finetune(settings, log=log)
        else:
            log(f"{name}: fine-tuned already ({run / 'model'})")
        model = model_folder(run)[0]
        scores[name] = benchmarks.evaluate(model, name, data_dir)
        atomic_write_text(run / SCORES_FILE, json.dumps(scores[name], indent=2) + "\n")
        for split, file in SUITES[suite][name]:
            if split in layouts.LAYOUTS[name].files and layouts.path(name, split, data_dir).is_file():
                submission[file] = write_submission(model, name, split, out / SUBMISSION_DIR / file, data_dir)
    if suite in DIAGNOSTIC and DIAGNOSTIC[suite][0] in names:
        by, name, split, file = DIAGNOSTIC[suite]
        submission[file] = write_submission(model_folder(out / _short(by))[0], name, split,
                                             out / SUBMISSION_DIR / file, data_dir)
    mean, per_task = average(scores)
    result = {"suite": suite, "tasks": names, "scores": scores, "task_scores": per_task, "average": mean,
              "submission": submission}
    atomic_write_text(out / RESULTS_FILE, json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / TABLE_FILE, table_markdown(result))
    return result


def table_markdown(result: dict[str, Any]) -> str:
    """The suite's table: one row per task with its metrics x 100 and score, then the average."""
    lines = ["| task | metrics (x 100) | score |", "|---|---|---:|"]
    for name in result["tasks"]:
        shown = ", ".join(f"{k} {100 * v:.1f}" for k, v in result["scores"][name].items())
        lines.append(f"| {name} | {shown} | {result['task_scores'][name]:.1f} |")
    n, total = len(result["tasks"]), len(SUITES[result["suite"]])
    lines.append(f"| **{result['suite'].upper()} score** | mean of {n} of {total} task scores | "
                 f"**{result['average']:.1f}** |")
    return "\n".join(lines) + "\n"
