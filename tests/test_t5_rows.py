"""T5's architecture x objective rows: the shared encoder-decoder, per-stack layer sharing, and span corruption /
denoising on decoder-only and prefix-LM models (input and target concatenated, loss on the target)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_config
from lmforge.checkpoint import load as load_model
from lmforge.config import ConfigError, ModelConfig, list_presets
from lmforge.errors import UserInputError
from lmforge.models.transformer import Transformer
from lmforge.objectives import build_objective, check_architecture
from lmforge.objectives.decoder_layout import check_layout_fits, concatenated_batch, layout_batch
from lmforge.objectives.span_corruption import SpanCorruption


def _block(D: int, F_: int) -> int:
    """One pre-norm layer with biases: self-attention (4 D x D + bias), FFN (D F + F + F D + D), two LayerNorms."""
    return 4 * (D * D + D) + (D * F_ + F_ + F_ * D + D) + 2 * 2 * D


def test_shared_encoder_decoder_parameter_count_is_the_hand_count():
    D, F_, V, L, P = 32, 64, 97, 2, 64
    cfg = tiny_config(arch="encoder-decoder", share_encoder_decoder=True)
    shared = Transformer(cfg)
    # Tied embeddings (V D), a learned position table and final LayerNorm per stack, L encoder layers, and per
    # decoder layer only its own cross-attention and its norm.
    hand = V * D + 2 * (P * D + 2 * D) + L * _block(D, F_) + L * (4 * (D * D + D) + 2 * D)
    assert shared.num_parameters() == hand
    separate = Transformer(cfg.replace(share_encoder_decoder=False))
    assert separate.num_parameters() - shared.num_parameters() == L * _block(D, F_)
    # T5 Table 2: the shared model has P parameters but the cost M of the unshared one.
    assert shared.train_flops(16, 8) == separate.train_flops(16, 8)
    enc, dec = shared.encoder.layers[1], shared.decoder.layers[1]
    assert dec.attn is enc.attn and dec.ffn is enc.ffn and dec.attn_norm is enc.attn_norm
    assert dec.cross_attn is not None and shared.decoder.final_norm is not shared.encoder.final_norm


def test_shared_encoder_decoder_trains_one_set_and_saves(tmp_path):
    model = Transformer(tiny_config(arch="encoder-decoder", share_encoder_decoder=True))
    src, tgt = torch.randint(1, 97, (2, 5)), torch.randint(1, 97, (2, 4))
    model(src, labels=tgt).loss.backward()
    # The shared weight's gradient sums both stacks' uses: it is one tensor.
    assert model.encoder.layers[0].attn.q.weight.grad is model.decoder.layers[0].attn.q.weight.grad
    model.save(tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.decoder.layers[0].ffn is loaded.encoder.layers[0].ffn
    model.eval(), loaded.eval()
    torch.testing.assert_close(loaded(src, labels=tgt).loss, model(src, labels=tgt).loss)


@pytest.mark.parametrize("fields, match", [
    (dict(arch="decoder", share_encoder_decoder=True), "share_encoder_decoder=True needs arch='encoder-decoder'"),
    (dict(arch="encoder", share_encoder_decoder=True), "no second stack"),
    (dict(arch="encoder-decoder", share_encoder_decoder=True, n_decoder_layers=3), "n_decoder_layers=3"),
    (dict(arch="encoder-decoder", share_encoder_decoder=True, share_layers="encoder"), "same shape"),
    (dict(arch="encoder", share_layers="decoder"), "share_layers='decoder' names a stack"),
    (dict(arch="encoder-decoder", share_layers="middle"), "share_layers='middle' must be"),
])
def test_sharing_bad_input_is_one_line(fields, match):
    with pytest.raises(ConfigError, match=match) as info:
        tiny_config(**fields)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("share, enc, dec", [(True, 1, 1), ("both", 1, 1), ("encoder", 1, 3), ("decoder", 2, 1),
                                             (False, 2, 3)])
def test_share_layers_per_stack(share, enc, dec):
    model = Transformer(tiny_config(arch="encoder-decoder", n_decoder_layers=3, share_layers=share))
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (enc, dec)
    assert model(torch.randint(1, 97, (1, 4)), labels=torch.randint(1, 97, (1, 3))).loss.isfinite()


def test_boolean_share_layers_presets_load_unchanged():
    for name in list_presets():
        cfg = ModelConfig.from_preset(name)
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    albert = tiny_config(arch="encoder", head="mlm", share_layers=True, n_layers=3)
    assert albert.to_dict()["share_layers"] is True and len(Transformer(albert).encoder.layers) == 1
    assert len(Transformer(tiny_config(arch="decoder", share_layers="decoder")).decoder.layers) == 1


def test_concatenated_layout_by_hand():
    batch = concatenated_batch([[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]], pad_id=0, prefix=False)
    # x = source + target; input x[:-1], labels x[1:] with the source's tokens (given, not predicted) at -100.
    assert batch["input_ids"].tolist() == [[5, 6, 7, 10], [8, 9, 12, 13]]
    assert batch["labels"].tolist() == [[-100, -100, 10, 11], [-100, 12, 13, 14]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    padded = concatenated_batch([[5, 6, 7], [8]], [[10, 11], [12]], pad_id=0, prefix=True)
    assert padded["input_ids"].tolist() == [[5, 6, 7, 10], [8, 0, 0, 0]]
    assert padded["labels"].tolist() == [[-100, -100, 10, 11], [12, -100, -100, -100]]
    mask = padded["attention_mask"].int()
    # Row 0: the 3 source tokens see each other (bidirectional); the target is causal after them.
    assert mask[0].tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert mask[1, :, 1:].sum() == 0  # padding keys are never seen


def test_prefix_layout_never_shows_a_target_token_before_it_is_predicted():
    sc = SpanCorruption(sentinel_ids=[99, 98, 97, 96, 95], eos_token_id=1, pad_token_id=0, layout="prefix-lm",
                        noise_density=0.3, mean_noise_span_length=2.0, seed=3)
    batch = sc([list(range(10, 24)), list(range(30, 38))])
    mask, labels = batch["attention_mask"], batch["labels"]
    for b in range(2):
        first = int((labels[b] != -100).nonzero()[0])  # the last source position predicts the first target
        n_source = first + 1
        assert mask[b, :n_source, :n_source].all()  # bidirectional over the source
        for t in range(mask.size(1)):
            assert not mask[b, t, max(t + 1, n_source):].any()  # never a key after t outside the source


def test_denoising_on_a_decoder_puts_loss_on_target_tokens_only():
    torch.manual_seed(0)
    bart = build_objective("denoising", mask_token_id=3, eos_token_id=1, pad_token_id=0, layout="decoder", seed=0)
    batch = bart([list(range(10, 22)), list(range(30, 36))])
    source_len = [len(bart.noise(torch.arange(10, 22))) + 1]  # noised text + EOS (no sentences to permute)
    labels = batch["labels"]
    n_targets = (labels != -100).sum(1)
    assert n_targets.tolist() == [13, 7]  # each original document + EOS, nothing of the source
    assert labels[0, labels[0] != -100].tolist() == list(range(10, 22)) + [1]
    model = Transformer(tiny_config(arch="decoder")).eval()
    out = model(**batch)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    keep = labels != -100
    torch.testing.assert_close(out.loss, F.cross_entropy(logits[keep], labels[keep]))
    assert out.n_targets == int(n_targets.sum()) and source_len[0] > 1


def test_layout_must_fit_the_architecture():
    check_architecture("span-corruption", "decoder")
    check_architecture("denoising", "decoder")
    with pytest.raises(UserInputError, match="'span-corruption' does not fit arch='encoder'"):
        check_architecture("span-corruption", "encoder")
    with pytest.raises(UserInputError, match="layout='seq2seq' does not fit arch='decoder'; use layout='decoder' or "
                                             "'prefix-lm'"):
        check_layout_fits("denoising", "seq2seq", "decoder")
    with pytest.raises(UserInputError, match="layout='prefix' is not one of"):
        layout_batch([[1]], [[2]], 0, 0, "prefix")
