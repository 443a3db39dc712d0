"""A sliding-window lexical-overlap baseline for extractive QA (after Rajpurkar et al. 2016, 5).

SQuAD's "sliding window baseline" scores each candidate answer by the question words found around it, in the
manner of Richardson et al. (2013, MCTest): rare passage words count more. This module's exact definition:

- the context is split into words (runs of letters/digits, or one punctuation mark), compared lower-cased;
- candidates are the spans of 1 to ``max_words`` consecutive words that neither start nor end with
  punctuation and contain no word of the question (an answer rarely repeats the question);
- a candidate's window is the ``window`` words on each side of it, the candidate itself left out;
- its score is the sum, over the distinct question words in the window, of their inverse passage count
  ``IC(w) = log(1 + 1 / count(w in the context))`` (MCTest's weighting);
- the answer is the best-scoring candidate; ties go to the shorter span, then to the earlier one. It is the
  context's characters from the span's first word to its last.

Rajpurkar et al. also filter candidates by constituent parses and sentence overlap; no parser is used here.
Nothing is learned: the settings (``window``, ``max_words``) are all there is.

Example:
    >>> answer("Who wrote Hamlet?", "In 1600 Shakespeare wrote Hamlet.", window=2, max_words=2)
    ('Shakespeare', 8, 19)

(``1600 Shakespeare`` has the same window words, and loses the tie as the longer span; ``In 1600`` sees only
``Shakespeare`` and ``wrote``.)
"""

from __future__ import annotations

import math
import re
from collections import Counter

WORD = re.compile(r"\w+|[^\w\s]")


def _words(text: str) -> list[tuple[str, int, int]]:
    return [(m.group().lower(), m.start(), m.end()) for m in WORD.finditer(text)]


def _is_word(token: str) -> bool:
    return bool(re.match(r"\w", token))


def answer(question: str, context: str, window: int = 10, max_words: int = 4) -> tuple[str, int, int]:
    """``(answer text, start, end)`` (character offsets in ``context``) by the rule of the module docstring."""
    words = _words(context)
    q = {w for w, _, _ in _words(question) if _is_word(w)}
    count = Counter(w for w, _, _ in words)
    best, best_key = None, None
    for i in range(len(words)):
        for j in range(i, min(i + max_words, len(words))):
            span = [w for w, _, _ in words[i:j + 1]]
            if not _is_word(span[0]) or not _is_word(span[-1]):
                continue
            if q & set(span):
                break  # every longer span from i holds the same question word
            around = {w for w, _, _ in words[max(0, i - window):i] + words[j + 1:j + 1 + window]}
            score = sum(math.log(1 + 1 / count[w]) for w in around & q)
            key = (-score, j - i, i)
            if best_key is None or key < best_key:
                best, best_key = (i, j), key
    if best is None:
        return "", 0, 0
    start, end = words[best[0]][1], words[best[1]][2]
    return context[start:end], start, end
