"""Narang et al. 2021's embedding/softmax rows: adaptive input embeddings, the adaptive softmax (against torch's
``AdaptiveLogSoftmaxWithLoss``), a mixture of softmaxes (against a hand computation) and product-key memory
(against a brute-force search over all n_keys**2 keys); each in a model, through the loss and generation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_config

from lmforge.config import ConfigError
from lmforge.interop.hf import to_hf
from lmforge.interop.hf_family import HFConversionError
from lmforge.models import Transformer
from lmforge.nn.adaptive_input import AdaptiveInput
from lmforge.nn.adaptive_softmax import AdaptiveSoftmax
from lmforge.nn.ffn import FeedForward
from lmforge.nn.mixture_of_softmaxes import MixtureOfSoftmaxes
from lmforge.nn.product_key_memory import ProductKeyMemory

V = 97  # tiny_config's vocabulary
ROWS = {
    "adaptive-input": dict(adaptive_input_cutoffs=[8, 32], tie_embeddings=False),
    "adaptive-softmax": dict(adaptive_softmax_cutoffs=[8, 32], tie_embeddings=False),
    "mos": dict(mos_experts=3),
    "pkm": dict(pkm_layers=[1], pkm_keys=6, pkm_topk=3, pkm_heads=2, pkm_key_dim=8),
}


def model_for(row: str, **extra) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config(arch="decoder", **ROWS[row], **extra)).eval()


# ---------------------------------------------------------------------------------------------- adaptive input
def test_adaptive_input_band_widths_and_parameter_count():
    emb = AdaptiveInput(vocab_size=40, d_model=16, cutoffs=[8, 24], factor=4.0)
    assert emb.band_dims == [16, 4, 1]  # d / 4**i
    # By hand: each band's table (tokens x width) plus its projection (width x d).
    by_hand = (8 * 16 + 16 * 16) + (16 * 4 + 4 * 16) + (16 * 1 + 1 * 16)
    assert sum(p.numel() for p in emb.parameters()) == by_hand


def test_adaptive_input_lookup_is_each_bands_table_then_its_projection():
    torch.manual_seed(0)
    emb = AdaptiveInput(vocab_size=40, d_model=16, cutoffs=[8, 24], factor=2.0)
    ids = torch.tensor([[0, 7, 8, 23], [24, 39, 3, 30]])
    edges = [0, 8, 24, 40]
    for t, got in zip(ids.flatten().tolist(), emb(ids).reshape(-1, 16)):
        band = max(i for i in range(3) if t >= edges[i])
        row = emb.bands[band].weight[t - edges[band]]
        torch.testing.assert_close(got, emb.projections[band].weight @ row)


def test_adaptive_input_model_trains_and_generates():
    model = model_for("adaptive-input").train()
    ids = torch.randint(0, V, (2, 7))
    out = model(ids, labels=ids)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is not None for p in model.embed_tokens.projections.parameters())
    assert model.eval().generate(ids[:, :3], max_new_tokens=2, ignore_eos=True).sequences.shape == (2, 2)


# --------------------------------------------------------------------------------------------- adaptive softmax
@pytest.mark.parametrize("bias", [False, True])
def test_adaptive_softmax_matches_torch(bias):
    torch.manual_seed(0)
    ours = AdaptiveSoftmax(d_model=16, vocab_size=50, cutoffs=[5, 20, 35], factor=2.0, head_bias=bias)
    ref = torch.nn.AdaptiveLogSoftmaxWithLoss(16, 50, [5, 20, 35], div_value=2.0, head_bias=bias)
    ref.load_state_dict(ours.state_dict())  # same names and shapes: head, tail.{i}.0, tail.{i}.1
    h, target = torch.randn(12, 16), torch.randint(0, 50, (12,))
    torch.testing.assert_close(ours(h), ref.log_prob(h), atol=1e-5, rtol=0)
    torch.testing.assert_close(ours(h).gather(1, target[:, None]).squeeze(1), ref(h, target).output,
                               atol=1e-5, rtol=0)


def test_adaptive_softmax_model_loss_and_greedy_decoding_use_torchs_log_probs():
    model = model_for("adaptive-softmax")
    ref = torch.nn.AdaptiveLogSoftmaxWithLoss(32, V, [8, 32], div_value=4.0)
    ref.load_state_dict(model.lm_head.state_dict())
    ids = torch.randint(0, V, (2, 6))
    out = model(ids, labels=ids)
    h = model(ids).last_hidden_state.reshape(-1, 32)
    torch.testing.assert_close(out.loss, ref(h, ids.reshape(-1)).loss, atol=1e-5, rtol=0)
    # Greedy decoding (KV-cached) picks the argmax of torch's full log-probabilities, step by step.
    new = model.generate(ids[:1, :3], max_new_tokens=3, ignore_eos=True).sequences[0].tolist()
    seq = ids[:1, :3]
    for _ in range(3):
        nxt = ref.log_prob(model(seq).last_hidden_state[:, -1]).argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    assert new == seq[0, 3:].tolist()


# ------------------------------------------------------------------------------------------ mixture of softmaxes
def test_mixture_of_softmaxes_matches_hand_computation():
    torch.manual_seed(0)
    mos = MixtureOfSoftmaxes(d_model=6, vocab_size=9, n_experts=3, embed_dim=5, tied=False, bias=True).double()
    h = torch.randn(4, 6, dtype=torch.float64)
    got = mos(h).exp()
    for row, p in zip(h, got):
        prior = [math.exp(s) for s in (mos.prior.weight @ row).tolist()]
        prior = [x / sum(prior) for x in prior]
        latent = torch.tanh(mos.latent.weight @ row + mos.latent.bias).view(3, 5)
        want = torch.zeros(9, dtype=torch.float64)
        for k in range(3):
            z = mos.weight @ latent[k] + mos.bias
            want += prior[k] * z.exp() / z.exp().sum()
        torch.testing.assert_close(p, want)


def test_mixture_of_softmaxes_loss_is_the_mixtures_nll_and_cached_decoding_equals_full_forward():
    model = model_for("mos")
    ids = torch.randint(0, V, (2, 8))
    out = model(ids, labels=ids)
    logp = model(ids).logits  # (B, T, V): log of the mixture
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(2, 8))
    torch.testing.assert_close(out.loss, -logp.gather(-1, ids[..., None]).mean())
    step = model(ids[:, :5], use_cache=True)
    cache, cached = step.past_key_values, [step.logits[:, -1]]
    for t in range(5, 8):
        step = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        cached.append(step.logits[:, -1])
    torch.testing.assert_close(torch.stack(cached, 1), logp[:, 4:], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ product-key memory
def test_product_key_memory_equals_brute_force_over_all_keys():
    torch.manual_seed(0)
    n, k, H, kd, d = 5, 3, 2, 6, 8
    pkm = ProductKeyMemory(d_model=d, n_keys=n, topk=k, heads=H, key_dim=kd).double()
    x = torch.randn(7, d, dtype=torch.float64)
    q = pkm.query(x).view(7, H, kd)
    want = torch.zeros(7, d, dtype=torch.float64)
    for h in range(H):
        # Every one of the n*n keys spelled out: slot a*n + b is [C1[a]; C2[b]].
        keys = torch.stack([torch.cat([pkm.keys[h, 0, a], pkm.keys[h, 1, b]]) for a in range(n) for b in range(n)])
        scores, slots = (q[:, h] @ keys.T).topk(k, dim=-1)  # (7, k) of all 25
        want += (scores.softmax(-1)[..., None] * pkm.values.weight[slots]).sum(1)
    torch.testing.assert_close(pkm(x), want)


def test_product_key_memory_replaces_the_chosen_ffn_and_counts_flops():
    model = model_for("pkm")
    layers = model.decoder.layers
    assert isinstance(layers[0].ffn, FeedForward) and isinstance(layers[1].ffn, ProductKeyMemory)
    ids = torch.randint(0, V, (2, 6))
    out = model.train()(ids, labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss) and layers[1].ffn.values.weight.grad.abs().sum() > 0
    # A token reads heads x top-k of the 36 slots: the other values multiply nothing.
    unread = (36 - 2 * 3) * 32
    assert model.active_parameters() == model.num_parameters() - unread


# ----------------------------------------------------------------------------------------- the model as a whole
def test_mixture_of_softmaxes_flops_count_every_softmax():
    model = model_for("mos")
    T = 16
    by_hand = 6 * (model.active_parameters(exclude_embeddings=True) + 3 * V * 32) + 2 * 12 * 32 * T
    assert model.train_flops(T) == by_hand * T


@pytest.mark.parametrize("row", ROWS)
def test_hf_conversion_refuses_every_row(row, tmp_path):
    with pytest.raises(HFConversionError, match="no Hugging Face architecture"):
        to_hf(model_for(row), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("row", ROWS)
def test_saved_model_loads_back_equal(row, tmp_path):
    from lmforge import checkpoint

    model = model_for(row)
    model.save(tmp_path / "m")
    back = checkpoint.load(tmp_path / "m")  # built on the meta device, then filled from the folder
    ids = torch.randint(0, V, (1, 5))
    torch.testing.assert_close(back(ids).logits, model(ids).logits)


@pytest.mark.parametrize("overrides, field", [
    (dict(adaptive_input_cutoffs=[8, 8], tie_embeddings=False), "adaptive_input_cutoffs"),
    (dict(adaptive_input_cutoffs=[8, 97], tie_embeddings=False), "adaptive_input_cutoffs"),
    (dict(adaptive_input_cutoffs=[8]), "adaptive_input_cutoffs"),  # a tied head has no (V, E) table to tie
    (dict(adaptive_input_cutoffs=[8], tie_embeddings=False, embedding_dim=16), "embedding_dim"),
    (dict(adaptive_softmax_cutoffs=["a"], tie_embeddings=False), "adaptive_softmax_cutoffs"),
    (dict(adaptive_softmax_cutoffs=[8, 16, 24, 32], tie_embeddings=False, adaptive_factor=4.0), "adaptive_factor"),
    (dict(adaptive_factor=0.5), "adaptive_factor"),
    (dict(mos_experts=-1), "mos_experts"),
    (dict(mos_experts=2, adaptive_softmax_cutoffs=[8], tie_embeddings=False), "mos_experts"),
    (dict(mos_experts=2, arch="encoder", head="mlm"), "mos_experts"),
    (dict(pkm_layers=[2]), "pkm_layers"),
    (dict(pkm_layers=[0, 0]), "pkm_layers"),
    (dict(pkm_layers=[0], share_layers=True), "pkm_layers"),
    (dict(pkm_layers=[0], moe_experts=2), "pkm_layers"),
    (dict(pkm_layers=[0], fixup=True, rezero=False), "pkm_layers"),
    (dict(pkm_layers=[0], block="evolved"), "pkm_layers"),
    (dict(pkm_layers=[0], pkm_topk=40), "pkm_topk"),
    (dict(pkm_layers=[0], pkm_key_dim=7), "pkm_key_dim"),
    (dict(pkm_layers=[0], pkm_heads=0), "pkm_heads"),
])
def test_bad_values_are_one_line_errors_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=f"ModelConfig.{field}=") as err:
        tiny_config(**overrides)
    assert "\n" not in str(err.value)


def test_config_round_trips_through_json():
    cfg = tiny_config(**ROWS["pkm"], adaptive_input_cutoffs=(8, 32), tie_embeddings=False)
    assert cfg.adaptive_input_cutoffs == [8, 32]
    assert type(cfg).from_dict(cfg.to_dict()) == cfg


def test_default_path_is_unchanged():
    cfg = tiny_config()
    model = Transformer(cfg)
    assert type(model.embed_tokens) is torch.nn.Embedding and type(model.lm_head).__name__ == "LMHead"
    assert all(isinstance(b.ffn, FeedForward) for b in model.decoder.layers)
    assert F.log_softmax(model(torch.tensor([[1, 2]])).logits, -1).shape == (1, 2, V)


def test_unused_shape_fields_do_not_block_hf_conversion(tmp_path):
    # pkm_topk and adaptive_factor shape nothing without pkm_layers or cutoffs: gpt2 still expresses the model.
    cfg = tiny_config(arch="decoder", pkm_topk=8, pkm_keys=9, adaptive_factor=2.0)
    assert (to_hf(Transformer(cfg), tmp_path / "hf") / "config.json").is_file()
