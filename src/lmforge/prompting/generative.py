"""Generative few-shot prompting: score a frozen model's generated answers against k, as GPT-3's figures do.

GPT-2 and GPT-3 (Radford et al. 2019; Brown et al. 2020, Figure 3.4 and Table 3.4) translate and answer
questions by continuing a prompt of k solved examples. Each demonstration and the query use one template::

    English: {x}          <- demonstration 1: the template, then " " + its target
    Spanish: {y}
    <blank line>
    ...                   <- k demonstrations, drawn from the pool
    English: {query}
    Spanish:              <- the model continues greedily; its answer ends at the first newline

Demonstrations are drawn for query i from ``random.Random(f"{seed}:{i}")`` (as :mod:`lmforge.prompting.icl`
draws them), and the whole evaluation is repeated for each seed, so a score at k is a mean ± std over seeds.
Scores: corpus BLEU (sacrebleu; translation), SQuAD's exact match and token F1 (QA-style answers). A prompt longer
than the model's context keeps its end (the query and the nearest demonstrations), as a sliding window would.

Chain-of-thought (Wei et al. 2022; ``cot=True``, ``lmforge prompt generate --cot``): each demonstration shows its
worked rationale (the pool's ``rationale_column``) before the answer, as :class:`~lmforge.prompting.icl.ChainOfThought`
writes it; the model continues with a rationale of its own, and the answer scored is the one
:meth:`ChainOfThought.extract <lmforge.prompting.icl.ChainOfThought.extract>` finds in it ("The answer is 9.";
none found scores as an empty answer)::

    Q: Mia has 3 apples. She gets 4 more. ... How many apples does she have now?
    A: 3 plus 4 is 7. 7 minus 2 is 5. The answer is 5.
    <blank line>
    Q: {query}
    A:                    <- generated: "... The answer is N." -> N

The shipped tasks: ``kjv-rv1909`` (verse translation, BLEU) and ``arithmetic`` (word problems with rationales,
:mod:`lmforge.datasets.arithmetic`; exact match), each with its pool (train) and queries (test).
:func:`run_few_shot` is the whole of ``lmforge prompt generate`` (and a prompt grid's cell): the settings of
:data:`PROMPT_DEFAULTS` in, the table and ``OUT/results.json`` out.

Example:
    >>> task = GenerativeTask("English: {x}\\nSpanish:", "en", "es")
    >>> pool = [{"en": "one", "es": "uno"}, {"en": "two", "es": "dos"}]
    >>> print(task.prompt(pool, [1], {"en": "three"}))
    English: two
    Spanish: dos
    <BLANKLINE>
    English: three
    Spanish:
    >>> cot = GenerativeTask("Q: {x}\\nA:", "text", "target", "exact_match", rationale_column="rationale", cot=True)
    >>> print(cot.prompt([{"text": "2 + 3?", "rationale": "2 plus 3 is 5.", "target": "5"}], [0], {"text": "4 + 1?"}))
    Q: 2 + 3?
    A: 2 plus 3 is 5. The answer is 5.
    <BLANKLINE>
    Q: 4 + 1?
    A:
    >>> cot.answer(" 4 plus 1 is 5. The answer is 5."), task.answer(" dos")
    ('5', ' dos')
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from lmforge import datasets
from lmforge.checkpoint import load_body
from lmforge.datasets import arithmetic
from lmforge.errors import UserInputError
from lmforge.generation import generate
from lmforge.generation.generate import decode_outputs, encode_prompt
from lmforge.prompting.icl import ChainOfThought, select_random
from lmforge.prompting.rag import FEW_SHOT_TEMPLATE, Passage, build_prompt, check_template, open_retriever
from lmforge.tasks import metrics
from lmforge.utils.io import atomic_write_bytes, atomic_write_text, read_text_file

METRICS = ("bleu", "exact_match", "f1")
# Data sets made by a generator rather than read from a file: name -> split -> rows.
GENERATED = {"arithmetic": arithmetic.split}


@dataclass(frozen=True)
class GenerativeTask:
    """A prompt ``template`` with ``{x}`` (the input), the input and target columns, and the metric."""

    template: str
    input_column: str
    target_column: str
    metric: str = "bleu"
    separator: str = "\n\n"
    rationale_column: str | None = None  # the pool's worked rationales (chain-of-thought demonstrations)
    cot: bool = False  # demonstrations show their rationale; the answer is extracted from the generated one

    def __post_init__(self) -> None:
        if self.template.count("{x}") != 1:
            raise UserInputError(f"the prompt template needs one {{x}} (the input): {self.template!r}")
        if self.metric not in METRICS:
            raise UserInputError(f"metric {self.metric!r}: choose one of {', '.join(METRICS)}")
        if self.cot and not self.rationale_column:
            raise UserInputError("chain-of-thought prompting needs the pool's rationale column (--rationale-column)")

    @property
    def chain(self) -> ChainOfThought:
        """The chain-of-thought layout and answer pattern, with this task's question template."""
        return ChainOfThought(question=self.template, separator=self.separator)

    def prompt(self, pool: Sequence[dict], chosen: Sequence[int], query: dict) -> str:
        if self.cot:
            demos = [((str(pool[j][self.input_column]),), str(pool[j][self.rationale_column]),
                      str(pool[j][self.target_column])) for j in chosen]
            return self.chain.prompt(demos, str(query[self.input_column]))
        demos = "".join(self.template.replace("{x}", str(pool[j][self.input_column])) + " "
                        + str(pool[j][self.target_column]) + self.separator for j in chosen)
        return demos + self.template.replace("{x}", str(query[self.input_column]))

    def answer(self, output: str) -> str:
        """The answer in a generated line: all of it, or with ``cot`` what follows "The answer is" ("" if none)."""
        return (self.chain.extract(output) or "") if self.cot else output

    def score(self, outputs: Sequence[str], targets: Sequence[str]) -> float:
        """The metric, on a 0-100 scale."""
        if self.metric == "bleu":
            return metrics.bleu(outputs, targets)
        return 100 * metrics.qa(outputs, [[t] for t in targets])[self.metric]


