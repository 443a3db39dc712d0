"""Pooling, layers, the scalar mix and word alignment of lmforge.embeddings.SentenceEncoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import embedding_helpers as h
from lmforge.embeddings import POOLINGS, ScalarMix, SentenceEncoder, pool


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    tok = h.tokenizer(tmp_path_factory.mktemp("bert"), "bert")
    return SentenceEncoder(h.model(tok, "bert"), tok)


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    tok = h.tokenizer(tmp_path_factory.mktemp("gpt"), "gpt")
    return SentenceEncoder(h.model(tok, "gpt"), tok)


def test_pool_matches_manual_computation():
    hidden = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    for b, n in enumerate([5, 2, 3]):
        real = hidden[b, :n]
        torch.testing.assert_close(pool(hidden, mask, "mean")[b], real.mean(0))
        torch.testing.assert_close(pool(hidden, mask, "max")[b], real.max(0).values)
        torch.testing.assert_close(pool(hidden, mask, "cls")[b], hidden[b, 0])
        torch.testing.assert_close(pool(hidden, mask, "last")[b], hidden[b, n - 1])
    with pytest.raises(ValueError, match="pooling"):
        pool(hidden, mask, "median")


def test_max_pooling_ignores_padding_even_when_it_is_larger():
    hidden = -torch.ones(1, 3, 2)
    hidden[0, 2] = 100.0  # a padding position holding the largest values
    assert pool(hidden, torch.tensor([[1, 1, 0]]), "max").tolist() == [[-1.0, -1.0]]


@pytest.mark.parametrize("family", ["bert", "gpt"])
@pytest.mark.parametrize("pooling", POOLINGS)
def test_padding_does_not_change_sentence_embeddings(request, family, pooling):
    enc = request.getfixturevalue(family)
    short = "the cat sat"
    alone = enc.encode([short], pooling=pooling, sort_by_length=False)
    batched = enc.encode([short, "the big red dog ran to the small house on the river in paris"], pooling=pooling,
                         sort_by_length=False)
    ids = enc.tokenize([short, "the big red dog ran to the small house"])["attention_mask"]
    assert ids[0].sum() < ids.shape[1]  # the short text really was padded
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-5)


def test_encode_equals_manual_mean_pool_of_the_model_output(bert):
    texts = ["the cat sat on the mat", "john lives in paris", "a dog"]
    got = bert.encode(texts, pooling="mean", batch_size=2)  # two batches, sorted by length internally
    batch = bert.tokenizer.encode_batch(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = bert.model(batch["input_ids"], attention_mask=batch["attention_mask"])
    m = batch["attention_mask"][..., None].float()
    want = torch.nn.functional.normalize((out.last_hidden_state * m).sum(1) / m.sum(1), dim=-1)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    raw = bert.encode(texts, pooling="mean", normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_layer_k_is_that_hidden_state_and_decoder_default_is_last_token(bert, gpt):
    batch = bert.tokenize(["the cat sat"])
    with torch.no_grad():
        states = bert.model(batch["input_ids"], attention_mask=batch["attention_mask"],
                            output_hidden_states=True).hidden_states
    for k in (0, 1, 2, -1):
        got = bert.encode(["the cat sat"], pooling="cls", layer=k, normalize=False)
        np.testing.assert_allclose(got[0], states[k][0, 0].numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="layer"):
        bert.encode(["x"], layer=7)
    assert gpt.pooling == "last" and bert.pooling == "mean"


def test_scalar_mix_weights_sum_to_one_and_start_as_the_layer_average(bert):
    mix = ScalarMix(4)
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.3, -2.0, 1.5, 0.0]))
        mix.gamma.fill_(2.0)
    assert float(mix.weights.sum().detach()) == pytest.approx(1.0)
    assert bool((mix.weights > 0).all())
    layers = [torch.randn(2, 3, 5) for _ in range(4)]
    want = 2.0 * sum(w * l for w, l in zip(torch.softmax(mix.scalars, 0), layers))
    torch.testing.assert_close(mix(layers), want)
    # untrained, the encoder's mix is the plain average of the N+1 hidden states
    batch = bert.tokenize(["john lives in paris"])
    with torch.no_grad():
        states = bert.hidden_states(batch["input_ids"], batch["attention_mask"])
        mixed = bert.token_states(batch["input_ids"], batch["attention_mask"], "scalar-mix")
    torch.testing.assert_close(mixed, torch.stack(states).mean(0))


def test_word_vectors_average_each_words_subwords(bert):
    words = [["the", "cat", "sat"], ["john", "lives", "in", "paris", "catdog"]]
    vecs = bert.word_vectors(words, layer=1)
    assert [v.shape for v in vecs] == [(3, 32), (5, 32)]
    batch = bert.tokenize(words, words=True)
    with torch.no_grad():
        state = bert.hidden_states(batch["input_ids"], batch["attention_mask"])[1][1]  # sentence 2, layer 1
    word_ids = batch["word_ids"][1]
    pieces = [t for t, w in enumerate(word_ids) if w == 4]
    assert len(pieces) > 1  # the made-up word is split into sub-words
    np.testing.assert_allclose(vecs[1][4], state[pieces].mean(0).numpy(), atol=1e-5)
    first = bert.word_vectors(words, layer=1, reduce="first")
    np.testing.assert_allclose(first[1][4], state[pieces[0]].numpy(), atol=1e-5)
    # the same word in another context gets another vector: the representation is contextual
    assert not np.allclose(vecs[0][0], bert.word_vectors([["the", "river"]], layer=-1)[0][0])
