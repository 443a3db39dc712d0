"""Toy data, tiny tokenizers and tiny bodies for the task tests (every model here trains in milliseconds a step).

The toy tasks are learnable from a handful of words, so a few dozen steps separate a working pipeline from a
broken one: sentiment hangs on one polar word, tags on name words, answers on the city in the context.
"""

from __future__ import annotations

import json
import random
from pathlib import Path


import lmforge
from lmforge.tokenization import train_tokenizer
from lmforge.training.config import TrainConfig

POS, NEG = ["good", "great", "lovely", "superb"], ["bad", "awful", "dull", "poor"]
FILL = ["the", "film", "plot", "was", "a", "movie", "really", "very", "and", "it"]
CITIES, PEOPLE = ["paris", "london", "rome", "lima"], ["john", "mary", "ana", "omar"]
NUMBERS = {"one": "uno", "two": "dos", "three": "tres", "four": "cuatro", "five": "cinco"}
KINDS = {"bert": "wordpiece", "gpt": "byte-bpe", "t5": "unigram", "bart": "bpe"}
PRESETS = {"bert": "bert-tiny", "gpt": "gpt-tiny", "t5": "t5-tiny", "bart": "bart-tiny"}


def sentiment_rows(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        words = rng.sample(FILL, 4) + [rng.choice(POS if label else NEG)]
        rng.shuffle(words)
        rows.append((" ".join(words), str(label)))
    return rows


def write_tsv(path: Path, header: list[str], rows) -> Path:
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows), encoding="utf-8")
    return path


def write_sentiment(path: Path, n: int = 64, seed: int = 0) -> Path:
    return write_tsv(path, ["text", "label"], sentiment_rows(n, seed))


def write_conll(path: Path, n: int = 40, seed: int = 0) -> Path:
    rng = random.Random(seed)
    blocks = []
    for _ in range(n):
        words = [(w, "O") for w in rng.sample(FILL, 3)]
        words.insert(rng.randrange(len(words) + 1), (rng.choice(PEOPLE), "B-per"))
        words.append((rng.choice(CITIES), "B-loc"))
        blocks.append("\n".join(f"{w}\t{t}" for w, t in words))
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def write_qa(path: Path, n: int = 40, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        city, person = rng.choice(CITIES), rng.choice(PEOPLE)
        context = f"{person} lives in {city} and likes the {rng.choice(FILL[1:3])}"
        lines.append(json.dumps({"question": f"where does {person} live ?", "context": context,
                                 "answers": {"text": [city], "answer_start": [context.index(city)]}}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_numbers(path: Path, n: int = 40, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(list(NUMBERS)) for _ in range(rng.randint(1, 3))]
        rows.append((" ".join(words), " ".join(NUMBERS[w] for w in words)))
    return write_tsv(path, ["source", "target"], rows)


def corpus(folder: Path) -> Path:
    text = [t for t, _ in sentiment_rows(200)] + [" ".join(NUMBERS) + " " + " ".join(NUMBERS.values())]
    text += [f"{p} lives in {c} where does {p} live ?" for p in PEOPLE for c in CITIES]
    text += ["positive negative"] * 5
    path = folder / "corpus.txt"
    path.write_text("\n\n".join(text) + "\n", encoding="utf-8")
    return path


def tokenizer(folder: Path, family: str):
    sizes = {"bert": 200, "gpt": 320, "t5": 260, "bart": 200}
    return train_tokenizer([corpus(folder)], kind=KINDS[family], vocab_size=sizes[family], family=family,
                           min_frequency=1, show_progress=False)


def body(family: str, tok, **overrides):
    ids = {k: v for k, v in tok.special_token_ids().items() if k.endswith("_token_id")}
    cfg = dict(n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size, max_seq_len=64, dropout=0.0)
    if family in ("t5", "bart"):
        cfg.update(n_decoder_layers=2)
    if family == "t5":
        cfg.update(head_dim=16)
    if family == "bert":
        cfg.update(attn_dropout=0.0)
    cfg.update(overrides)
    return lmforge.build_model(PRESETS[family], **cfg, **ids)


def train_config(steps: int = 6, **changes) -> TrainConfig:
    settings = dict(max_steps=steps, batch_size=8, lr=3e-3, eval_every=steps, save_every=steps, progress=False,
                    tensorboard=False, precision="fp32", schedule="constant", weight_decay=0.0)
    settings.update(changes)
    return TrainConfig(**settings)