# The shipped generative tasks (pool: the train split, queries: the test split): KJV -> Reina-Valera 1909 verse
# translation (GPT-2's and GPT-3's translation set-up), and arithmetic word problems with rationales (Wei et al.).
TASKS = {"kjv-rv1909": GenerativeTask("English: {x}\nSpanish:", "en", "es", "bleu"),
         "arithmetic": GenerativeTask("Q: {x}\nA:", "text", "target", "exact_match", rationale_column="rationale")}


def choose(pool_size: int, k: int, seed: int, n_queries: int) -> list[list[int]]:
    """The demonstrations of each query: k pool indices from ``random.Random(f"{seed}:{i}")``."""
    if k > pool_size:
        raise UserInputError(f"--shots {k} is more than the {pool_size} demonstrations in the pool")
    return [select_random(pool_size, k, random.Random(f"{seed}:{i}")) for i in range(n_queries)]


@torch.no_grad()
def answers(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 48, batch_size: int = 8) -> list[str]:
    """Greedy continuations of ``prompts``, each cut at its first newline; a prompt longer than the context keeps
    its last tokens."""
    room = model.config.max_seq_len - max_new_tokens
    if room < 8:
        raise UserInputError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the model's "
                             f"{model.config.max_seq_len} positions")
    out: list[str] = []
    for start in range(0, len(prompts), batch_size):
        ids = [encode_prompt(model, tokenizer, p)[-room:] for p in prompts[start:start + batch_size]]
        result = generate(model, ids, max_new_tokens=max_new_tokens, tokenizer=tokenizer, stop_strings=["\n"])
        out += [text.split("\n", 1)[0].strip() for text in decode_outputs(tokenizer, result, ["\n"])]
    return out


def few_shot(model, tokenizer, task: GenerativeTask, pool: Sequence[dict], queries: Sequence[dict],
             shots: Sequence[int], seeds: Sequence[int] = (0,), retrieved: Sequence[Sequence[Passage]] | None = None,
             rag_template: str = FEW_SHOT_TEMPLATE, **options: Any) -> dict[str, Any]:
    """The score at each k of ``shots`` for each seed (``options``: of :func:`answers`).

    With ``retrieved`` (each query's passages, :mod:`lmforge.prompting.rag`), every prompt is ``rag_template``
    with the query's passages and the few-shot prompt as its question.

    Returns:
        ``{"runs": [{"k", "seed", "score", "outputs"}], "table": [{"k", "mean", "std", "seeds"}]}``; k = 0 is
        the same for every seed, so it runs once. With ``task.cot`` a run also holds the extracted ``answers``
        (what is scored); ``outputs`` are the generated lines.
    """
    for k in shots:  # refuse before generating anything
        choose(len(pool), k, 0, 0)
    targets = [str(q[task.target_column]) for q in queries]
    runs = []
    for k in shots:
        for seed in seeds if k else seeds[:1]:
            prompts = [task.prompt(pool, idx, q) for idx, q in zip(choose(len(pool), k, seed, len(queries)), queries)]
            if retrieved is not None:
                prompts = [build_prompt(p, hits, rag_template) for p, hits in zip(prompts, retrieved)]
            outputs = answers(model, tokenizer, prompts, **options)
            predicted = [task.answer(o) for o in outputs]
            runs.append({"k": k, "seed": seed, "score": task.score(predicted, targets), "outputs": outputs,
                         **({"answers": predicted} if task.cot else {})})
    table = []
    for k in shots:
        scores = [r["score"] for r in runs if r["k"] == k]
        table.append({"k": k, "mean": statistics.fmean(scores),
                      "std": statistics.stdev(scores) if len(scores) > 1 else 0.0, "seeds": len(scores)})
    return {"runs": runs, "table": table}


