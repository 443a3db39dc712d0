"""ELECTRA <-> Hugging Face parity (fp32, atol 1e-4, right-padded batches, real positions): ElectraModel with and
without ``embeddings_project``, ElectraForPreTraining (the discriminator and its RTD head), ElectraForMaskedLM (the
generator), both directions, and an lmforge-trained discriminator read by transformers."""

from __future__ import annotations

import json

import pytest
import torch

import lmforge
from lmforge.config import ModelConfig
from lmforge.interop.hf import HFConversionError
from lmforge.models.electra import ElectraPretrainer

from test_interop_hf_parity import _assert_close, _batch, _hf_out, _ours_out, _perturb, tf

V = 97


def _electra(**kw):
    return dict(vocab_size=V, embedding_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=64) | kw


CASES = {
    "model": lambda: tf.ElectraModel(tf.ElectraConfig(**_electra())),
    "model-projected": lambda: tf.ElectraModel(tf.ElectraConfig(**_electra(embedding_size=16))),
    "discriminator": lambda: tf.ElectraForPreTraining(tf.ElectraConfig(**_electra(embedding_size=16))),
    "discriminator-gelu-new": lambda: tf.ElectraForPreTraining(tf.ElectraConfig(**_electra(hidden_act="gelu_new"))),
    "generator": lambda: tf.ElectraForMaskedLM(tf.ElectraConfig(**_electra(embedding_size=16, hidden_act="relu"))),
}


def _hf(case: str):
    torch.manual_seed(0)
    return _perturb(CASES[case]()).eval()


@pytest.mark.parametrize("case", CASES)
def test_from_hf_matches_transformers(case):
    hf = _hf(case)
    model = lmforge.from_hf(hf)
    assert model.config.embed_dim == hf.config.embedding_size and model.config.d_model == 32
    inputs, real = _batch(model.config)
    with torch.no_grad():
        _assert_close(_ours_out(model(**inputs)), _hf_out(hf(**inputs)), real)


@pytest.mark.parametrize("case", CASES)
def test_to_hf_loads_in_transformers_and_round_trips_exactly(case, tmp_path):
    hf = _hf(case)
    model = lmforge.from_hf(hf)
    path = lmforge.to_hf(model, tmp_path / "hf")
    assert json.loads((path / "config.json").read_text())["architectures"] == [type(hf).__name__]
    reloaded, info = type(hf).from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    inputs, real = _batch(model.config)
    with torch.no_grad():
        _assert_close(_hf_out(reloaded.eval()(**inputs)), _hf_out(hf(**inputs)), real)
    again = lmforge.from_hf(path)
    ours, back = model.state_dict(), again.state_dict()
    assert ours.keys() == back.keys() and all(torch.equal(ours[k], back[k]) for k in ours)


@pytest.mark.parametrize("embedding_dim", [None, 16])
def test_lmforge_discriminator_to_hf_gives_same_outputs(embedding_dim, tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("bert-tiny", d_model=32, n_heads=4, d_ff=64, n_layers=2, max_seq_len=64,
                                  vocab_size=V, embedding_dim=embedding_dim, pad_token_id=0)
    pair = ElectraPretrainer.from_config(cfg, generator_size=0.5)
    # A generator whose width equals the embedding width needs no projection: BertForMaskedLM expresses it too.
    for name, model, expected in (("discriminator", pair.discriminator, {"ElectraForPreTraining"}),
                                  ("generator", pair.generator, {"ElectraForMaskedLM", "BertForMaskedLM"})):
        model = _perturb(model).eval()
        path = lmforge.to_hf(model, tmp_path / name)
        architecture = json.loads((path / "config.json").read_text())["architectures"][0]
        assert architecture in expected
        hf, info = getattr(tf, architecture).from_pretrained(path, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        inputs, real = _batch(model.config)
        with torch.no_grad():
            _assert_close(_ours_out(model(**inputs)), _hf_out(hf.eval()(**inputs)), real)


def test_factorised_encoder_without_head_goes_to_electra_model(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("bert-tiny", d_model=32, n_heads=4, d_ff=64, n_layers=1, max_seq_len=64,
                                  vocab_size=V, embedding_dim=8, head="none")
    model = _perturb(lmforge.build_model(cfg)).eval()
    path = lmforge.to_hf(model, tmp_path / "hf")  # BERT has no embeddings_project: ELECTRA expresses it
    hf = tf.AutoModel.from_pretrained(path).eval()
    assert type(hf).__name__ == "ElectraModel"
    inputs, real = _batch(cfg)
    with torch.no_grad():
        _assert_close(model(**inputs).last_hidden_state, hf(**inputs).last_hidden_state, real)


def test_what_electra_cannot_express_is_refused(tmp_path):
    relative = tf.ElectraForPreTraining(tf.ElectraConfig(**_electra(position_embedding_type="relative_key")))
    with pytest.raises(HFConversionError, match="position_embedding_type 'relative_key' is not supported"):
        lmforge.from_hf(relative)
    cfg = ModelConfig.from_preset("bert-tiny", d_model=32, n_heads=4, d_ff=64, n_layers=1, vocab_size=V,
                                  head="rtd", norm_position="pre", final_norm=True)
    with pytest.raises(HFConversionError, match="no Hugging Face architecture expresses.*norm_position='pre'"):
        lmforge.to_hf(lmforge.build_model(cfg), tmp_path / "hf")
