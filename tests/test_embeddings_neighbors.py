"""Contextual neighbours of word occurrences and the static PPMI/word2vec baseline."""

from __future__ import annotations

import importlib

import pytest

import embedding_helpers as h
from lmforge.cli.main import main
from lmforge.embeddings import SentenceEncoder
from lmforge.embeddings.neighbors import contextual_neighbors, occurrences, ppmi_svd_vectors, static_neighbors

THEATRE = ["she saw a play in london", "the play in the big house was a play about mary"]
SPORT = ["john likes to play the game", "mary and john play a game on the river"]


def _corpus(repeat=10):
    return [s.split() for s in (THEATRE + SPORT) * repeat]


@pytest.mark.parametrize("method", ["ppmi", "word2vec"])
def test_static_baseline_puts_words_of_identical_contexts_together(method):
    if method == "word2vec":
        importlib.import_module("gensim")
    sents = [s.split() for s in ["the cat sat on the mat", "the dog sat on the log", "a river ran to paris"] * 30]
    near = [w for w, _ in static_neighbors(sents, "cat", k=20, method=method, dim=8)]
    assert "cat" not in near
    if method == "ppmi":  # exact counts: the identical-context word is the first neighbour
        assert near[0] == "dog"
    else:  # skip-gram on a toy corpus is noisier, but a shared context still beats an unrelated sentence
        assert near.index("dog") < min(near.index(w) for w in ("river", "paris", "ran"))
    with pytest.raises(ValueError, match="does not occur"):
        static_neighbors(sents, "zebra", method=method)


def test_ppmi_vectors_have_one_row_per_type():
    vocab, vectors = ppmi_svd_vectors(_corpus(2), dim=5)
    assert vocab == sorted(set(w for s in _corpus(1) for w in s)) and vectors.shape == (len(vocab), 5)


def test_contextual_neighbours_exclude_self_and_find_the_identical_context(tmp_path):
    tok = h.tokenizer(tmp_path, "bert")
    enc = SentenceEncoder(h.model(tok, "bert"), tok)
    sents = _corpus(1) + [SPORT[0].split()]  # a repeated sentence: its 'play' has an exact twin
    found = occurrences(sents, "PLAY")
    assert found == [(0, 3), (1, 1), (1, 8), (2, 3), (3, 3), (4, 3)]
    result = contextual_neighbors(enc, sents, "play", k=2, queries=len(found))
    by_query = {(r["sentence"], r["position"]): r["neighbors"] for r in result}
    top = by_query[(2, 3)][0]
    assert top[:2] == (4, 3) and top[2] == pytest.approx(1.0, abs=1e-5)
    for (s, i), neighbours in by_query.items():
        assert (s, i) not in [(a, b) for a, b, _ in neighbours]
    # the same type in different sentences gets different vectors: cosines below 1 except the twin
    assert all(c < 0.9999 for q, n in by_query.items() if q not in [(2, 3), (4, 3)] for _, _, c in n)
    with pytest.raises(ValueError, match="at least 2"):
        contextual_neighbors(enc, sents, "london")


def test_neighbors_cli_prints_both_views(tmp_path, capsys):
    folder = h.model_folder(tmp_path, "bert")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(s) for s in _corpus(5)) + "\n", encoding="utf-8")
    assert main(["neighbors", "--model", str(folder), "--corpus", str(corpus), "--word", "play", "--static", "ppmi",
                 "--queries", "2", "-k", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("static (ppmi) neighbours of 'play':")
    assert out.count("<play>") == 2 * (1 + 2)  # two queries, each with two neighbours
    assert main(["neighbors", "--model", str(folder), "--corpus", str(corpus), "--word", "zebra"]) == 2