# ---------------------------------------------------------------------------------- the command
# The settings of `lmforge prompt generate` (and of a prompt grid's cell, whose model, shots and seed are single).
PROMPT_DEFAULTS: dict[str, Any] = {
    "model": [], "task": None, "data": None, "pool": None, "template": None, "input_column": "text",
    "target_column": "target", "rationale_column": "rationale", "metric": "bleu", "cot": False, "shots": [0, 1, 4],
    "seeds": [0], "limit": 100, "max_new_tokens": 48, "batch_size": 8, "device": "cpu", "out": None,
    # retrieval-augmented prompts (lmforge.prompting.rag): an index folder, passages per query, their template,
    # and the encoder of the queries (default: the index's own)
    "index": None, "k": None, "rag_template": None, "rag_model": None,
}


def unescape(text: str) -> str:
    """``\\n`` and ``\\t`` typed on a command line, as the characters."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def read_rows(source: str, columns: tuple[str, ...] = ("text", "label")) -> list[dict]:
    """Rows of a TSV/JSONL file, or of a shipped (or generated: :data:`GENERATED`) data set given as
    ``NAME:SPLIT``, with ``columns``."""
    path = Path(source)
    if not path.exists():
        name, _, split = source.partition(":")
        if name in GENERATED:
            rows = GENERATED[name](split or "test")
        elif name in datasets.names():
            rows = datasets.load(name, split or "test")
        else:
            raise UserInputError(f"{source}: no such file, and {name!r} is not a shipped data set "
                                 f"({', '.join([*datasets.names(), *GENERATED])})")
    elif path.suffix in (".jsonl", ".json"):
        try:
            rows = [json.loads(line) for line in read_text_file(path).splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{source}: not valid JSON lines ({exc})") from None
    else:
        rows = datasets.read_tsv(path)
    if not rows:
        raise UserInputError(f"{source}: no rows")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise UserInputError(f"{source}: needs columns {' and '.join(columns)}; missing {missing} "
                             f"(has {sorted(rows[0])})")
    return rows


def few_shot_task(settings: dict[str, Any]) -> GenerativeTask:
    """The task the settings describe: a shipped one (``task``) or ``template`` + columns + ``metric``; ``cot``
    makes its demonstrations show ``rationale_column``."""
    if settings["task"] is not None:
        if settings["task"] not in TASKS:
            raise UserInputError(f"--task {settings['task']!r}: choose one of {', '.join(TASKS)}")
        task = TASKS[settings["task"]]
    else:
        if not (settings["data"] and settings["pool"] and settings["template"]):
            raise UserInputError("without --task, give --data, --pool and --template (with {x})")
        task = GenerativeTask(unescape(settings["template"]), settings["input_column"], settings["target_column"],
                              settings["metric"])
    if settings["cot"]:
        task = dataclasses.replace(task, rationale_column=settings["rationale_column"] or task.rationale_column,
                                   cot=True)
    return task


def few_shot_rows(settings: dict[str, Any], task: GenerativeTask) -> tuple[list[dict], list[dict]]:
    """(the demonstration pool, the first ``limit`` queries), checked for the task's columns."""
    name = settings["task"]
    pool_source = settings["pool"] or f"{name}:train"
    columns = (task.input_column, task.target_column)
    pool = read_rows(pool_source, columns)
    if task.cot and task.rationale_column not in pool[0]:
        raise UserInputError(f"--cot: the pool {pool_source} has no {task.rationale_column!r} column of rationales "
                             f"to show before the answers (has {sorted(pool[0])}); name it with --rationale-column")
    queries = read_rows(settings["data"] or f"{name}:test", columns)[: settings["limit"]]
    return pool, queries


