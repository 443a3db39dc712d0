"""Per-layer linear probes: end to end on WNUT-16 sentences (table + PNG), and a probe that must succeed."""

from __future__ import annotations

import json
import random

import pytest

import embedding_helpers as h
from lmforge.cli.main import main
from lmforge.datasets import read_conll
from lmforge.embeddings import SentenceEncoder
from lmforge.embeddings.probe import probe_layers


def test_probe_cli_end_to_end_on_wnut16_writes_table_and_png(wnut16_dir, tmp_path, capsys):
    folder = h.model_folder(tmp_path, "bert")
    ner = wnut16_dir
    out = tmp_path / "probe"
    assert main(["probe", "--model", str(folder), "--task", "tag", "--train", str(ner / "wnut16_train.conll"),
                 "--eval", str(ner / "wnut16_dev.conll"), "--limit", "12", "--out", str(out), "--max-iter", "50"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["layer", "accuracy", "macro_f1"]
    rows = json.loads((out / "probe.json").read_text())
    assert [r["layer"] for r in rows] == [0, 1, 2]  # embeddings + 2 blocks
    n_eval = sum(len(s["tokens"]) for s in read_conll(ner / "wnut16_dev.conll")[:12])
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["eval_words"] == n_eval for r in rows)
    assert (out / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "probe.txt").read_text().strip() == "\n".join(printed.splitlines()[:4])


def test_a_probe_recovers_tags_that_word_identity_determines(tmp_path):
    """Tags fixed by the word ('john' -> B-per, 'paris' -> B-loc): even random features make them linearly
    separable, so every layer's probe must score far above the majority-class rate."""
    tok = h.tokenizer(tmp_path, "bert")
    enc = SentenceEncoder(h.model(tok, "bert"), tok)
    rng = random.Random(0)
    tags = {"john": "B-per", "mary": "B-per", "paris": "B-loc", "london": "B-loc"}

    def sentences(n):
        out = []
        for _ in range(n):
            words = rng.sample(h.WORDS, 6)
            out.append({"tokens": words, "tags": [tags.get(w, "O") for w in words]})
        return out

    rows = probe_layers(enc, sentences(60), sentences(30), max_iter=200)
    assert len(rows) == 3
    assert all(r["macro_f1"] > 0.8 and r["accuracy"] > 0.95 for r in rows), rows
    with pytest.raises(ValueError, match="single tag"):
        probe_layers(enc, [{"tokens": ["a", "b"], "tags": ["O", "O"]}], sentences(2))
