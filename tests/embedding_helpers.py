"""A tiny BERT-style and GPT-style model with trained tokenizers, for the embedding tests (milliseconds a forward)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

import lmforge
from lmforge.tokenization import train_tokenizer

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "log", "ran", "to", "a", "big", "small", "red", "house",
         "river", "john", "mary", "paris", "london", "lives", "in", "where", "playing", "play", "game"]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def tokenizer(folder: Path, family: str = "bert"):
    corpus = folder / "corpus.txt"
    corpus.write_text("\n\n".join(sentences(300)) + "\n", encoding="utf-8")
    kind = {"bert": "wordpiece", "gpt": "byte-bpe"}[family]
    return train_tokenizer([corpus], kind=kind, vocab_size={"bert": 120, "gpt": 300}[family], family=family,
                           min_frequency=1, show_progress=False)


def model(tok, family: str = "bert", **overrides):
    torch.manual_seed(0)
    ids = {k: v for k, v in tok.special_token_ids().items() if k.endswith("_token_id")}
    cfg = dict(n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size, max_seq_len=64, dropout=0.0)
    if family == "bert":
        cfg.update(attn_dropout=0.0)
    cfg.update(overrides)
    return lmforge.build_model({"bert": "bert-tiny", "gpt": "gpt-tiny"}[family], **cfg, **ids).eval()


def model_folder(folder: Path, family: str = "bert") -> Path:
    """A saved model folder (config, weights, tokenizer.json) as `lmforge embed --model` expects."""
    tok = tokenizer(folder, family)
    return lmforge.save(model(tok, family), folder / f"{family}-model", tokenizer=tok)
