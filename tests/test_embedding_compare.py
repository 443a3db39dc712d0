"""The pieces of the embedding comparisons: averaged static embeddings, ELMo's learned scalar mix in the probe,
and ELMo's biLM behind the SentenceEncoder interface."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import embedding_helpers as h
import lmforge
from lmforge.embeddings import SentenceEncoder
from lmforge.embeddings.probe import format_table, learn_scalar_mix, plot, probe_layers
from lmforge.embeddings.static import AveragedEmbeddings
from lmforge.models.bilstm_lm import BiLM, BiLMConfig


def test_averaged_model_embeddings_are_the_mean_of_the_table_rows(tmp_path):
    tok = h.tokenizer(tmp_path)
    model = h.model(tok)
    avg = AveragedEmbeddings.from_model(model, tok)
    text = "the cat sat on the mat"
    ids = tok.encode(text, add_special_tokens=False)
    manual = model.embed_tokens.weight[ids].mean(0).detach().numpy()
    np.testing.assert_allclose(avg.encode([text], normalize=False)[0], manual, rtol=1e-6)
    unit = avg.encode([text, "cat the mat on sat the"])  # word order is invisible to an average
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(unit[0], unit[1], rtol=1e-6)
    assert not np.allclose(unit[0], avg.encode(["the dog ran to a big house"])[0])
    with pytest.raises(ValueError, match="only pool by mean"):
        avg.encode([text], pooling="cls")


def test_averaged_word2vec_skips_unknown_words_and_is_reproducible():
    pytest.importorskip("gensim")
    sentences = [s.split() for s in h.sentences(200)]
    a = AveragedEmbeddings.from_word2vec(sentences, dim=16, epochs=2, min_count=1, seed=3)
    b = AveragedEmbeddings.from_word2vec(sentences, dim=16, epochs=2, min_count=1, seed=3)
    vecs = a.encode(["The cat sat", "the cat sat zyzzyva", "zyzzyva qwerty"])
    np.testing.assert_allclose(vecs[0], vecs[1], rtol=1e-6)  # the unknown word adds nothing (and case is folded)
    assert not vecs[2].any()  # no known word: the zero vector, not NaN
    np.testing.assert_array_equal(vecs, b.encode(["The cat sat", "the cat sat zyzzyva", "zyzzyva qwerty"]))


def test_static_word_vectors_give_the_probe_one_layer_with_zeros_for_unknown_words():
    pytest.importorskip("gensim")
    sentences = [s.split() for s in h.sentences(200)]
    avg = AveragedEmbeddings.from_word2vec(sentences, dim=16, epochs=2, min_count=1, seed=3)
    per_sentence = avg.word_vectors_all_layers([["The", "cat", "zyzzyva"], ["sat"]])
    assert [v.shape for v in per_sentence] == [(1, 3, 16), (1, 1, 16)]
    first = per_sentence[0][0]
    np.testing.assert_array_equal(first[0], avg.encode(["the"], normalize=False)[0])  # case folded, not normalised
    assert first[0].any() and not np.allclose(first[0], first[1])  # one vector per word, not the sentence mean
    assert not first[2].any()  # out of the vocabulary: zeros, and the word keeps its place
    with pytest.raises(ValueError, match="single layer"):
        avg.word_vectors_all_layers([["cat"]], layers=[1])
    # through the probe: tags fixed by the word are read off the static layer, the only row
    rng = random.Random(0)
    tags = {"cat": "B-animal", "dog": "B-animal", "mat": "B-thing"}

    def tagged(n):
        return [{"tokens": (w := rng.sample(h.WORDS, 6)), "tags": [tags.get(x, "O") for x in w]} for _ in range(n)]

    rows = probe_layers(avg, tagged(60), tagged(30), max_iter=200)
    assert [r["layer"] for r in rows] == [0] and rows[0]["macro_f1"] > 0.8, rows


def test_corpus_sentences_reads_the_bundled_gzipped_corpus(tmp_path):
    import gzip

    from lmforge.datasets import path as dataset_path
    from lmforge.embeddings.static import corpus_sentences

    plain, packed = tmp_path / "c.txt", tmp_path / "c.txt.gz"
    plain.write_text("Emma's cat sat.\n\nIt ran!\n", encoding="utf-8")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    expected = [["Emma's", "cat", "sat", "."], ["It", "ran", "!"]]
    assert corpus_sentences([plain]) == corpus_sentences([packed]) == expected
    austen = corpus_sentences([dataset_path("corpus")])
    assert len(austen) > 1000 and all(austen)


def test_the_learned_scalar_mix_finds_the_informative_layer():
    rng = np.random.default_rng(0)
    W, D = 3000, 8
    y = rng.integers(0, 3, W)
    x = rng.normal(size=(3, W, D)).astype(np.float32)  # layers 0 and 2: pure noise
    x[1, :, :3] += 2.0 * np.eye(3)[y]  # layer 1: the class shifts the mean
    x[2] *= 50  # a loud but useless layer must not win by its scale
    weights, (mixed,) = learn_scalar_mix(x, y.astype(str), [x], epochs=20)
    assert weights.sum() == pytest.approx(1.0, abs=1e-6) and weights.argmax() == 1 and weights[1] > 0.6, weights
    assert mixed.shape == (W, D)


def test_probe_with_scalar_mix_on_an_elmo_encoder(tmp_path):
    """The biLM behind SentenceEncoder: N+1 = 3 states of size 2H, and a scalar-mix row whose weights sum to one;
    tags fixed by word identity are recoverable from every row."""
    tok = h.tokenizer(tmp_path)
    torch.manual_seed(0)
    lm = BiLM(BiLMConfig(vocab_size=tok.vocab_size, d_embed=16, d_hidden=16, n_layers=2, dropout=0.0)).eval()
    enc = SentenceEncoder(lm, tok)
    assert enc.n_states == 3 and enc.scalar_mix is lm.scalar_mix
    assert enc.encode(["the cat"]).shape == (1, 32)
    rng = random.Random(0)
    tags = {"john": "B-per", "mary": "B-per", "paris": "B-loc", "london": "B-loc"}

    def sentences(n):
        return [{"tokens": (w := rng.sample(h.WORDS, 6)), "tags": [tags.get(x, "O") for x in w]} for _ in range(n)]

    rows = probe_layers(enc, sentences(60), sentences(30), scalar_mix=True, max_iter=200)
    assert [r["layer"] for r in rows] == [0, 1, 2, "scalar-mix"]
    assert sum(rows[-1]["mix_weights"]) == pytest.approx(1.0, abs=1e-6)
    assert all(r["macro_f1"] > 0.8 for r in rows), rows
    assert "weights" in format_table(rows).splitlines()[-1]
    assert plot(rows, tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the saved folder round-trips through lmforge.load into the same encoder vectors
    folder = lmforge.save(lm, tmp_path / "elmo", tokenizer=tok)
    again = SentenceEncoder.load(folder)
    assert isinstance(again.model, BiLM)
    np.testing.assert_array_equal(again.encode(["the cat sat"], layer="scalar-mix"),
                                  enc.encode(["the cat sat"], layer="scalar-mix"))


def test_lmforge_probe_takes_a_bilm_folder_and_the_scalar_mix(wnut16_dir, tmp_path, capsys):
    import json

    from lmforge.cli.main import main

    tok = h.tokenizer(tmp_path)
    torch.manual_seed(0)
    lm = BiLM(BiLMConfig(vocab_size=tok.vocab_size, d_embed=8, d_hidden=8, n_layers=2, dropout=0.0))
    folder = lmforge.save(lm, tmp_path / "elmo", tokenizer=tok)
    ner = wnut16_dir
    out = tmp_path / "probe"
    assert main(["probe", "--model", str(folder), "--train", str(ner / "wnut16_train.conll"), "--eval",
                 str(ner / "wnut16_dev.conll"), "--limit", "8", "--max-iter", "30", "--scalar-mix",
                 "--out", str(out)]) == 0
    rows = json.loads((out / "probe.json").read_text())
    assert [r["layer"] for r in rows] == [0, 1, 2, "scalar-mix"]
    assert "scalar-mix" in capsys.readouterr().out
