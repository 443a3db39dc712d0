"""The ``demo-instructions`` set: instruction/response pairs written from the shipped public-domain texts.

An instruction-tuning set (Alpaca-style ``instruction``, ``input``, ``output``) that ships with lmforge, so that
``lmforge finetune --task instruct --train demo-instructions`` needs no file of the user's. Every row comes from
data whose licence lets a derived set be redistributed: the KJV, Reina-Valera 1909 and World English Bible
verses (public domain), Jane Austen's novels (public domain) and generated arithmetic problems (the project's
own). The Rotten Tomatoes sentences of ``rt-sentiment`` are left out: VADER redistributes them for research and
evaluation, and a training set that ships for any use should not inherit that restriction.

    kind          source                       input                          output
    translate-es  kjv-rv1909                   an English (KJV) verse         the Spanish (RV 1909) verse
    translate-en  kjv-rv1909                   a Spanish (RV 1909) verse      the English (KJV) verse
    next-verse    kjv-rv1909                   a KJV verse                    the verse that follows it
    modernize     bible-paraphrase (label 1)   a KJV verse                    the same verse in the WEB
    continue      corpus (Austen)              a sentence of narration        the sentence after it
    novel         corpus (Austen)              a paragraph                    the novel it is from
    arithmetic    lmforge.datasets.arithmetic  a word problem                 worked steps, "The answer is N."

Each kind has several phrasings of its instruction, one drawn per row. Splits: ``train`` draws from the train
split of each Bible set (split by chapter, so no verse is in both), from nine in ten Austen chapters and from
the start of the arithmetic demonstration pool; ``dev`` from the dev splits, the other Austen chapters (every
tenth) and the end of that pool. No arithmetic problem of the chain-of-thought test queries is used. A row's
input and output have at most :data:`MAX_CHARS` characters together, so that a whole row fits the 128-token
windows the quickstart pre-trains its decoder on (characters, not words: Spanish and archaic English cost an
English vocabulary more tokens per word); a verse is the input of at most one row of a split.

Every random step uses ``random.Random(SEED)`` (one generator per split, data in its shipped order), so
``python -m lmforge.datasets.instructions`` rewrites the shipped files byte for byte (see ``SOURCES.md``).

Example:
    >>> rows = build_kind("arithmetic", "dev", 2)
    >>> [r["kind"] for r in rows], rows[0]["output"].endswith(".")
    (['arithmetic', 'arithmetic'], True)
    >>> sentences('Mr. Bennet smiled. "Is it?" she said. Yes.')
    ['Mr. Bennet smiled.', '"Is it?" she said.', 'Yes.']
"""

from __future__ import annotations

import random
import re
from typing import Any

COLUMNS = ("kind", "instruction", "input", "output")
SEED = 1234
MAX_CHARS = 170  # input + output; with the instruction and template about 120 tokens of an 8k English BPE at most
# rows per kind and split: about 1,700 train and 215 dev rows in all
COUNTS = {"translate-es": (300, 40), "translate-en": (200, 25), "next-verse": (250, 30), "modernize": (250, 30),
          "continue": (250, 30), "novel": (150, 20), "arithmetic": (300, 40)}
SPLITS = ("train", "dev")
INSTRUCTIONS = {
    "translate-es": ("Translate this verse into Spanish.", "Translate to Spanish.",
                     "What is this sentence in Spanish?", "Give the Spanish version of this verse."),
    "translate-en": ("Translate this verse into English.", "Translate to English.",
                     "What does this Spanish verse say in English?", "Give the English version of this verse."),
    "next-verse": ("Which verse comes after this one?", "Continue with the next verse.",
                   "Quote the verse that follows.", "What is the next verse of the King James Bible?"),
    "modernize": ("Rewrite this King James verse in modern English.", "Say this verse in plain modern English.",
                  "Paraphrase this verse the way the World English Bible does.",
                  "Put this old-fashioned verse into today's English."),
    "continue": ("Continue this passage by Jane Austen with one sentence.", "What sentence comes next?",
                 "Write the next sentence of this passage.", "Continue the text."),
    "novel": ("Which Jane Austen novel is this passage from?", "Name the Austen novel this paragraph comes from.",
              "From which of Jane Austen's novels is this text?"),
    "arithmetic": ("Solve this word problem. Show your working.", "Work out the answer step by step.",
                   "Answer the question, explaining each step.", "How many are there? Think it through."),
}
# the documents of the shipped corpus, in order: (novel, chapters); see SOURCES.md
NOVELS = (("Sense and Sensibility", 50), ("Pride and Prejudice", 61), ("Mansfield Park", 48), ("Emma", 55),
          ("Northanger Abbey", 32), ("Persuasion", 24))
ABBREVIATIONS = {"Mr.", "Mrs.", "Dr.", "St.", "Col.", "Capt.", "Esq.", "Messrs."}
_BREAK = re.compile(r"(?<=[.!?])\s+(?=[\"'A-Z])|(?<=[.!?][\"'])\s+(?=[\"'A-Z])")


def sentences(paragraph: str) -> list[str]:
    """The sentences of a paragraph: breaks after ``.``/``!``/``?`` (and a closing quote) before a capital or an
    opening quote, except after a title such as ``Mr.``."""
    out: list[str] = []
    for piece in _BREAK.split(paragraph):
        if out and (out[-1].rsplit(" ", 1)[-1] in ABBREVIATIONS or re.search(r"\b[A-Z]\.$", out[-1])):
            out[-1] += " " + piece
        else:
            out.append(piece)
    return out


