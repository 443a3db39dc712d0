"""ROUGE as summarization papers report it: ROUGE-1, -2, -L and -Lsum F-measures (rouge-score, Porter stemming).

ROUGE-L scores the longest common subsequence (LCS) of the two summaries as single texts. ROUGE-Lsum is Lin's
(2004) summary-level LCS: both summaries are split into sentences and each reference sentence is matched, by
union LCS, against all the candidate's sentences, so a summary that says the same things in another order loses
nothing. rouge-score reads the sentences of ROUGE-Lsum as the lines of its input, so every text is put one
sentence per line first (the sentence splitter of :mod:`lmforge.evaluation.lead_n`, inside the lines a text
already has, such as CNN/DailyMail's highlights), as Hugging Face's summarization scripts do before scoring
BART and PEGASUS on CNN/DailyMail and XSum. Scores are means over the items, on rouge-score's 0-1 scale.

Example:
    >>> s = rouge(["The cat sat. It purred."], ["It purred. The cat sat."])
    >>> round(s["rougeL"], 3), round(s["rougeLsum"], 3)
    (0.6, 1.0)
"""

from __future__ import annotations

from typing import Sequence

from lmforge.evaluation.lead_n import sentences
from lmforge.tasks.metrics import _library

KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def sentence_lines(text: str) -> str:
    """``text`` with one sentence per line (the form ROUGE-Lsum reads)."""
    return "\n".join(s for line in text.splitlines() for s in sentences(line))


def rouge(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """``{"rouge1", "rouge2", "rougeL", "rougeLsum"}``: mean F-measure of each candidate against its reference."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} summaries for {len(references)} references")
    scorer = _library("rouge_score.rouge_scorer").RougeScorer(list(KEYS), use_stemmer=True)
    totals = dict.fromkeys(KEYS, 0.0)
    for hyp, ref in zip(hypotheses, references):
        for key, score in scorer.score(sentence_lines(ref), sentence_lines(hyp)).items():
            totals[key] += score.fmeasure
    n = max(len(hypotheses), 1)
    return {k: v / n for k, v in totals.items()}
