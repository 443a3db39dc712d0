"""Stages 1 and 2: write the pre-training corpora, train a tokenizer per model family, prepare token shards.

    corpus    text                                               tokenizer                     shards for
    english   Austen's novels + rt-sentiment's training reviews  gpt: byte-level BPE           gpt-tiny
                                                                 bert: lower-cased WordPiece
    reviews   rt-sentiment's training reviews alone              (bert's WordPiece)            bert-tiny
    bible     KJV verses and their Reina-Valera 1909 Spanish     t5: BPE + 100 sentinels       t5-tiny

The reviews' *text* (never their labels) joins the English corpus because pre-training on the task's domain
is most of what a few minutes of pre-training can give a classifier (Howard & Ruder 2018; Gururangan et al.
2020); the test split stays unseen. bert-tiny, which the sentiment stages fine-tune, pre-trains on the
reviews alone (its WordPiece vocabulary is still learnt from the whole English corpus): its few hundred
masked-LM steps are worth more spent on the task's domain than spread over Austen (measured: about 2.5 points
of test accuracy after fine-tuning; docs/lab/notes-quickstart-pretraining.md). The T5 corpus is bilingual so that
span corruption already shows the model Spanish before it learns to translate. T5 itself uses a unigram
vocabulary; BPE with the same special tokens trains about ten times faster, which matters in a one-minute
budget.

Smaller budgets use a proportional share of each corpus (never less than a few hundred documents).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from lmforge import datasets
from lmforge.data.prepare import prepare
from lmforge.quickstart.context import Context
from lmforge.tokenization import train_tokenizer
from lmforge.utils.io import atomic_write_text

VOCAB_SIZE = 8192  # the presets' vocabulary size
REVIEWS_PER_DOCUMENT = 20  # reviews are single sentences: group them into documents of a paragraph's length
TOKENIZERS = {  # family -> (corpus, kind, lowercase)
    "gpt": ("english", "byte-bpe", False),
    "bert": ("english", "wordpiece", True),
    "t5": ("bible", "bpe", False),
}
SHARDS = {  # shards (named for the family that pre-trains on them) -> (corpus, tokenizer family)
    "gpt": ("english", "gpt"),
    "bert": ("reviews", "bert"),
    "t5": ("bible", "t5"),
}
VAL_FRACTION = 0.05
MIN_VAL_DOCUMENTS = 8  # expected held-out documents at least: a short budget's reviews corpus has ~60 in all


def _reviews(ctx: Context) -> list[str]:
    reviews = [r["text"] for r in datasets.load("rt-sentiment", "train")]
    groups = [" ".join(reviews[i:i + REVIEWS_PER_DOCUMENT]) for i in range(0, len(reviews), REVIEWS_PER_DOCUMENT)]
    return groups[:ctx.scaled(len(groups), floor=60)]


def _english(ctx: Context) -> list[str]:
    chapters = [r["text"] for r in datasets.load("corpus")]
    chapters = chapters[:ctx.scaled(len(chapters), floor=60)]
    groups = _reviews(ctx)
    # Interleave, so that any prefix of the corpus (and each shard) mixes both kinds of text.
    mixed = [d for pair in itertools.zip_longest(chapters, groups) for d in pair if d]
    return mixed


def _bible(ctx: Context) -> list[str]:
    chapters: dict[str, dict[str, list[str]]] = {}
    for row in datasets.load("kjv-rv1909", "train"):
        chapter = row["ref"].rsplit(".", 1)[0]  # "Gen.1.1" -> "Gen.1"
        entry = chapters.setdefault(chapter, {"en": [], "es": []})
        entry["en"].append(row["en"])
        entry["es"].append(row["es"])
    keep = list(chapters.values())[:ctx.scaled(len(chapters), floor=100)]
    return [" ".join(c[lang]) for c in keep for lang in ("en", "es")]


CORPORA = {"english": _english, "reviews": _reviews, "bible": _bible}


def write_corpus(documents: list[str], path: Path) -> Path:
    """One document per paragraph block, blank lines between documents (the format ``data prepare`` reads)."""
    atomic_write_text(path, "\n\n".join(d.strip() for d in documents if d.strip()) + "\n")
    return path


def tokenizers(ctx: Context, seconds: float) -> dict[str, Any]:
    """Stage ``tokenizers``: write the corpora and train one tokenizer per family."""
    corpora = {}
    for name, make in CORPORA.items():
        docs = make(ctx)
        path = write_corpus(docs, ctx.path("corpora", f"{name}.txt"))
        corpora[name] = {"path": ctx.relative(path), "documents": len(docs), "bytes": path.stat().st_size}
    trained = {}
    for family, (corpus, kind, lowercase) in TOKENIZERS.items():
        tok = train_tokenizer([ctx.path(corpora[corpus]["path"])], kind=kind, vocab_size=VOCAB_SIZE, family=family,
                              lowercase=lowercase, show_progress=ctx.progress)
        folder = tok.save(ctx.path("tokenizers", family))
        sample = "It is a truth universally acknowledged."
        trained[family] = {"path": ctx.relative(folder), "kind": kind, "corpus": corpus, "vocab_size": tok.vocab_size,
                           "sample_tokens": tok.tokenize(sample)}
        ctx.log(f"{family}: {kind}, {tok.vocab_size:,} tokens; {sample!r} -> {len(tok.tokenize(sample))} tokens")
    kinds = ", ".join(f"{f} {t['kind']}" for f, t in trained.items())
    return {"corpora": corpora, "tokenizers": trained,
            "summary": f"{len(trained)} vocabularies of {VOCAB_SIZE:,} tokens ({kinds})"}


def data(ctx: Context, seconds: float) -> dict[str, Any]:
    """Stage ``data``: tokenise each family's corpus (:data:`SHARDS`) into shards with its tokenizer."""
    tokenizers = ctx.result("tokenizers")
    prepared = {}
    for family, (corpus, tokenizer) in SHARDS.items():
        source = ctx.path(tokenizers["corpora"][corpus]["path"])
        out = ctx.path("data", family)
        # The split is by document: a small corpus needs a larger fraction for a batch of held-out sequences.
        val_fraction = max(VAL_FRACTION, MIN_VAL_DOCUMENTS / tokenizers["corpora"][corpus]["documents"])
        manifest = prepare([source], ctx.path(tokenizers["tokenizers"][tokenizer]["path"]), out,
                           val_fraction=val_fraction, overwrite=True, progress=ctx.progress)
        splits = manifest["splits"]
        prepared[family] = {"path": ctx.relative(out), "corpus": corpus, "train_tokens": splits["train"]["tokens"],
                            "val_tokens": splits.get("val", {}).get("tokens", 0),
                            "train_documents": splits["train"].get("documents")}
        ctx.log(f"{family}: {prepared[family]['train_tokens']:,} training tokens, "
                f"{prepared[family]['val_tokens']:,} validation tokens")
    shown = " / ".join(f"{p['train_tokens'] / 1e6:.2f}M" for p in prepared.values())
    return {"data": prepared, "summary": f"{shown} training tokens ({', '.join(prepared)})"}