def _short(*texts: str) -> bool:
    return sum(len(t) for t in texts) <= MAX_CHARS


def _parts(ref: str) -> tuple[str, int, int]:
    book, chapter, verse = ref.rsplit(".", 2)
    return book, int(chapter), int(verse)


def _bible_pairs(kind: str, split: str) -> list[tuple[str, str, str]]:
    """(ref, input, output) candidates of a Bible kind, in the shipped order."""
    from lmforge import datasets

    if kind == "modernize":
        return [(r["ref1"], r["text1"], r["text2"]) for r in datasets.load("bible-paraphrase", split)
                if r["label"] == 1 and _short(r["text1"], r["text2"])]
    verses = datasets.load("kjv-rv1909", split)
    if kind == "translate-es":
        return [(v["ref"], v["en"], v["es"]) for v in verses if _short(v["en"], v["es"])]
    if kind == "translate-en":
        return [(v["ref"], v["es"], v["en"]) for v in verses if _short(v["en"], v["es"])]
    by_ref = {v["ref"]: v["en"] for v in verses}
    pairs = []
    for v in verses:
        book, chapter, verse = _parts(v["ref"])
        after = by_ref.get(f"{book}.{chapter}.{verse + 1}")
        if after is not None and after != v["en"] and _short(v["en"], after):
            pairs.append((v["ref"], v["en"], after))
    return pairs


def _chapters(split: str) -> list[tuple[str, str]]:
    """(novel, chapter text) of the Austen chapters of ``split``: every tenth chapter is dev."""
    from lmforge import datasets

    documents = [d["text"] for d in datasets.load("corpus")]
    novels = [title for title, n in NOVELS for _ in range(n)]
    assert len(novels) == len(documents), "the corpus's chapters per novel changed (see SOURCES.md)"
    return [(novels[i], doc) for i, doc in enumerate(documents) if (i % 10 == 9) == (split == "dev")]


def _austen_pairs(kind: str, split: str) -> list[tuple[str, str, str]]:
    pairs = []
    for c, (novel, chapter) in enumerate(_chapters(split)):
        for p, paragraph in enumerate(chapter.split("\n")):
            where = f"{novel}:{c}:{p}"
            if kind == "novel":
                if len(paragraph.split()) >= 12 and _short(paragraph, f"{novel}."):
                    pairs.append((where, paragraph, f"{novel}."))
                continue
            if '"' in paragraph:  # dialogue: a sentence cut from a speech would open a quote it never closes
                continue
            said = sentences(paragraph)
            for i in range(len(said) - 1):
                if 5 <= len(said[i].split()) and 5 <= len(said[i + 1].split()) and _short(said[i], said[i + 1]):
                    pairs.append((f"{where}:{i}", said[i], said[i + 1]))
    return pairs


def _arithmetic_pairs(split: str, n: int) -> list[tuple[str, str, str]]:
    from lmforge.datasets import arithmetic

    pool = arithmetic.split("train")  # the demonstration pool: never a chain-of-thought test query
    rows = pool[:len(pool) - n] if split == "train" else pool[len(pool) - n:]
    return [(f"arithmetic:{i}", r["text"], f"{r['rationale']} The answer is {r['target']}.")
            for i, r in enumerate(rows)]


def _candidates(kind: str, split: str) -> list[tuple[str, str, str]]:
    if kind == "arithmetic":
        return _arithmetic_pairs(split, COUNTS[kind][1])
    if kind in ("continue", "novel"):
        return _austen_pairs(kind, split)
    return _bible_pairs(kind, split)


def build_kind(kind: str, split: str, n: int, rng: random.Random | None = None,
               used: set[str] | None = None) -> list[dict[str, str]]:
    """``n`` rows of one kind (``rng`` draws which candidates and phrasings; ``used``: refs to skip, updated)."""
    rng = rng or random.Random(SEED)
    used = set() if used is None else used
    pool = [c for c in _candidates(kind, split) if c[0] not in used]
    if len(pool) < n:
        raise ValueError(f"{kind}/{split}: {len(pool)} candidates, {n} wanted")
    rows = []
    for ref, given, answer in rng.sample(pool, n) if kind != "arithmetic" else pool[:n]:
        used.add(ref)
        rows.append({"kind": kind, "instruction": rng.choice(INSTRUCTIONS[kind]), "input": given, "output": answer})
    return rows


def build(split: str) -> list[dict[str, str]]:
    """Every row of ``split`` (``train`` or ``dev``), kinds mixed by a seeded shuffle."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng, used = random.Random(SEED), set()
    rows: list[dict[str, Any]] = []
    for kind, (train, dev) in COUNTS.items():
        rows += build_kind(kind, split, train if split == "train" else dev, rng, used)
    rng.shuffle(rows)
    return rows


def files() -> dict[str, bytes]:
    """The shipped files' bytes, by file name (gzip as ``SOURCES.md`` states)."""
    from lmforge.datasets.next_verse import tsv_gz

    return {f"demo_instructions_{split}.tsv.gz": tsv_gz(build(split), COLUMNS) for split in SPLITS}


def main() -> None:
    from lmforge import datasets
    from lmforge.utils.io import atomic_write_bytes

    for name, data in files().items():
        atomic_write_bytes(datasets.FILES / name, data)
        print(name, len(data))


if __name__ == "__main__":
    main()
