"""Narang et al. 2021's layer-type rows, part C2: Synthesizer attention (:mod:`lmforge.nn.synthesizer`), the
Funnel Transformer (:mod:`lmforge.nn.funnel`, :mod:`lmforge.models.funnel`) and the Weighted Transformer's
branches (:mod:`lmforge.nn.weighted`), each checked against its paper's formula written out by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_config

import lmforge
from lmforge.config import ConfigError
from lmforge.generation.compiled import check_supported
from lmforge.interop.hf import HFConversionError
from lmforge.models import Transformer
from lmforge.nn.attention import AttentionContext
from lmforge.nn.funnel import PoolQueryBlock, pool_sequence
from lmforge.nn.synthesizer import SynthesizerAttention
from lmforge.nn.weighted import WeightedBranches


def _synth(kind: str, **overrides):
    base = dict(d_model=8, n_heads=2, d_ff=16, n_layers=1, max_seq_len=6, attention=f"synthesizer-{kind}",
                synthesizer_factor=2)
    return tiny_config(**{**base, **overrides})


def _causal_softmax(logits: torch.Tensor) -> torch.Tensor:
    T, S = logits.shape[-2:]
    return logits.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(), -math.inf).softmax(-1)


def _hand_synthetic(attn: SynthesizerAttention, x: torch.Tensor, kind: str) -> torch.Tensor:
    """(B, H, T, T) synthetic logits from the paper's formulas, with plain matrix products."""
    B, T, _ = x.shape
    H, L, k = attn.n_heads, attn.max_len, attn.factor
    if kind == "random":
        return attn.R[:, :T, :T].expand(B, H, T, T)
    if kind == "factorized-random":
        return torch.einsum("htk,hsk->hts", attn.R1[:, :T], attn.R2[:, :T]).expand(B, H, T, T)
    hidden = torch.relu(x @ attn.w1.weight.T + attn.w1.bias)
    if kind == "dense":
        rows = (hidden @ attn.w2.weight.T + attn.w2.bias).view(B, T, H, L)
        return rows.permute(0, 2, 1, 3)[..., :T]
    a = (hidden @ attn.wa.weight.T + attn.wa.bias).view(B, T, H, k)
    b = (hidden @ attn.wb.weight.T + attn.wb.bias).view(B, T, H, L // k)
    out = torch.empty(B, H, T, L)
    for i in range(k):  # logit column i * (L / k) + j is a_i * b_j
        for j in range(L // k):
            out[..., i * (L // k) + j] = (a[..., i] * b[..., j]).transpose(1, 2)
    return out[..., :T]


@pytest.mark.parametrize("kind", ["dense", "random", "factorized-dense", "factorized-random"])
def test_synthesizer_weights_and_output_match_the_formula(kind):
    torch.manual_seed(0)
    attn = SynthesizerAttention(_synth(kind)).eval()
    x = torch.randn(2, 5, 8)
    ctx = AttentionContext(is_causal=True, attentions=[])
    out = attn(x, ctx)
    probs = _causal_softmax(_hand_synthetic(attn, x, kind))  # (B, H, T, T)
    torch.testing.assert_close(ctx.attentions[0], probs, atol=1e-6, rtol=1e-5)
    v = (x @ attn.v.weight.T + attn.v.bias).view(2, 5, 2, 4).transpose(1, 2)
    expect = (probs @ v).transpose(1, 2).reshape(2, 5, 8) @ attn.o.weight.T + attn.o.bias
    torch.testing.assert_close(out, expect, atol=1e-6, rtol=1e-5)
    assert (ctx.attentions[0].triu(1) == 0).all()  # no weight on a future position


@pytest.mark.parametrize("mix", ["plus", "plus-alpha"])
def test_mixture_with_dot_product_attention(mix):
    torch.manual_seed(1)
    attn = SynthesizerAttention(_synth("dense", synthesizer_mix=mix)).eval()
    if mix == "plus-alpha":
        with torch.no_grad():
            attn.mix.copy_(torch.tensor([0.25, 0.75]).log())  # softmax -> w_s = 0.25, w_v = 0.75
    w_s, w_v = (1.0, 1.0) if mix == "plus" else (0.25, 0.75)
    x = torch.randn(2, 5, 8)
    ctx = AttentionContext(is_causal=True, attentions=[])
    attn(x, ctx)
    q = (x @ attn.q.weight.T + attn.q.bias).view(2, 5, 2, 4).transpose(1, 2)
    k = (x @ attn.k.weight.T + attn.k.bias).view(2, 5, 2, 4).transpose(1, 2)
    logits = w_s * _hand_synthetic(attn, x, "dense") + w_v * (q @ k.transpose(-1, -2)) / 2.0  # sqrt(hd) = 2
    torch.testing.assert_close(ctx.attentions[0], _causal_softmax(logits), atol=1e-6, rtol=1e-5)
    weights = [float(torch.as_tensor(w).detach()) for w in attn.mixture_weights()]
    assert weights == [pytest.approx(w_s), pytest.approx(w_v)]


@pytest.mark.parametrize("kind,mix", [("dense", "none"), ("random", "plus-alpha"), ("factorized-random", "plus")])
def test_synthesizer_decoder_is_causal_and_its_cache_matches_the_full_forward(kind, mix):
    torch.manual_seed(2)
    model = Transformer(_synth(kind, synthesizer_mix=mix, n_layers=2, max_seq_len=8, position="none")).eval()
    ids = torch.randint(1, 97, (2, 6))
    changed = ids.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % 97
    full = model(ids).logits
    torch.testing.assert_close(model(changed).logits[:, :4], full[:, :4])  # the future does not leak back
    out = model(ids[:, :4], use_cache=True)
    step = model(ids[:, 4:6], past_key_values=out.past_key_values).logits
    torch.testing.assert_close(torch.cat([out.logits, step], 1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(lmforge.errors.UserInputError, match="max_seq_len=8"):
        model(torch.randint(1, 97, (1, 9)))
    with pytest.raises(lmforge.errors.UserInputError, match="compile=True does not support synthesizer"):
        check_supported(model)  # a static cache's length is its capacity, not the query's position


@pytest.mark.parametrize("cfg", [
    _synth("dense", arch="encoder", head="mlm", synthesizer_mix="plus", max_seq_len=32),
    _synth("factorized-random", arch="encoder", head="mlm", max_seq_len=32),
    tiny_config(arch="encoder", head="mlm", n_layers=1, weighted_branches=True),
], ids=["synthesizer-plus", "synthesizer-factorized-random", "weighted"])
def test_padding_free_training_forward_equals_the_padded_one(cfg):
    torch.manual_seed(9)
    model = Transformer(cfg)
    ids = torch.randint(2, 97, (4, 32))
    mask = (torch.arange(32) < torch.tensor([[32], [10], [5], [3]])).long()
    model.train()  # with gradients, a padded batch runs its layers on the real tokens only
    assert model.encoder.packing(mask) is not None
    packed = model(ids, attention_mask=mask).last_hidden_state
    model.eval()
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)


def test_fixed_random_synthesizer_keeps_its_draw_and_trains():
    torch.manual_seed(3)
    model = Transformer(_synth("random", synthesizer_trainable=False, n_layers=1))
    R = model.decoder.layers[0].attn.R
    before = R.detach().clone()
    assert not R.requires_grad and 0.8 < float(before.std()) < 1.2  # N(0, 1): a fixed matrix is not uniform
    ids = torch.randint(1, 97, (2, 6))
    for _ in range(2):
        loss = model(ids, labels=ids).loss
        assert torch.isfinite(loss)
        loss.backward()
        with torch.no_grad():  # a plain SGD step on what trains
            for p in model.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
                    p.grad = None
    assert R.grad is None and torch.equal(R, before)


def test_random_synthesizer_flops_drop_the_query_key_scores_and_its_table():
    synth = Transformer(_synth("random", n_layers=2, max_seq_len=8, position="none"))
    full = Transformer(_synth("random", n_layers=2, max_seq_len=8, position="none").replace(attention="full"))
    T, d, L = 8, 8, 2
    qk = 2 * (d * d + d)  # the q and k projections a synthesizer does not have
    # per layer: no q, k weights (6 per weight and token), no Q K^T scores (6 d_attn per query-key pair); the
    # (H, L, L) table is read, not multiplied by the tokens, so it adds nothing
    assert synth.train_flops(T) == full.train_flops(T) - L * (6 * qk * T + 6 * d * T * T)


def test_synthesizer_config_refusals_name_the_field():
    with pytest.raises(ConfigError, match="synthesizer_factor=4 must divide max_seq_len=6"):
        _synth("factorized-dense", synthesizer_factor=4)
    with pytest.raises(ConfigError, match="synthesizer_mix='plus' needs a synthesizer attention"):
        tiny_config(synthesizer_mix="plus")
    with pytest.raises(ConfigError, match="n_kv_heads"):
        _synth("dense", n_kv_heads=1)


# ------------------------------------------------------------------------------------------ Funnel Transformer
def _funnel(**overrides):
    base = dict(arch="encoder", head="mlm", n_layers=4, funnel_blocks=[2, 2], max_seq_len=16, mask_token_id=1)
    return tiny_config(**{**base, **overrides})


def test_pooling_by_hand():
    x = torch.tensor([[1.0, 3.0, 5.0, 7.0, 9.0]]).unsqueeze(-1)  # (1, 5, 1)
    pooled, keep = pool_sequence(x, None, "mean")
    assert pooled.flatten().tolist() == [2.0, 6.0, 9.0] and keep is None  # odd length: the last alone
    pooled, keep = pool_sequence(x, torch.tensor([[1, 1, 1, 0, 0]]), "mean")
    assert pooled.flatten().tolist() == [2.0, 5.0, 0.0] and keep.tolist() == [[True, True, False]]
    pooled, keep = pool_sequence(x, torch.tensor([[1, 1, 1, 0, 0]]), "strided")
    assert pooled.flatten().tolist() == [1.0, 5.0, 9.0] and keep.tolist() == [[True, True, False]]


def test_sequence_length_of_every_layer_and_mlm_output_length():
    torch.manual_seed(4)
    cfg = _funnel(n_layers=6, funnel_blocks=[2, 2, 2])
    model = Transformer(cfg).eval()
    ids = torch.randint(2, 97, (2, 11))
    out = model(ids, output_hidden_states=True)
    lengths = [h.shape[1] for h in out.hidden_states]
    # embeddings, group 1 (11), group 2 (6), group 3 (3), then two upsampled decoder layers (11)
    assert lengths == [11, 11, 11, 6, 6, 3, 3, 11, 11]
    assert model.encoder.lengths(11) == [(11, 11), (11, 11), (6, 11), (6, 6), (3, 6), (3, 3), (11, 11), (11, 11)]
    assert out.logits.shape == (2, 11, 97)  # MLM: one prediction per input token
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    loss = model(ids, labels=labels).loss
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.encoder.layers.parameters())


def test_pool_query_only_attention_by_hand():
    torch.manual_seed(5)
    cfg = _funnel(d_model=8, n_heads=2, d_ff=16)
    block = PoolQueryBlock(cfg).eval()
    h = torch.randn(1, 6, 8)
    keep = torch.tensor([[1, 1, 1, 1, 1, 0]])
    pooled, _ = pool_sequence(h, keep, "mean")  # (1, 3, 8)
    out = block(pooled, AttentionContext(cross_mask=keep.bool()[:, None, None, :]), h)
    a = block.attn

    def heads(t, lin):
        return (t @ lin.weight.T + lin.bias).view(1, -1, 2, 4).transpose(1, 2)  # (1, H, n, 4)

    q, k, v = heads(block.attn_norm(pooled), a.q), heads(block.attn_norm(h), a.k), heads(block.attn_norm(h), a.v)
    scores = (q @ k.transpose(-1, -2)) / 2.0  # (1, H, 3 pooled queries, 6 full-length keys)
    probs = scores.masked_fill(~keep.bool()[:, None, None, :], -math.inf).softmax(-1)
    x = pooled + (probs @ v).transpose(1, 2).reshape(1, 3, 8) @ a.o.weight.T + a.o.bias
    expect = x + block.ffn(block.ffn_norm(x))
    torch.testing.assert_close(out, expect, atol=1e-6, rtol=1e-5)


def test_padded_row_equals_the_unpadded_row():
    torch.manual_seed(6)
    model = Transformer(_funnel(n_layers=6, funnel_blocks=[2, 2, 2])).eval()
    ids = torch.randint(2, 97, (1, 5))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, :5], model(ids).logits,
                               atol=1e-5, rtol=1e-5)


def test_funnel_flops_count_pooled_lengths():
    model = Transformer(_funnel(n_layers=4, funnel_blocks=[2, 2]))
    plain = Transformer(_funnel(n_layers=4, funnel_blocks=None, funnel_decoder_layers=2))
    T = 16
    per_layer = sum(p.numel() for p in plain.encoder.layers[0].parameters())
    d_attn = 32
    kv = 2 * (32 * 32 + 32)
    layers = (2 * (6 * per_layer * T + 12 * d_attn * T * T)  # group 1 at T
              + 6 * ((per_layer - kv) * 8 + kv * T) + 12 * d_attn * 8 * T  # pool-query layer: 8 queries, T keys
              + 6 * per_layer * 8 + 12 * d_attn * 8 * 8  # group 2 at T/2
              + 2 * (6 * per_layer * T + 12 * d_attn * T * T))  # the upsampling decoder at T
    rest = model.num_parameters(exclude_embeddings=True) - sum(p.numel() for p in model.encoder.layers.parameters())
    head = 97 * 32  # the tied MLM output projection
    assert model.train_flops(T) == 6 * (rest + head) * T + layers


def test_funnel_encoder_decoder_reads_the_upsampled_memory():
    torch.manual_seed(10)
    cfg = tiny_config(arch="encoder-decoder", n_layers=4, n_decoder_layers=2, funnel_blocks=[2, 2])
    model = Transformer(cfg)
    src, tgt = torch.randint(2, 97, (2, 9)), torch.randint(2, 97, (2, 5))
    out = model(src, attention_mask=torch.ones_like(src), labels=tgt)
    assert out.encoder_last_hidden_state.shape == (2, 9, 32) and torch.isfinite(out.loss)
    out.loss.backward()
    assert model.encoder.layers[2].attn.q.weight.grad is not None  # the pool-query layer trains through the decoder
    # FLOPs: as a plain encoder-decoder with the funnel's 6 encoder layers, less their full-length cost, plus the
    # funnel's own (pooled lengths)
    plain = Transformer(cfg.replace(n_layers=6, funnel_blocks=None))
    S, T = 16, 8
    layers = sum(p.numel() for p in plain.encoder.layers.parameters())
    full_length = 6 * layers * S + 12 * 6 * 32 * S * S
    assert model.train_flops(S, T) - model.encoder.train_flops(S) == plain.train_flops(S, T) - full_length


def test_funnel_config_refusals_name_the_field():
    with pytest.raises(ConfigError, match="funnel_blocks=.* needs arch='encoder' or 'encoder-decoder'"):
        tiny_config(arch="decoder", n_layers=4, funnel_blocks=[2, 2])
    with pytest.raises(ConfigError, match="funnel_blocks=.* must sum to n_layers=3"):
        _funnel(n_layers=3)
    with pytest.raises(ConfigError, match="funnel_decoder_layers=0 must be >= 1 for head='mlm'"):
        _funnel(funnel_decoder_layers=0)
    with pytest.raises(ConfigError, match="funnel_pool='max' is not one of"):
        _funnel(funnel_pool="max")


# ------------------------------------------------------------------------------------------ Weighted Transformer
def test_weighted_branches_by_hand():
    torch.manual_seed(7)
    cfg = tiny_config(d_model=8, n_heads=2, d_ff=16, activation="relu", weighted_branches=True)
    wb = WeightedBranches(cfg)
    for p in wb.experts.parameters():
        torch.nn.init.normal_(p, std=0.3)
    with torch.no_grad():
        wb.kappa.copy_(torch.tensor([0.2, 0.8]).log())
        wb.alpha.copy_(torch.tensor([0.6, 0.4]).log())
    heads = torch.randn(3, 5, 8)  # (B, T, H * hd), hd = 4
    e = wb.experts
    expect = torch.zeros(3, 5, 8)
    for i, (kappa, alpha) in enumerate([(0.2, 0.6), (0.8, 0.4)]):
        branch = kappa * heads[..., 4 * i: 4 * i + 4] @ wb.out[i]  # kappa_i head_i W_i^O
        ffn = F.relu(branch @ e.up[i].T + e.up_bias[i]) @ e.down[i].T + e.down_bias[i]
        expect += alpha * ffn
    torch.testing.assert_close(wb(heads), expect, atol=1e-6, rtol=1e-5)


def test_weighted_block_is_one_residual_around_the_branches():
    torch.manual_seed(8)
    model = Transformer(tiny_config(n_layers=1, weighted_branches=True)).eval()
    block = model.decoder.layers[0]
    assert isinstance(block.attn.o, torch.nn.Identity) and isinstance(block.ffn, WeightedBranches)
    for p in (block.ffn.kappa, block.ffn.alpha):  # starts uniform, positive and summing to 1
        torch.testing.assert_close(p.softmax(0), torch.full((4,), 0.25))
    x = torch.randn(2, 5, 32)
    ctx = AttentionContext(is_causal=True)
    expect = x + block.ffn(block.attn(block.attn_norm(x), ctx))
    torch.testing.assert_close(block(x, ctx), expect)
    ids = torch.randint(1, 97, (2, 6))
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and block.ffn.alpha.grad is not None and block.ffn.kappa.grad is not None
    with pytest.raises(ConfigError, match="weighted_branches=True needs arch='encoder' or 'decoder'"):
        tiny_config(arch="encoder-decoder", weighted_branches=True)


# ------------------------------------------------------------------------------------------ HF conversion
@pytest.mark.parametrize("cfg", [
    _synth("dense", position="learned"), _funnel(), tiny_config(n_layers=1, weighted_branches=True),
], ids=["synthesizer", "funnel", "weighted"])
def test_no_hugging_face_family_expresses_these_rows(cfg, tmp_path):
    with pytest.raises(HFConversionError, match="no Hugging Face architecture expresses"):
        lmforge.to_hf(Transformer(cfg), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