def _check_counts(values: Any, key: str) -> list[int]:
    if not isinstance(values, list) or not values or not all(isinstance(v, int) and v >= 0 for v in values):
        raise UserInputError(f"{key}={values!r}: expected integers >= 0, e.g. 0,1,4,16")
    return values


def run_few_shot(settings: dict[str, Any], log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Score every model of ``settings`` (:data:`PROMPT_DEFAULTS` keys) at each k and seed; write ``table.md``,
    ``results.json`` and ``fewshot.png`` to ``out`` when it is set.

    Returns:
        what ``results.json`` holds: ``task, metric, cot, shots, seeds, queries`` and ``models`` (model -> the
        result of :func:`few_shot`), and ``table``, the Markdown table.
    """
    unknown = sorted(set(settings) - set(PROMPT_DEFAULTS))
    if unknown:
        raise UserInputError(f"unknown prompt setting(s) {', '.join(unknown)}; known: {', '.join(PROMPT_DEFAULTS)}")
    settings = {**PROMPT_DEFAULTS, **settings}
    shots, seeds = _check_counts(settings["shots"], "shots"), _check_counts(settings["seeds"], "seeds")
    task = few_shot_task(settings)
    pool, queries = few_shot_rows(settings, task)
    for k in shots:  # refuse before loading a model
        choose(len(pool), k, 0, 0)
    rag: dict[str, Any] = {}
    if settings["index"]:
        passages = 3 if settings["k"] is None else settings["k"]
        template = FEW_SHOT_TEMPLATE if settings["rag_template"] is None else \
            check_template(unescape(settings["rag_template"]))
        retriever = open_retriever(settings["index"], settings["rag_model"], device=settings["device"])
        rag = {"retrieved": retriever.retrieve([str(q[task.input_column]) for q in queries], passages),
               "rag_template": template}
        log(f"retrieved {passages} passages per query from {settings['index']}")
    results = {}
    for model_dir in settings["model"]:
        model, tokenizer = load_body(model_dir)
        model.to(settings["device"]).eval()
        log(f"{model_dir}: {len(queries)} queries, k in {shots}, seeds {seeds}"
            + (", chain-of-thought" if task.cot else ""))
        results[model_dir] = few_shot(model, tokenizer, task, pool, queries, shots, seeds, **rag,
                                      max_new_tokens=settings["max_new_tokens"], batch_size=settings["batch_size"])
    lines = [f"| model | {' | '.join(f'k={k}' for k in shots)} |", "|---|" + "---:|" * len(shots)]
    for name, result in results.items():
        cells = [f"{row['mean']:.2f} ± {row['std']:.2f}" for row in result["table"]]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    table = "\n".join(lines) + (f"\n\n{task.metric} (0-100){', chain-of-thought' if task.cot else ''}, mean ± std "
                                 f"over seeds {seeds}; {len(queries)} queries\n")
    record = {"task": settings["task"] or settings["data"], "metric": task.metric, "cot": task.cot, "shots": shots,
              "seeds": seeds, "queries": len(queries), "models": results}
    if rag:  # which passages each query read (index rows, cosines), as `lmforge generate` reports them
        record["retrieval"] = {"index": str(settings["index"]), "k": len(rag["retrieved"][0]) if queries else 0,
                               "passages": [[[p.id, round(p.score, 6)] for p in hits] for hits in rag["retrieved"]]}
    if settings["out"]:
        out = Path(settings["out"])
        atomic_write_text(out / "table.md", table)
        atomic_write_text(out / "results.json", json.dumps(record, indent=1) + "\n")
        atomic_write_bytes(out / "fewshot.png", plot({Path(m).name or m: r for m, r in results.items()}, task.metric))
    return {**record, "table": table}


def plot(results: dict[str, dict[str, Any]], metric: str) -> bytes:
    """PNG of score against k, one line (mean, ± std band) per model: GPT-3's few-shot figure."""
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, result in results.items():
        ks = [row["k"] for row in result["table"]]
        mean = [row["mean"] for row in result["table"]]
        std = [row["std"] for row in result["table"]]
        ax.plot(ks, mean, marker="o", label=name)
        ax.fill_between(ks, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("demonstrations in the prompt (k)")
    ax.set_ylabel(metric)
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()
