"""The ``bible-next-verse`` multiple-choice set: given a KJV verse, pick the verse that follows it.

A SWAG-style task (Zellers et al. 2018) built from the shipped ``kjv-rv1909`` verses, split by split, so a
chapter's verses stay in its split. For every verse ``v`` whose successor ``v+1`` (same chapter) is in the
split, the choices are ``v+1`` and three distractors drawn from the other verses of the same book in the same
split (not ``v``, not ``v+1``, no text equal to either), so topic words alone rarely give the answer away:
the model has to follow the narrative. The right choice's position is drawn uniformly. Every random step uses
``random.Random(seed)`` over the verses in canonical order; the train split is then subsampled (a seeded
shuffle keeps ``limit`` rows, written back in canonical order). ``python -m lmforge.datasets.next_verse``
rewrites the shipped files (see ``SOURCES.md``).

Columns: ``ref`` (the context verse), ``context``, ``choice0``..``choice3``, ``label`` (index of ``v+1``).

Example:
    >>> verses = [{"ref": f"Gen.1.{i}", "en": f"verse {i}"} for i in range(1, 7)]
    >>> rows = build(verses)
    >>> len(rows), rows[0]["context"], rows[0][f"choice{rows[0]['label']}"]
    (5, 'verse 1', 'verse 2')
"""

from __future__ import annotations

import gzip
import io
import random
from collections import defaultdict
from typing import Any, Sequence

COLUMNS = ("ref", "context", "choice0", "choice1", "choice2", "choice3", "label")
CHOICES = 4
SEED = 1234
TRAIN_ROWS = 4000


def _parts(ref: str) -> tuple[str, int, int]:
    book, chapter, verse = ref.rsplit(".", 2)
    return book, int(chapter), int(verse)


def build(verses: Sequence[dict[str, Any]], seed: int = SEED, limit: int | None = None) -> list[dict[str, Any]]:
    """Multiple-choice rows from ``{"ref", "en"}`` verses of one split (see the module docstring)."""
    rng = random.Random(seed)
    by_ref = {v["ref"]: v["en"] for v in verses}
    by_book: dict[str, list[str]] = defaultdict(list)
    for v in verses:
        by_book[_parts(v["ref"])[0]].append(v["ref"])
    rows = []
    for v in verses:
        book, chapter, verse = _parts(v["ref"])
        answer_ref = f"{book}.{chapter}.{verse + 1}"
        if answer_ref not in by_ref:
            continue
        answer = by_ref[answer_ref]
        pool = [r for r in by_book[book] if by_ref[r] not in (v["en"], answer)]
        if len(set(by_ref[r] for r in pool)) < CHOICES - 1:
            continue
        distractors: list[str] = []
        while len(distractors) < CHOICES - 1:
            text = by_ref[rng.choice(pool)]
            if text not in distractors:
                distractors.append(text)
        label = rng.randrange(CHOICES)
        choices = distractors[:label] + [answer] + distractors[label:]
        rows.append({"ref": v["ref"], "context": v["en"], **{f"choice{k}": c for k, c in enumerate(choices)},
                     "label": label})
    if limit is not None and len(rows) > limit:
        keep = list(range(len(rows)))
        random.Random(seed).shuffle(keep)
        rows = [rows[i] for i in sorted(keep[:limit])]
    return rows


def tsv_gz(rows: Sequence[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> bytes:
    """Rows as a TSV (header first) in the shipped files' convention (only a field that begins with ``"`` is
    CSV-quoted), compressed reproducibly (gzip level 9, no name, mtime 0)."""

    def field(value: Any) -> str:
        text = str(value)
        return '"' + text.replace('"', '""') + '"' if text.startswith('"') else text

    lines = ["\t".join(columns)] + ["\t".join(field(row[c]) for c in columns) for row in rows]
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))
    return out.getvalue()


def main() -> None:
    from lmforge import datasets
    from lmforge.utils.io import atomic_write_bytes

    for split in ("train", "dev", "test"):
        rows = build(datasets.load("kjv-rv1909", split), limit=TRAIN_ROWS if split == "train" else None)
        atomic_write_bytes(datasets.FILES / f"bible_next_verse_{split}.tsv.gz", tsv_gz(rows))
        print(split, len(rows))


if __name__ == "__main__":
    main()
