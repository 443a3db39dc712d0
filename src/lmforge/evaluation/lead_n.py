"""Lead-3: a summary made of the source's first three sentences (the first row of BART's and PEGASUS's tables).

News articles put their gist first, so the lead sentences are a strong summarization baseline (See et al. 2017;
Lewis et al. 2020, Table 3). Sentences end at ``.``, ``!`` or ``?`` (optionally followed by a closing quote or
bracket) followed by white space; the summary is the first ``n`` of them joined by one space. Nothing is learned.
On a task that is not summarization (translation, say) it only copies the source.

Example:
    >>> lead("One. Two! Three? Four.", 3)
    'One. Two! Three?'
    >>> sentences('He said "Go." Then he left.')
    ['He said "Go."', 'Then he left.']
"""

from __future__ import annotations

import re

_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"'\u201d\u2019)\]])\s+")


def sentences(text: str) -> list[str]:
    return [s for s in (part.strip() for part in _END.split(text.strip())) if s]


def lead(text: str, n: int = 3) -> str:
    """The first ``n`` sentences of ``text``."""
    return " ".join(sentences(text)[:n])
