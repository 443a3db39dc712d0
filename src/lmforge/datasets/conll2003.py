"""CoNLL-2003 English NER files (Tjong Kim Sang & De Meulder 2003), read as the official release lays them out.

``eng.train``, ``eng.testa`` (dev) and ``eng.testb`` (test) hold one word per line, ``word POS chunk NER``
separated by spaces, a blank line after each sentence and a ``-DOCSTART- -X- -X- O`` line between documents::

    EU NNP I-NP I-ORG
    rejects VBZ I-VP O
    German JJ I-NP I-MISC

The original files tag in IOB1: an entity begins with ``I-``, and ``B-`` appears only where an entity directly
follows another of the same type. lmforge's tagger and seqeval's entity F1 read IOB2 (BIO: every entity begins
with ``B-``), the scheme papers since Lample et al. (2016) report, so the NER and chunk columns are converted as
they are read. The conversion changes nothing in a copy that is already IOB2 (as some redistributions are).

Example:
    >>> iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"])
    ['B-PER', 'I-PER', 'O', 'B-LOC', 'B-LOC', 'B-ORG']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmforge.data.sources import DataError

COLUMNS = ("tokens", "pos", "chunk", "tags")


def iob1_to_iob2(tags: list[str]) -> list[str]:
    """IOB1 tags as IOB2: an ``I-X`` that does not continue an entity of type X (after ``O``, another type, or
    at the start) begins one, so it becomes ``B-X``."""
    out = []
    for k, tag in enumerate(tags):
        before = tags[k - 1] if k else "O"
        if tag.startswith("I-") and (before == "O" or before[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
    return out


def read(file: Path, split: str) -> tuple[list[dict[str, Any]], list[int | None]]:
    """Sentences of one CoNLL-2003 file as ``{tokens, pos, chunk, tags}`` rows (lists; tags in IOB2), and the
    line each sentence starts on."""
    rows: list[dict[str, Any]] = []
    lines: list[int | None] = []
    words: list[list[str]] = []
    first = None

    def close() -> None:
        if words:
            tokens, pos, chunk, ner = (list(c) for c in zip(*words))
            rows.append({"tokens": tokens, "pos": pos, "chunk": iob1_to_iob2(chunk), "tags": iob1_to_iob2(ner)})
            lines.append(first)
        words.clear()

    with open(file, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            parts = line.split()
            if not parts or parts[0] == "-DOCSTART-":
                close()
                continue
            if len(parts) != 4:
                raise DataError(f"{file}: line {number}: expected 4 columns 'word POS chunk NER', got {len(parts)} "
                                f"({line.strip()!r})")
            if not words:
                first = number
            words.append(parts)
    close()
    return rows, lines
