"""Linformer attention (:mod:`lmforge.nn.linformer`): with k = n and identity projections it is full attention;
padding is handled by zeroing the padded keys before the projection, so a padded row equals the same row
unpadded; shorter inputs slice the projections; what it cannot express is refused by config validation."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_config

import lmforge
from lmforge.config import ConfigError
from lmforge.errors import UserInputError
from lmforge.interop.hf import HFConversionError
from lmforge.models import Transformer
from lmforge.nn import attention


def _linformer(**overrides):
    base = dict(arch="encoder", head="mlm", position="learned", max_seq_len=12, attention="linformer", linformer_k=12)
    return tiny_config(**{**base, **overrides})


@pytest.mark.parametrize("sharing", ["headwise", "key-value", "none"])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_identity_projections_with_k_equal_n_give_full_attention(sharing, n_kv_heads):
    torch.manual_seed(0)
    cfg = _linformer(linformer_sharing=sharing, n_kv_heads=n_kv_heads)
    lin = Transformer(cfg).eval()
    full = Transformer(cfg.replace(attention="full")).eval()
    missing, unexpected = full.load_state_dict(lin.state_dict(), strict=False)
    assert not missing and all(".linformer." in name for name in unexpected) and unexpected
    for block in lin.encoder.layers:
        for p in (block.attn.linformer.E, block.attn.linformer.F):
            if p is not None:
                p.data.copy_(torch.eye(12).expand_as(p))
    ids = torch.randint(1, cfg.vocab_size, (2, 12))
    torch.testing.assert_close(lin(ids).logits, full(ids).logits, atol=1e-5, rtol=1e-5)


def test_random_projections_differ_from_full_attention():
    torch.manual_seed(0)  # the identity test above can fail: random E, F are not full attention
    cfg = _linformer(linformer_k=4)
    lin = Transformer(cfg).eval()
    full = Transformer(cfg.replace(attention="full")).eval()
    full.load_state_dict(lin.state_dict(), strict=False)
    ids = torch.randint(1, cfg.vocab_size, (2, 12))
    assert (lin(ids).logits - full(ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize("sharing", ["headwise", "none"])
def test_a_padded_row_equals_the_same_row_unpadded(sharing):
    torch.manual_seed(0)
    cfg = _linformer(linformer_k=5, linformer_sharing=sharing, n_kv_heads=2)
    model = Transformer(cfg).eval()
    ids = torch.randint(1, cfg.vocab_size, (2, 10))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding
    batch = model(ids, attention_mask=mask).last_hidden_state
    alone = model(ids[1:, :7]).last_hidden_state
    torch.testing.assert_close(batch[1, :7], alone[0], atol=1e-5, rtol=1e-5)
    # Without zeroing, the padded keys would leak into E K: the padded positions' tokens change the row.
    other = ids.clone()
    other[1, 7:] = (other[1, 7:] + 1) % cfg.vocab_size
    torch.testing.assert_close(model(other, attention_mask=mask).last_hidden_state[1, :7], batch[1, :7])


def test_projection_shapes_by_sharing():
    shapes = {}
    for sharing in ("headwise", "key-value", "none"):
        proj = Transformer(_linformer(linformer_k=6, linformer_sharing=sharing, n_kv_heads=2)).encoder.layers[0].attn
        E, F = proj.linformer.E, proj.linformer.F
        shapes[sharing] = (tuple(E.shape), None if F is None else tuple(F.shape))
    assert shapes == {"headwise": ((1, 6, 12), (1, 6, 12)), "key-value": ((1, 6, 12), None),
                      "none": ((2, 6, 12), (2, 6, 12))}


def test_every_length_up_to_max_seq_len_runs_and_longer_is_refused():
    torch.manual_seed(0)
    model = Transformer(_linformer(linformer_k=4, position="rope")).eval()
    for n in (1, 3, 12):
        assert model(torch.randint(1, 97, (2, n))).logits.shape == (2, n, 97)
    with pytest.raises(UserInputError, match="max_seq_len=12"):
        model(torch.randint(1, 97, (1, 13)))


def test_gradients_reach_the_projections_and_matmul_path_equals_sdpa(monkeypatch):
    torch.manual_seed(0)
    cfg = _linformer(linformer_k=4)
    model = Transformer(cfg).train()
    ids = torch.randint(1, cfg.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    results = []
    for matmul in (True, False):
        monkeypatch.setattr(attention, "use_matmul_attention", lambda q, k, m, matmul=matmul: matmul)
        model.zero_grad(set_to_none=True)
        out = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
        out.loss.backward()
        results.append((out.logits.detach(), model.encoder.layers[0].attn.linformer.E.grad.clone()))
    (la, ga), (lb, gb) = results
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-4)
    assert ga[:, :, :9].abs().sum() > 0 and ga[:, :, 9:].abs().sum() == 0  # columns past the input stay unused


@pytest.mark.parametrize("overrides, field", [
    (dict(arch="decoder", head="lm"), "attention"),
    (dict(arch="encoder-decoder", head="lm"), "attention"),
    (dict(linformer_k=13), "linformer_k"),
    (dict(linformer_k=0), "linformer_k"),
    (dict(linformer_sharing="layerwise"), "linformer_sharing"),
    (dict(position="alibi"), "position"),
])
def test_what_linformer_cannot_do_is_one_line_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        _linformer(**overrides)
    message = str(info.value)
    assert f"ModelConfig.{field}=" in message and "\n" not in message


def test_reset_parameters_redraws_the_projections():
    model = Transformer(_linformer(linformer_k=4))
    E = model.encoder.layers[0].attn.linformer.E
    E.data.fill_(7.0)
    model.reset_parameters()  # random_init of a loaded model reaches E and F too
    assert not (E == 7.0).any() and abs(E.std().item() - 0.5) < 0.1


def test_no_hugging_face_family_expresses_linformer(tmp_path):
    with pytest.raises(HFConversionError, match="no Hugging Face architecture expresses"):
        lmforge.to_hf(Transformer(_linformer(linformer_k=4)), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_flops_count_k_projected_keys_not_the_projection_weights():
    cfg = _linformer(linformer_k=4, max_seq_len=64)
    lin, full = Transformer(cfg), Transformer(cfg.replace(attention="full"))
    d, L, T = cfg.d_model, cfg.n_layers, 64
    # Same weights per token (E and F excluded); attention over k = 4 rows plus E K and F V, instead of T keys.
    assert full.flops_per_token(T) - lin.flops_per_token(T) == L * (12 * d * T - 12 * 4 * (d + d))
