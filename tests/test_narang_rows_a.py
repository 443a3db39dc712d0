"""Narang et al. 2021's residual/init rows: ReZero + LayerNorm / RMS Norm, Fixup (Zhang et al. 2019) and transparent
attention (Bapna et al. 2018), each against a hand computation; Hugging Face conversion refuses all three."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import tiny_config

from lmforge.config import ConfigError
from lmforge.generation import generate
from lmforge.interop.hf import hf_config_for
from lmforge.interop.hf_family import HFConversionError
from lmforge.models import Transformer
from lmforge.nn.attention import AttentionContext
from lmforge.nn.fixup import FixupBranch
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.norms import RMSNorm
from lmforge.nn.transparent_attention import TransparentMix


def ids(B=2, T=6, seed=0):
    return torch.randint(1, 97, (B, T), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------- ReZero + norm
@pytest.mark.parametrize("norm, kind", [("layernorm", torch.nn.LayerNorm), ("rmsnorm", RMSNorm)])
def test_rezero_with_norm_keeps_the_pre_norm_and_gates_the_branch(norm, kind):
    torch.manual_seed(0)
    model = Transformer(tiny_config(arch="decoder", rezero=True, rezero_norm=True, norm=norm, final_norm=False))
    block = model.decoder.layers[0]
    assert isinstance(block.attn_norm, kind) and isinstance(block.ffn_norm, kind)
    assert float(block.rezero.detach()) == 0.0
    x = torch.randn(2, 5, 32)
    ctx = AttentionContext(is_causal=True)
    torch.testing.assert_close(block(x, ctx), x)  # alpha = 0: the identity
    with torch.no_grad():
        block.rezero.fill_(0.7)
        h = x + 0.7 * block.attn(block.attn_norm(x), ctx)  # x + alpha * F(Norm(x)), branch by branch
        want = h + 0.7 * block.ffn(block.ffn_norm(h))
        torch.testing.assert_close(block(x, ctx), want)


def test_plain_rezero_still_drops_the_norms():
    block = Transformer(tiny_config(arch="decoder", rezero=True)).decoder.layers[0]
    assert isinstance(block.attn_norm, torch.nn.Identity)


@pytest.mark.parametrize("fields, field", [
    (dict(rezero_norm=True), "rezero_norm"),
    (dict(rezero=True, rezero_norm=True, norm_position="post"), "rezero_norm"),
    (dict(fixup=True, rezero=True), "fixup"),
    (dict(arch="decoder", transparent_attention=True), "transparent_attention"),
])
def test_bad_combinations_are_one_line_naming_the_field(fields, field):
    with pytest.raises(ConfigError, match=rf"^ModelConfig\.{field}=") as info:
        tiny_config(**fields)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------- Fixup
@pytest.mark.parametrize("arch, L", [("decoder", 2 * 2), ("encoder-decoder", 2 * 2 + 3 * 2)])
def test_fixup_init_scales_equal_the_formula(arch, L):
    cfg = dict(arch=arch, n_layers=2, final_norm=False)
    torch.manual_seed(0)
    plain = dict(Transformer(tiny_config(**cfg)).named_parameters())
    torch.manual_seed(0)
    fixup = Transformer(tiny_config(**cfg, fixup=True))
    factor = L ** (-1 / (2 * 2 - 2))  # L^(-1/(2m-2)), m = 2 layers per branch
    checked = 0
    for name, p in fixup.named_parameters():
        if name.endswith(("attn.o.weight", "attn.o.bias", "ffn.down.weight", "ffn.down.bias")):
            assert p.abs().max() == 0, name  # rule 1: the last layer of every branch starts at 0
        elif name.endswith(("attn.q.weight", "attn.k.weight", "attn.v.weight", "ffn.up.weight")):
            torch.testing.assert_close(p, plain[name] * factor, rtol=0, atol=0)  # rule 2
            checked += 1
        elif ".fixup." in name:  # rule 3: a multiplier at 1 and an input bias at 0 per branch
            assert float(p.detach()) == (1.0 if name.endswith(".scale") else 0.0), name
        elif "layers" in name:
            torch.testing.assert_close(p, plain[name], rtol=0, atol=0)  # everything else as drawn
    # q, k, v, up per layer; an encoder-decoder's decoder layers add the cross-attention's q, k, v
    assert checked == (2 * 4 if arch == "decoder" else 2 * 4 + 2 * 7)
    assert not any("norm" in n for n, _ in fixup.named_parameters() if ".layers." in n)  # no norms at all


def test_fixup_stack_at_init_is_the_identity_residual_path():
    torch.manual_seed(0)
    model = Transformer(tiny_config(arch="decoder", n_layers=3, fixup=True, final_norm=False))
    out = model(ids(), attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]), output_hidden_states=True)
    for h in out.hidden_states[1:]:
        assert torch.equal(h, out.hidden_states[0])  # every branch adds exactly 0
    assert torch.equal(out.last_hidden_state, out.hidden_states[0])
    out.logits.sum().backward()  # and still learns: the zeroed output layers get gradients
    assert model.decoder.layers[0].attn.o.weight.grad.abs().sum() > 0


def test_fixup_branch_formula():
    branch = FixupBranch()
    with torch.no_grad():
        branch.scale.fill_(2.0), branch.bias.fill_(0.5)
    x = torch.tensor([1.0, -1.0])
    assert branch(x, lambda h: h * h).tolist() == [2 * 1.5 ** 2, 2 * 0.5 ** 2]  # s * F(x + b)


# ------------------------------------------------------------------------------------------- transparent attention
def test_transparent_mix_matches_hand_computation():
    mix = TransparentMix(n_sources=3, n_layers=2)
    with torch.no_grad():
        mix.logits.copy_(torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, -1.0]]))
    states = [torch.randn(2, 4, 5) for _ in range(3)]
    memory = torch.stack(states, dim=2)
    for j, row in enumerate(([0.0, 1.0, 2.0], [3.0, 0.0, -1.0])):
        z = sum(math.exp(v) for v in row)
        want = sum(math.exp(v) / z * h for v, h in zip(row, states))
        torch.testing.assert_close(mix(memory, j), want)


def transparent_model(**overrides):
    torch.manual_seed(0)
    fields = dict(arch="encoder-decoder", n_layers=2, n_decoder_layers=2, transparent_attention=True)
    return Transformer(tiny_config(**{**fields, **overrides})).eval()


def test_each_decoder_layer_cross_attends_to_its_own_mix_of_all_encoder_layers():
    model = transparent_model()
    W = torch.tensor([[2.0, -1.0, 0.5], [-3.0, 0.0, 1.0]])  # decoder layers x (embeddings + 2 encoder layers)
    with torch.no_grad():
        model.decoder.transparent.logits.copy_(W)
    src, tgt = ids(), ids(T=4, seed=1)
    seen = {}
    for j, block in enumerate(model.decoder.layers):  # what each cross-attention is handed
        block.cross_attn.register_forward_pre_hook(lambda m, args, j=j: seen.__setitem__(j, args[2]))
    with torch.no_grad():
        model(src, decoder_input_ids=tgt)
        _, hidden = model.encoder(model.embed_tokens(src), output_hidden_states=True)
    assert len(hidden) == 3
    for j in range(2):
        weights = torch.softmax(W[j], -1)
        want = sum(w * h for w, h in zip(weights.tolist(), hidden))
        torch.testing.assert_close(seen[j], want)


def test_one_decoder_layer_equals_a_plain_model_reading_the_hand_mixed_memory():
    model = transparent_model(n_decoder_layers=1)
    with torch.no_grad():
        model.decoder.transparent.logits.copy_(torch.tensor([[1.0, -2.0, 0.5]]))
    plain = Transformer(model.config.replace(transparent_attention=False)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "transparent" not in k})
    src, tgt = ids(), ids(T=4, seed=1)
    with torch.no_grad():
        _, hidden = plain.encoder(plain.embed_tokens(src), output_hidden_states=True)
        w = torch.softmax(torch.tensor([1.0, -2.0, 0.5]), -1).tolist()
        memory = sum(a * h for a, h in zip(w, hidden))
        torch.testing.assert_close(model(src, decoder_input_ids=tgt).logits,
                                   plain(decoder_input_ids=tgt, encoder_hidden_states=memory).logits)


def test_transparent_decoding_with_a_cache_equals_the_full_forward_and_beams_run():
    model = transparent_model()
    src, tgt = ids(), ids(T=4, seed=1)
    with torch.no_grad():
        memory, _ = model.encode(src)
        assert memory.shape == (2, 6, 3, 32)
        full = model(decoder_input_ids=tgt, encoder_hidden_states=memory).logits
        cache, steps = KVCache(), []
        for t in range(4):
            steps.append(model(decoder_input_ids=tgt[:, t:t + 1], encoder_hidden_states=memory,
                               past_key_values=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    out = generate(model, src, max_new_tokens=3, num_beams=2)
    assert out.sequences.shape[0] == 2


@pytest.mark.parametrize("fields", [dict(fixup=True), dict(transparent_attention=True)])
def test_new_params_save_and_reload_exactly(fields, tmp_path):
    from lmforge import checkpoint

    torch.manual_seed(0)
    model = Transformer(tiny_config(arch="encoder-decoder", **fields)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # away from the init, so a reload that re-initialises fails
    folder = checkpoint.save(model, tmp_path / "m")
    again = checkpoint.load(folder).eval()
    src, tgt = ids(), ids(T=4, seed=1)
    with torch.no_grad():
        assert torch.equal(model(src, decoder_input_ids=tgt).logits, again(src, decoder_input_ids=tgt).logits)


# ------------------------------------------------------------------------------------------- interop
@pytest.mark.parametrize("preset, fields", [
    ("gpt2", dict(rezero=True, rezero_norm=True)),
    ("gpt2", dict(fixup=True)),
    ("t5-small", dict(transparent_attention=True)),
])
def test_hugging_face_conversion_refuses_these_rows(preset, fields):
    from lmforge.config import ModelConfig

    base = ModelConfig.from_preset(preset)  # only the config is translated: no weights are built
    hf_config_for(base)  # the row's base converts ...
    with pytest.raises(HFConversionError):
        hf_config_for(base.replace(**fields))  # ... the row does not


def test_shared_encoder_scoring_reads_the_transparent_memory():
    from lmforge.prompting.verbalizer import score_seq2seq

    model = transparent_model()
    source, answers = [5, 6, 7, 8], [[9, 10], [11, 12, 13]]
    shared = score_seq2seq(model, source, answers, share_encoder=True)
    again = score_seq2seq(model, source, answers, share_encoder=False)
    for a, b in zip(shared, again):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fields", [dict(block="evolved"), dict(weighted_branches=True), dict(pkm_layers=[0]),
                                    dict(attention="synthesizer-dense")])
def test_fixup_refuses_layer_types_whose_branches_it_does_not_know(fields):
    with pytest.raises(ConfigError, match=r"fixup"):
        tiny_config(arch="decoder", fixup=True, **fields)
