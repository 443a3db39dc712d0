"""Tiny tokenizers and randomly initialised bodies for the prompting tests (each forward takes milliseconds)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

import lmforge
from lmforge.tokenization import train_tokenizer

POS, NEG = ["good", "great", "lovely", "superb"], ["bad", "awful", "dull", "poor"]
FILL = ["the", "film", "plot", "was", "a", "movie", "really", "very", "and", "it", "review", "overall"]
KINDS = {"bert": "wordpiece", "gpt": "byte-bpe", "t5": "unigram"}
PRESETS = {"bert": "bert-tiny", "gpt": "gpt-tiny", "t5": "t5-tiny", "llama": "llama-tiny"}


def sentiment_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        words = rng.sample(FILL, 4) + [rng.choice(POS if label else NEG)]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": str(label)})
    return rows


def tokenizer(folder: Path, family: str):
    text = [r["text"] for r in sentiment_rows(200)] + ["N/A it was terrible , superbly lovely ."] * 5
    path = folder / "corpus.txt"
    path.write_text("\n\n".join(text) + "\n", encoding="utf-8")
    sizes = {"bert": 200, "gpt": 320, "t5": 260}
    return train_tokenizer([path], kind=KINDS[family], vocab_size=sizes[family], family=family, min_frequency=1,
                           show_progress=False)


def body(preset: str, tok, seed: int = 0, **overrides):
    """A 2-layer model whose weights are jittered so that its distributions are far from uniform."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    ids = {k: v for k, v in tok.special_token_ids().items() if k.endswith("_token_id")}
    cfg = dict(n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size, max_seq_len=128, dropout=0.0)
    if preset.startswith("t5"):
        cfg.update(n_decoder_layers=2, head_dim=16)
    if preset.startswith("bert"):
        cfg.update(attn_dropout=0.0)
    if preset.startswith("llama"):
        cfg.update(n_kv_heads=1)
    cfg.update(overrides)
    model = lmforge.build_model(preset, **cfg, **ids)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()
