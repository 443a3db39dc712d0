"""Narang et al. 2021's remaining rows: the activations (ELU, SeLU, sigmoid, softplus; GLU and the bilinear
LiGLU as gated FFNs) against hand computations, ReZero (identity at init, a learned gate), and the Universal
Transformer's shared layer with a per-step signal."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import tiny_config

from lmforge.config import ConfigError
from lmforge.models import Transformer
from lmforge.nn.activations import activation_fn
from lmforge.nn.attention import AttentionContext
from lmforge.nn.ffn import FeedForward
from lmforge.nn.positions.sinusoidal import sinusoidal_table

X = [-2.0, -0.5, 0.0, 1.5]
SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805  # Klambauer et al. 2017, eq. 2
HAND = {
    "elu": lambda x: x if x > 0 else math.exp(x) - 1,
    "selu": lambda x: SELU_SCALE * (x if x > 0 else SELU_ALPHA * (math.exp(x) - 1)),
    "sigmoid": lambda x: 1 / (1 + math.exp(-x)),
    "softplus": lambda x: math.log(1 + math.exp(x)),
}


@pytest.mark.parametrize("name", HAND)
def test_plain_activation_matches_its_formula(name):
    got = activation_fn(name)(torch.tensor(X, dtype=torch.float64)).tolist()
    assert got == pytest.approx([HAND[name](x) for x in X], abs=1e-12)


@pytest.mark.parametrize("name, gate", [("glu", HAND["sigmoid"]), ("liglu", lambda x: x)])
def test_gated_ffn_matches_hand_computation(name, gate):
    torch.manual_seed(0)
    ffn = FeedForward(3, 4, name, bias=True).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    g, u = (x @ ffn.gate.weight.T + ffn.gate.bias).tolist(), (x @ ffn.up.weight.T + ffn.up.bias).tolist()
    hidden = torch.tensor([[gate(a) * b for a, b in zip(gr, ur)] for gr, ur in zip(g, u)], dtype=torch.float64)
    torch.testing.assert_close(ffn(x), hidden @ ffn.down.weight.T + ffn.down.bias)


def test_liglu_is_bilinear():
    torch.manual_seed(0)  # no nonlinearity: scaling the input by c scales the hidden layer by c^2
    ffn = FeedForward(3, 4, "liglu", bias=False).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(ffn(3 * x), 9 * ffn(x))


def test_rezero_layers_start_as_the_identity_and_learn_their_gate():
    torch.manual_seed(0)
    model = Transformer(tiny_config(arch="decoder", rezero=True, final_norm=False))
    blocks = model.decoder.layers
    assert all(isinstance(b.attn_norm, torch.nn.Identity) and float(b.rezero.detach()) == 0.0 for b in blocks)
    ids = torch.randint(1, 97, (2, 6))
    out = model(ids, output_hidden_states=True)
    torch.testing.assert_close(out.hidden_states[-1], out.hidden_states[0])  # every layer passes x through
    out.logits.pow(2).mean().backward()
    assert all(b.rezero.grad is not None and b.rezero.grad.abs() > 0 for b in blocks)
    with torch.no_grad():
        for b in blocks:
            b.rezero.fill_(0.5)
    assert not torch.allclose(model(ids, output_hidden_states=True).hidden_states[-1], out.hidden_states[0])
    model.reset_parameters()  # a random re-initialisation closes the gates again
    assert all(float(b.rezero.detach()) == 0.0 for b in blocks)


def test_universal_transformer_adds_the_step_signal_before_each_shared_step():
    torch.manual_seed(0)
    cfg = tiny_config(arch="encoder", head="mlm", share_layers=True, step_embeddings=True, n_layers=3,
                      final_norm=False)
    model = Transformer(cfg).eval()
    ids = torch.randint(1, 97, (2, 5))
    out = model(ids, output_hidden_states=True)
    layer, signal = model.encoder.layers[0], sinusoidal_table(3, cfg.d_model)
    assert len(model.encoder.layers) == 1
    x = out.hidden_states[0]
    for step in range(3):
        x = layer(x + signal[step], AttentionContext(), layer=step)
        torch.testing.assert_close(out.hidden_states[step + 1], x)
    plain = Transformer(cfg.replace(step_embeddings=False)).eval()
    plain.load_state_dict(model.state_dict())  # the signal is derived: no new weights
    assert not torch.allclose(plain(ids).logits, out.logits)


@pytest.mark.parametrize("overrides, field", [
    (dict(step_embeddings=True), "step_embeddings"),
    (dict(share_layers=True, attn_scale_by_layer=True), "attn_scale_by_layer"),
    (dict(activation="tanh"), "activation"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(arch="encoder", head="mlm", sliding_window=4), "sliding_window"),
])
def test_bad_combinations_are_one_line_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"ModelConfig\.{field}[=\s]"):
        tiny_config(**overrides)
