"""ELMo as the paper built it: the character CNN (by hand; unseen words), LSTM projections, layer features in
BiLMOutput, a trainable scalar mix whose weights sum to 1, and a char-CNN biLM pre-trained end to end."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge import checkpoint as model_checkpoint
from lmforge.models.bilstm_lm import PRESETS, BiLM, BiLMConfig, bilm_labels
from lmforge.nn.char_cnn import BOW, EOW, CharCNN, Highway, char_ids
from lmforge.nn.scalar_mix import ScalarMix
from test_pretrain_bilm import config
from test_training_pretrain import data_root, prepared  # noqa: F401  (tokenizer + shards of 60 kB of Austen)

VOCAB = ["[PAD]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]


def char_lm(**changes) -> BiLM:
    torch.manual_seed(0)
    cfg = dict(vocab_size=len(VOCAB), d_embed=8, d_hidden=12, d_proj=8, n_layers=2, dropout=0.0, char_cnn=True,
               char_filters=[[1, 4], [2, 4], [3, 6]], max_chars=10)
    lm = BiLM(BiLMConfig(**{**cfg, **changes}))
    lm.set_token_chars(VOCAB)
    return lm.eval()


def test_char_ids_are_utf8_bytes_between_word_markers():
    ids = char_ids(["ab", "ñ", "abcdefgh"], max_chars=6)
    assert ids[0].tolist() == [BOW, ord("a") + 1, ord("b") + 1, EOW, 0, 0]
    assert ids[1].tolist() == [BOW, 0xC3 + 1, 0xB1 + 1, EOW, 0, 0]  # ñ is two UTF-8 bytes
    assert ids[2].tolist() == [BOW, *(ord(c) + 1 for c in "abcd"), EOW]  # cut to max_chars - 2 characters


def test_char_cnn_equals_a_hand_computation():
    torch.manual_seed(0)
    cnn = CharCNN(output_dim=3, filters=((2, 2),), n_highway=1, d_char=4)
    chars = char_ids(["hi"], max_chars=5)[0]  # BOW h i EOW pad
    e = cnn.embed_chars.weight[chars]  # (5, 4)
    W, b = cnn.convs[0].weight, cnn.convs[0].bias  # (2, 4, 2), (2,)
    conv = torch.stack([torch.stack([(W[f] * e[t:t + 2].T).sum() + b[f] for t in range(4)]) for f in range(2)])
    pooled = conv.max(1).values.relu()  # (2,)
    h, g = (cnn.highways[0].proj.weight @ pooled + cnn.highways[0].proj.bias).chunk(2)
    highway = torch.sigmoid(g) * h.relu() + (1 - torch.sigmoid(g)) * pooled
    want = cnn.proj.weight @ highway + cnn.proj.bias
    torch.testing.assert_close(cnn(chars[None])[0], want)
    # a highway gate at 0 passes its input through unchanged
    hw = Highway(3)
    with torch.no_grad():
        hw.proj.bias[3:] = -1e4
    x = torch.randn(2, 3)
    torch.testing.assert_close(hw(x), x)


def test_the_char_cnn_handles_unseen_words():
    lm = char_lm()
    # A word in the vocabulary: its character path equals its id path.
    ids = torch.tensor([[1, 2, 3]])  # "the cat sat"
    chars = char_ids(["the", "cat", "sat"], 10)[None]  # (1, 3, C)
    torch.testing.assert_close(lm.layer_states(ids), lm.layer_states(None, char_ids=chars))
    # Words the vocabulary never had get their own vectors, built from their characters.
    unseen = char_ids(["cats", "dogs", "zebra"], 10)[None]  # (1, 3, C): none of them is in VOCAB
    x = lm.embed(char_ids=unseen)[0]  # (3, E)
    assert torch.isfinite(x).all()
    assert not torch.allclose(x[0], x[1]) and not torch.allclose(x[1], x[2])
    # "cats" shares its characters with "cat": it lies nearer to "cat" than "zebra" does
    cat = lm.embed(torch.tensor([[2]]))[0, 0]
    assert F.cosine_similarity(x[0], cat, 0) > F.cosine_similarity(x[2], cat, 0)
    # and the contextual layers run over them too
    layers = lm.layer_states(None, char_ids=unseen)
    assert len(layers) == 3 and all(l.shape == (1, 3, 16) and torch.isfinite(l).all() for l in layers)
    # A table-based biLM has no such vectors: its input is ids only.
    with pytest.raises(ValueError, match="no character CNN"):
        BiLM(BiLMConfig(vocab_size=9, d_embed=8, d_hidden=8)).embed(char_ids=unseen)


def test_layer_zero_is_the_cnn_vector_duplicated_and_it_is_trained_by_the_lm_loss():
    lm = char_lm().train()
    ids = torch.tensor([[1, 2, 3, 4, 1, 5], [6, 7, 8, 0, 0, 0]])
    mask = (ids != 0).long()
    out = lm(ids, attention_mask=mask, labels=bilm_labels(ids, mask), output_hidden_states=True)
    x = lm.embed(ids)
    torch.testing.assert_close(out.hidden_states[0], torch.cat([x, x], -1))
    for got, want in zip(out.hidden_states, lm.layer_states(ids, mask)):
        torch.testing.assert_close(got, want)
    out.loss.backward()
    for name, p in lm.char_cnn.named_parameters():
        if name != "embed_chars.weight":  # its padding row aside, checked below
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert lm.char_cnn.embed_chars.weight.grad[ord("c") + 1].abs().sum() > 0  # "cat" was read
    assert not hasattr(lm, "layer0")  # no untrained projection left in layer 0


def test_lstm_projections_set_the_layer_size_and_parameter_count():
    lm = BiLM(BiLMConfig(vocab_size=20, d_embed=6, d_hidden=10, d_proj=6, n_layers=2, dropout=0.0))
    assert lm.config.d_model == 12 and [l.shape[-1] for l in lm.layer_states(torch.tensor([[1, 2, 3]]))] == [12] * 3
    # LSTMP: 4 gates of H cells over [input; projected state P], biases twice, and the P x H projection
    H, P = 10, 6
    per_layer = [4 * H * (6 + P) + 8 * H + P * H, 4 * H * (P + P) + 8 * H + P * H]
    assert sum(p.numel() for p in lm.forward_lm.parameters()) == sum(per_layer)
    with pytest.raises(ValueError, match="d_embed .* must equal the LSTM output size"):
        BiLMConfig(vocab_size=20, d_embed=8, d_hidden=10, d_proj=6, char_cnn=True)
    with pytest.raises(ValueError, match="max_chars=4"):
        BiLMConfig(vocab_size=20, d_embed=10, d_hidden=10, char_cnn=True, max_chars=4)


def test_the_scalar_mix_is_trainable_and_its_weights_always_sum_to_one():
    torch.manual_seed(0)
    layers = [torch.randn(4, 5, 6) for _ in range(3)]
    target = 3.0 * layers[2]  # a task that needs the top layer, scaled: s_2 and gamma must grow
    mix = ScalarMix(3)
    optimizer = torch.optim.SGD(mix.parameters(), lr=0.5)
    first = None
    for _ in range(60):
        loss = F.mse_loss(mix(layers), target)
        first = float(loss) if first is None else first
        optimizer.zero_grad()
        loss.backward()
        assert mix.scalars.grad.abs().sum() > 0 and mix.gamma.grad.abs() > 0
        optimizer.step()
        assert float(mix.weights.sum()) == pytest.approx(1.0, abs=1e-6)
        assert bool((mix.weights > 0).all())
    assert float(loss) < 0.1 * first
    assert int(mix.weights.argmax()) == 2 and float(mix.gamma) > 2.0


def test_the_elmo_cnn_preset_has_the_papers_layout_scaled_down():
    cfg = BiLMConfig(**{**PRESETS["elmo-cnn-tiny"], "vocab_size": 100})
    assert cfg.char_cnn and cfg.d_proj < cfg.d_hidden and cfg.d_model == 2 * cfg.d_proj and cfg.n_layers == 2


def test_a_char_cnn_bilm_pretrains_and_reloads_with_its_characters(data_root, tmp_path):
    from lmforge.training.pretrain import build_pretraining

    data = prepared(data_root, "bert")
    overrides = {"d_embed": 16, "d_hidden": 24, "d_proj": 16, "n_layers": 1, "char_cnn": True,
                 "char_filters": [[1, 8], [2, 8], [3, 16]], "max_chars": 12}
    run = build_pretraining(config(data, tmp_path / "run", model="elmo-cnn-tiny", overrides=overrides,
                                   max_steps=40, eval_every=40, save_every=40))
    tok = run.tokenizer
    word = next(i for i in range(tok.vocab_size) if tok.id_to_token(i) == "the")
    assert run.model.token_chars[word].tolist()[:5] == [BOW, *(ord(c) + 1 for c in "the"), EOW]
    before = run.trainer.evaluate()
    result = run.trainer.fit()
    after = run.trainer.evaluate()
    assert after["eval_loss"] < before["eval_loss"] - 0.2, (before, after)  # measured: 5.44 -> 5.13
    loaded = lmforge.load(result.model_dir)
    assert torch.equal(loaded.token_chars, run.model.token_chars)
    ids = torch.tensor([[word, word + 1, word + 2]])
    trained = run.model.eval()
    with torch.no_grad():
        for x, y in zip(trained.layer_states(ids), loaded.layer_states(ids)):
            assert torch.equal(x, y)
    assert model_checkpoint.bilm_config(result.model_dir).char_cnn
