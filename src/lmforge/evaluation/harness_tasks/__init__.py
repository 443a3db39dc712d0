"""lmforge's own lm-evaluation-harness tasks: small, local, made from the shipped data sets.

    lmforge_next_verse   multiple_choice: a KJV verse, then which of 4 verses follows it (acc, acc_norm);
                         the first 200 rows of ``bible-next-verse``'s test split, its first 20 train rows
                         for few-shot examples
    lmforge_austen_ppl   loglikelihood_rolling: 40 passages (consecutive paragraphs, >= 1,200 characters
                         each) of the last 3 chapters of the shipped ``corpus`` (word_perplexity,
                         byte_perplexity, bits_per_byte)

Each task is an lm_eval YAML file beside its data (JSON lines, read through ``dataset_path: json``), so
``lmforge evaluate --harness lmforge_next_verse`` and ``lm_eval --include_path THIS_FOLDER`` both find them.
``data_files`` are written relative to the YAML's folder; :func:`lmforge.evaluation.harness.resolve_data_files`
makes them absolute before lm_eval reads them (lm_eval itself reads them relative to the working folder).

Pre-training on the corpus for these tasks should leave the last :data:`HELD_OUT_CHAPTERS` chapters out, so
the perplexity is measured on text the model has not seen (``benchmarks/harness_three_ways.py`` does).
``python -m lmforge.evaluation.harness_tasks`` rewrites the data files from the shipped sets.

Example:
    >>> [len(p) for p in passages(["a" * 700 + "\\n" + "b" * 700 + "\\n" + "c" * 10], min_chars=1200)]
    [1401]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

FOLDER = Path(__file__).parent
HELD_OUT_CHAPTERS = 3
PASSAGES = 40
MIN_CHARS = 1200
MC_TEST_ROWS = 200
MC_FEWSHOT_ROWS = 20


def passages(chapters: Sequence[str], min_chars: int = MIN_CHARS) -> list[str]:
    """Runs of consecutive paragraphs (lines) of each chapter, each at least ``min_chars`` long; a chapter's
    short remainder is dropped (a passage never spans two chapters)."""
    out = []
    for chapter in chapters:
        run: list[str] = []
        for paragraph in (p for p in chapter.split("\n") if p.strip()):
            run.append(paragraph)
            if sum(map(len, run)) + len(run) - 1 >= min_chars:
                out.append("\n".join(run))
                run = []
    return out


def _mc_row(row: dict) -> dict:
    return {"ref": row["ref"], "context": row["context"], "choices": [row[f"choice{k}"] for k in range(4)],
            "label": row["label"]}


def _jsonl(rows: Sequence[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def build(folder: Path = FOLDER) -> dict[str, int]:
    """Write the tasks' data files into ``folder`` from the shipped data sets; returns rows per file."""
    from lmforge import datasets
    from lmforge.utils.io import atomic_write_text

    chapters = [r["text"] for r in datasets.load("corpus")][-HELD_OUT_CHAPTERS:]
    files = {
        "next_verse_test.jsonl": [_mc_row(r) for r in datasets.load("bible-next-verse", "test")[:MC_TEST_ROWS]],
        "next_verse_train.jsonl": [_mc_row(r) for r in datasets.load("bible-next-verse", "train")[:MC_FEWSHOT_ROWS]],
        "austen_passages.jsonl": [{"text": t} for t in passages(chapters)[:PASSAGES]],
    }
    for name, rows in files.items():
        atomic_write_text(folder / name, _jsonl(rows))
    return {name: len(rows) for name, rows in files.items()}
