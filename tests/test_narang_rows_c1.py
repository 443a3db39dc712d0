"""Narang et al. 2021's convolution rows: lightweight and dynamic convolutions in place of self-attention
(:mod:`lmforge.nn.lightconv`, :mod:`lmforge.nn.dynamicconv`) and the Evolved Transformer's layers
(:mod:`lmforge.nn.evolved`). References: torch's grouped conv1d, a hand loop, hand parameter counts; properties:
causality, padding invisibility, cached decoding equals the full forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_config

import lmforge
from lmforge.config import ConfigError
from lmforge.interop.hf import HFConversionError
from lmforge.models import Transformer
from lmforge.nn.attention import AttentionContext
from lmforge.nn.dynamicconv import DynamicConv
from lmforge.nn.evolved import EvolvedDecoderBlock, EvolvedEncoderBlock
from lmforge.nn.lightconv import LightweightConv

ROWS = {  # the decoder configs of the three rows
    "lightconv": dict(attention="lightconv", conv_kernel=3),
    "dynamicconv": dict(attention="dynamicconv", conv_kernel=3),
    "evolved": dict(block="evolved"),
}


def _decoder(row: str, **overrides):
    return tiny_config(**{**ROWS[row], **overrides})


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("k", [3, 4])
def test_lightweight_conv_equals_grouped_conv1d_with_the_softmaxed_head_shared_kernel(causal, k):
    torch.manual_seed(0)
    cfg = tiny_config(attention="lightconv", conv_kernel=k)
    conv = LightweightConv(cfg, causal=causal).eval()
    x = torch.randn(2, 6, cfg.d_model)
    u = F.glu(conv.glu_in(x), dim=-1).transpose(1, 2)  # (B, C, T)
    # Head h's kernel serves channels h * C/H .. (h + 1) * C/H - 1: one (C, 1, k) filter bank for conv1d.
    w = conv.weight.softmax(-1).repeat_interleave(cfg.d_model // cfg.n_heads, dim=0)[:, None, :]
    pad = (k - 1, 0) if causal else ((k - 1) // 2, k // 2)
    ref = F.conv1d(F.pad(u, pad), w, groups=cfg.d_model).transpose(1, 2)  # (B, T, C)
    torch.testing.assert_close(conv(x, AttentionContext()), conv.o(ref), atol=1e-5, rtol=1e-5)


def test_dynamic_conv_equals_a_hand_loop():
    torch.manual_seed(0)
    cfg = tiny_config(d_model=4, n_heads=2, d_ff=8, attention="dynamicconv", conv_kernel=3)
    conv = DynamicConv(cfg, causal=True).eval()
    x = torch.randn(1, 4, 4)
    u = F.glu(conv.glu_in(x), dim=-1)[0]  # (T, C)
    T, C, H, k = 4, 4, 2, 3
    out = torch.zeros(T, C)
    for i in range(T):
        logits = conv.kernel_proj(u[i]).view(H, k)  # predicted from position i alone
        for c in range(C):
            kernel = torch.softmax(logits[c // (C // H)], dim=0)
            for j in range(k):
                src = i + j - (k - 1)
                if src >= 0:
                    out[i, c] += kernel[j] * u[src, c]
    torch.testing.assert_close(conv(x, AttentionContext())[0], conv.o(out), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("row", list(ROWS))
def test_changing_future_tokens_leaves_past_logits_unchanged(row):
    torch.manual_seed(0)
    model = Transformer(_decoder(row)).eval()
    ids = torch.randint(1, 97, (2, 12))
    changed = ids.clone()
    changed[:, 7:] = torch.randint(1, 97, (2, 5))
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("row", list(ROWS))
def test_cached_decoding_equals_the_full_forward(row):
    torch.manual_seed(0)
    model = Transformer(_decoder(row)).eval()
    ids = torch.randint(1, 97, (2, 14))  # the evolved decoder's 11-wide windows reach past the 4-token prompt
    full = model(ids).logits
    out = model(ids[:, :4], use_cache=True)
    steps, cache = [out.logits], out.past_key_values
    for t in range(4, 14, 2):  # two tokens a step: windows span the cache and the new positions
        out = model(ids[:, t:t + 2], past_key_values=cache, use_cache=True)
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_beam_reorder_moves_the_cached_convolution_inputs():
    torch.manual_seed(0)
    model = Transformer(_decoder("lightconv")).eval()
    ids = torch.randint(1, 97, (2, 6))
    cache = model(ids[:, :5], use_cache=True).past_key_values
    cache.reorder(torch.tensor([1, 1]))
    step = model(ids[[1, 1], 5:], past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(step, model(ids[[1, 1]]).logits[:, 5:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("row", list(ROWS))
def test_padding_is_invisible_to_an_encoder(row):
    torch.manual_seed(0)
    model = Transformer(tiny_config(arch="encoder", head="mlm", **ROWS[row])).eval()
    ids = torch.randint(1, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, 5:] = 0
    padded = model(ids, attention_mask=mask).logits[0, :5]
    torch.testing.assert_close(padded, model(ids[:1, :5]).logits[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("row", list(ROWS))
def test_padding_free_training_forward_gives_the_padded_loss(row):
    torch.manual_seed(0)
    model = Transformer(tiny_config(arch="encoder", head="mlm", **ROWS[row]))
    ids = torch.randint(1, 97, (4, 40))
    mask = torch.ones(4, 40, dtype=torch.long)
    mask[:3, 5:] = 0  # 55 real tokens of 160: packed, with 9 padding rows spare (the rows come in 64s)
    labels = ids.masked_fill(mask == 0, -100)
    packed = model.train()(ids, attention_mask=mask, labels=labels).loss
    with torch.no_grad():
        padded = model.eval()(ids, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(packed.detach(), padded, atol=1e-5, rtol=1e-5)


def test_evolved_layers_have_the_parameters_counted_by_hand():
    cfg = tiny_config(block="evolved")  # d = 32, d_ff = 64, H = 4, biases and LayerNorms with weight + bias
    d, f = 32, 64
    attn = 4 * (d * d + d)  # q, k, v, o, however many heads
    ffn = d * f + f + f * d + d
    encoder = (2 * d + 2 * (d * d + d)  # GLU: norm, values, gates
               + 2 * d + (d * 4 * d + 4 * d) + (3 * d * d // 2 + d // 2)  # norm, 1x1 conv 4d, 3x1 conv d/2
               + 2 * 4 * d + (9 * 4 * d + 4 * d * d // 2 + d // 2)  # norm(4d), sep 9x1: depthwise, pointwise
               + 2 * d + attn + 2 * d + ffn)
    decoder = (2 * d + attn  # norm, 16-head self-attention
               + 2 * d + (11 * d + d * 2 * d + 2 * d) + (7 * d + d * d // 2 + d // 2)  # sep 11x1 2d, sep 7x1 d/2
               + 2 * 2 * d + (7 * 2 * d + 2 * d * d + d)  # norm(2d), sep 7x1 d
               + 2 * d + attn + 2 * d + ffn + 2 * f)  # self-attention, FFN with its norm(d_ff)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(EvolvedEncoderBlock(cfg)) == encoder
    assert count(EvolvedDecoderBlock(cfg)) == decoder
    assert count(EvolvedDecoderBlock(cfg, cross=True)) == decoder + 2 * attn + 2 * d  # two cross-attentions, a norm


def test_evolved_shapes_and_heads():
    cfg = tiny_config(block="evolved", arch="encoder-decoder", n_layers=1)
    model = Transformer(cfg).eval()
    layer = model.decoder.layers[0]
    assert (layer.wide_attn.n_heads, layer.attn.n_heads) == (16, 4)
    assert isinstance(model.encoder.layers[0], EvolvedEncoderBlock)
    out = model(torch.randint(1, 97, (2, 7)), decoder_input_ids=torch.randint(1, 97, (2, 5)))
    assert out.logits.shape == (2, 5, 97) and torch.isfinite(out.logits).all()


@pytest.mark.parametrize("overrides, field", [
    (dict(attention="lightconv", position="rope"), "position"),
    (dict(attention="dynamicconv", conv_kernel=0), "conv_kernel"),
    (dict(attention="lightconv", sliding_window=4), "sliding_window"),
    (dict(block="evolved", d_model=40, n_heads=4), "d_model"),  # the wide attention's 16 heads do not divide 40
    (dict(block="evolved", moe_experts=2), "block"),
    (dict(block="recurrent"), "block"),
])
def test_config_refuses_with_one_line_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"^ModelConfig\.{field}=") as err:
        tiny_config(**overrides)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("row", list(ROWS))
def test_no_hugging_face_family_expresses_the_rows(row, tmp_path):
    with pytest.raises(HFConversionError, match="no Hugging Face architecture expresses"):
        lmforge.to_hf(Transformer(_decoder(row, n_layers=1)), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_conv_kernel_is_irrelevant_to_hugging_face_conversion_of_a_plain_model():
    from lmforge.interop.hf import hf_config_for

    cfg = tiny_config()
    assert (cfg.attention, cfg.block) == ("full", "transformer")
    assert hf_config_for(cfg.replace(conv_kernel=5))[2] == hf_config_for(cfg)[2]


@pytest.mark.parametrize("row", list(ROWS))
def test_compiled_decoding_and_continuous_batching_refuse_the_rows(row):
    from lmforge.errors import UserInputError
    from lmforge.generation.compiled import check_supported
    from lmforge.generation.slots import check_slot_model

    model = Transformer(_decoder(row, n_layers=1))
    for check in (check_supported, check_slot_model):
        with pytest.raises(UserInputError, match="convolution layers"):
            check(model)


@pytest.mark.parametrize("attention", ["lightconv", "dynamicconv"])
def test_convolution_flops_per_token_do_not_grow_with_the_sequence(attention):
    conv = Transformer(tiny_config(attention=attention, conv_kernel=3, max_seq_len=128))
    full = Transformer(tiny_config(max_seq_len=128))
    assert conv.train_flops(128) // 128 == conv.train_flops(32) // 32  # 6 d k a token and layer, no keys
    grow = full.train_flops(128) // 128 - full.train_flops(32) // 32
    assert grow == 2 * 12 * 32 * (128 - 32)  # full attention: 12 d per key, 2 layers
