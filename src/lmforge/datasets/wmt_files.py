"""WMT news translation sets, read as plain parallel text or in the official SGML.

Two layouts hold the same sentences: plain text, one sentence per line, with a file per language (``train.en`` +
``train.de``, ``newstest2014.en`` + ``newstest2014.de``: the copy Luong et al. publish at
nlp.stanford.edu/projects/nmt), or the official test sets' SGML from statmt.org (``newstest2014-deen-src.en.sgm``
+ ``newstest2014-deen-ref.de.sgm``: ``<seg id="N">sentence</seg>`` per line). A source file names its partner: the
target language's file of the same name, and for SGML the ``ref`` beside the ``src``. Segments are read in file
order, their text as sacrebleu reads SGML (the text between the tags, white space collapsed, no entity decoding).

Example:
    >>> partner(Path("newstest2014-deen-src.en.sgm"), "en", "de").name
    'newstest2014-deen-ref.de.sgm'
    >>> partner(Path("train.en"), "en", "de").name
    'train.de'
    >>> segments('<doc docid="1">\\n<seg id="1"> Hello  world </seg>\\n</doc>', sgml=True)
    ['Hello world']
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from lmforge.data.sources import DataError
from lmforge.errors import InputFileNotFound

_SEG = re.compile(r"<seg[^>]*>(.*)</seg>")


def partner(file: Path, source: str, target: str) -> Path:
    """The target-language file that pairs with the source-language ``file``."""
    if file.name.endswith(".sgm"):
        return file.with_name(file.name.replace(f"-src.{source}.sgm", f"-ref.{target}.sgm"))
    return file.with_suffix(f".{target}")


def segments(text: str, sgml: bool) -> list[str]:
    """The sentences of one file: its lines, or an SGML file's ``<seg>`` contents."""
    if sgml:
        return [re.sub(r"\s+", " ", m.group(1).strip()) for m in (_SEG.search(line) for line in text.splitlines()) if m]
    return text.rstrip("\n").split("\n") if text.strip() else []


def pair_reader(source: str, target: str) -> Callable[[Path, str], tuple[list[dict[str, Any]], list[int | None]]]:
    """A reader of ``source`` -> ``target`` files: rows ``{source: sentence, target: translation}``."""

    def read(file: Path, split: str) -> tuple[list[dict[str, Any]], list[int | None]]:
        other = partner(file, source, target)
        if not other.is_file():
            raise InputFileNotFound(f"{other}: not found; the {source} file {file.name} needs its {target} side "
                                    "beside it")
        sgml = file.name.endswith(".sgm")
        a = segments(file.read_text(encoding="utf-8"), sgml)
        b = segments(other.read_text(encoding="utf-8"), sgml)
        if len(a) != len(b):
            raise DataError(f"{other}: {len(b)} sentences, but {file.name} has {len(a)} (one translation each)")
        rows = [{source: x, target: y} for x, y in zip(a, b)]
        return rows, (list(range(1, len(rows) + 1)) if not sgml else [None] * len(rows))

    return read
