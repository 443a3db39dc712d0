"""Sentence-BERT's STS table: Spearman correlation of embedding cosines with the gold scores, with no training.

Reimers & Gurevych (2019), Table 1 scores sentence embeddings "without using any STS-specific training data":
each pair is embedded, the cosine of the two vectors is the predicted similarity, and the score is Spearman's
rank correlation between the cosines and the gold scores, x 100. The row is STS12-16 (SemEval), STS-B (test)
and SICK-R (test), and their average::

    lmforge evaluate --task sts/stsb --model all-MiniLM-L6-v2 --data-dir DIR     one set
    lmforge evaluate --task sts --model all-MiniLM-L6-v2 --data-dir DIR          the row: STS12 ... SICK-R, avg

``DIR`` holds the sets in their official layouts (:mod:`lmforge.datasets.sts_files`). A year's subsets (STS12's
MSRpar, MSRvid, ...) are pooled into one correlation, SentEval's "all" setting (Gao et al. 2021, SimCSE,
Appendix B, set out how it differs from the mean over subsets that SentEval also prints). Any model folder that
:class:`~lmforge.embeddings.SentenceEncoder` loads works, with its saved pooling (else mean pooling), the
vectors L2-normalised.

Example:
    >>> names_of("sts"), names_of("sts/stsb"), names_of("glue/stsb")
    (['sts/sts12', 'sts/sts13', 'sts/sts14', 'sts/sts15', 'sts/sts16', 'sts/stsb', 'sts/sickr'], ['sts/stsb'], None)
    >>> column("sts/sickr")
    'SICK-R'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmforge.datasets import benchmarks as layouts
from lmforge.embeddings.encoder import SentenceEncoder, load_encoder
from lmforge.embeddings.sbert import evaluate_sts
from lmforge.errors import UserInputError
from lmforge.evaluation import benchmarks

SUITE = "sts"
ROW = ("sts/sts12", "sts/sts13", "sts/sts14", "sts/sts15", "sts/sts16", "sts/stsb", "sts/sickr")
_COLUMNS = {"sts/stsb": "STS-B", "sts/sickr": "SICK-R"}


def names_of(task: str | None) -> list[str] | None:
    """The STS sets ``task`` stands for (``sts``: SBERT's whole row), or None when it is not one."""
    if task == SUITE:
        return list(ROW)
    return [task] if task in ROW else None


def column(name: str) -> str:
    """The set's column title in SBERT's table (``sts/sts12``: STS12)."""
    return _COLUMNS.get(name, name.split("/")[1].upper())


def splits(name: str, split: str | None = None) -> list[str]:
    """The splits scored: ``split``, else the set's evaluation splits (a year: all its subsets)."""
    if split is None:
        return list(benchmarks.get(name).evals)
    known = list(layouts.LAYOUTS[name].files)
    if split not in known:
        raise UserInputError(f"--split {split}: {name} has no split {split!r} (splits: {', '.join(known)})")
    return [split]


def pairs(name: str, data_dir: str | Path | None = None, split: str | None = None,
          limit: int | None = None) -> list[dict[str, Any]]:
    """The scored pairs of one set as ``{text1, text2, label}`` (the rows :func:`evaluate_sts` reads)."""
    out = []
    for s in splits(name, split):
        rows = layouts.read(name, s, data_dir)[1]
        out += [{"text1": r["sentence1"], "text2": r["sentence2"], "label": r["score"]} for r in rows[:limit]]
    return out


def evaluate(model: str | Path | SentenceEncoder, task: str, data_dir: str | Path | None = None, *,
             split: str | None = None, batch_size: int = 64, device: str = "cpu", limit: int | None = None,
             pooling: str | None = None) -> dict[str, float]:
    """``{column: Spearman x 100}`` for each set ``task`` names (``sts``: the row, plus ``avg``).

    Every set is read before the model is loaded, so a missing file is reported at once. ``limit``: the first
    N pairs of each split.
    """
    names = names_of(task)
    if names is None:
        raise UserInputError(f"--task {task}: not an STS set (choose sts, or one of {', '.join(ROW)})")
    if split is not None and len(names) > 1:
        raise UserInputError("--split names one set's split; give --task sts/NAME with it, or drop --split")
    sets = {name: pairs(name, data_dir, split, limit) for name in names}
    encoder = model if isinstance(model, SentenceEncoder) else load_encoder(model, device=device)
    scores: dict[str, float] = {}
    for name, rows in sets.items():
        rho = evaluate_sts(encoder, rows, pooling=pooling, batch_size=batch_size)["spearman"]
        if rho is None:
            raise UserInputError(f"{name}: every gold score is the same; a correlation is undefined")
        scores[column(name)] = 100 * rho
    if len(scores) > 1:
        scores["avg"] = sum(scores.values()) / len(scores)
    return scores


def table_lines(scores: dict[str, float]) -> list[str]:
    """SBERT's row as two aligned lines: the set names, then the Spearman x 100 of each."""
    width = {k: max(len(k), 6) for k in scores}
    return ["  ".join(f"{k:>{width[k]}s}" for k in scores), "  ".join(f"{v:>{width[k]}.2f}" for k, v in scores.items())]
