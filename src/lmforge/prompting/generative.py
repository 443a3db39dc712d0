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

Example:
    >>> task = GenerativeTask("English: {x}\\nSpanish:", "en", "es")
    >>> pool = [{"en": "one", "es": "uno"}, {"en": "two", "es": "dos"}]
    >>> print(task.prompt(pool, [1], {"en": "three"}))
    English: two
    Spanish: dos
    <BLANKLINE>
    English: three
    Spanish:
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from lmforge.errors import UserInputError
from lmforge.generation import generate
from lmforge.generation.generate import decode_outputs, encode_prompt
from lmforge.prompting.icl import select_random
from lmforge.tasks import metrics

METRICS = ("bleu", "exact_match", "f1")


@dataclass(frozen=True)
class GenerativeTask:
    """A prompt ``template`` with ``{x}`` (the input), the input and target columns, and the metric."""

    template: str
    input_column: str
    target_column: str
    metric: str = "bleu"
    separator: str = "\n\n"

    def __post_init__(self) -> None:
        if self.template.count("{x}") != 1:
            raise UserInputError(f"the prompt template needs one {{x}} (the input): {self.template!r}")
        if self.metric not in METRICS:
            raise UserInputError(f"metric {self.metric!r}: choose one of {', '.join(METRICS)}")

    def prompt(self, pool: Sequence[dict], chosen: Sequence[int], query: dict) -> str:
        demos = "".join(self.template.replace("{x}", str(pool[j][self.input_column])) + " "
                        + str(pool[j][self.target_column]) + self.separator for j in chosen)
        return demos + self.template.replace("{x}", str(query[self.input_column]))

    def score(self, outputs: Sequence[str], targets: Sequence[str]) -> float:
        """The metric, on a 0-100 scale."""
        if self.metric == "bleu":
            return metrics.bleu(outputs, targets)
        return 100 * metrics.qa(outputs, [[t] for t in targets])[self.metric]


# The shipped generative task: KJV -> Reina-Valera 1909 verse translation (GPT-2's and GPT-3's translation set-up).
TASKS = {"kjv-rv1909": GenerativeTask("English: {x}\nSpanish:", "en", "es", "bleu")}


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
             shots: Sequence[int], seeds: Sequence[int] = (0,), **options: Any) -> dict[str, Any]:
    """The score at each k of ``shots`` for each seed (``options``: of :func:`answers`).

    Returns:
        ``{"runs": [{"k", "seed", "score", "outputs"}], "table": [{"k", "mean", "std", "seeds"}]}``; k = 0 is
        the same for every seed, so it runs once.
    """
    for k in shots:  # refuse before generating anything
        choose(len(pool), k, 0, 0)
    targets = [str(q[task.target_column]) for q in queries]
    runs = []
    for k in shots:
        for seed in seeds if k else seeds[:1]:
            prompts = [task.prompt(pool, idx, q) for idx, q in zip(choose(len(pool), k, seed, len(queries)), queries)]
            outputs = answers(model, tokenizer, prompts, **options)
            runs.append({"k": k, "seed": seed, "score": task.score(outputs, targets), "outputs": outputs})
    table = []
    for k in shots:
        scores = [r["score"] for r in runs if r["k"] == k]
        table.append({"k": k, "mean": statistics.fmean(scores),
                      "std": statistics.stdev(scores) if len(scores) > 1 else 0.0, "seeds": len(scores)})
    return {"runs": runs, "table": table}


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
