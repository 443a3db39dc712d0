"""A torch.compile'd training step computes what the eager one does.

Compiled, the model takes forms that only pay off under inductor: GPT-2's GELU as ``x * sigmoid(2u)``
and causal attention in two query halves (``lmforge.nn.attention.split_causal_in_halves``). Eager and
compiled bf16 steps round differently, so the whole step is compared loosely here; the exact
equivalences are checked tightly (here, in fp64, for the GELU; in ``test_attention_paths`` for the halves).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import count_causal_halves, tiny_config

from lmforge.models import Transformer
from lmforge.nn.activations import gelu_tanh


def test_compiled_gelu_tanh_is_the_tanh_formula():
    x = torch.linspace(-8, 8, 1001, dtype=torch.float64, requires_grad=True)  # fp64: the identity, not rounding
    y = torch.compile(gelu_tanh, backend="aot_eager")(x)  # the traced (sigmoid) form, without codegen
    ref = F.gelu(x, approximate="tanh")
    torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-12)
    (g,) = torch.autograd.grad(y.sum(), x)
    (g_ref,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=1e-12)


def test_compiled_bf16_training_step_matches_eager(monkeypatch):
    torch.manual_seed(0)
    cfg = tiny_config(arch="decoder", position="learned", activation="gelu-tanh", max_seq_len=64)
    model = Transformer(cfg).train()
    ids = torch.randint(1, cfg.vocab_size, (2, 64), generator=torch.Generator().manual_seed(3))
    halves = count_causal_halves(monkeypatch)

    def step(run):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    loss_eager, grad_eager = step(model)
    assert not halves  # eagerly, one softmax
    loss_compiled, grad_compiled = step(torch.compile(model))
    assert len(halves) == cfg.n_layers  # traced once, per layer
    torch.testing.assert_close(loss_compiled, loss_eager, atol=2e-2, rtol=0)
    cosine = F.cosine_similarity(grad_compiled.float(), grad_eager.float(), dim=0)
    assert cosine > 0.999, cosine
