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


def _padded_labels(ids: torch.Tensor) -> torch.Tensor:
    labels = ids.clone()
    labels[0, -5:] = -100  # a padded tail: the mean must skip it
    labels[1, :3] = -100
    return labels


def test_loss_kept_in_the_compiled_graph_equals_the_labelled_rows_loss(device):
    # On a GPU a compiled decoder computes its loss over every position inside the graph (no graph break, no
    # host sync): its default there, forced on a CPU. The loss, its count and the gradients equal the eager
    # labelled-rows path's.
    torch.manual_seed(0)
    for arch in ("decoder", "encoder-decoder"):
        model = Transformer(tiny_config(arch=arch, max_seq_len=32)).train().to(device)
        model.label_smoothing = 0.1
        ids = torch.randint(1, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
        ids = ids.to(device)
        batch = {"input_ids": ids, "labels": _padded_labels(ids)}
        if arch == "encoder-decoder":
            batch["decoder_input_ids"] = ids

        def run(forward):
            model.zero_grad(set_to_none=True)
            out = forward(**batch)
            out.loss.backward()
            return out, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

        eager, grad_eager = run(model)
        assert model._loss_in_graph(torch.zeros(1, device=device), None) == (device == "cuda")  # the default
        model.loss_in_graph = True
        compiled, grad_compiled = run(torch.compile(model, backend="aot_eager", fullgraph=True))  # no graph break
        assert int(compiled.n_targets) == eager.n_targets == int((batch["labels"] != -100).sum())
        assert compiled.logits.shape == (ids.numel(), model.config.vocab_size)
        torch.testing.assert_close(compiled.loss, eager.loss, atol=1e-5, rtol=0)
        torch.testing.assert_close(grad_compiled, grad_eager, atol=1e-5, rtol=1e-4)
        torch._dynamo.reset()


def test_loss_in_graph_is_refused_where_the_rows_must_be_selected():
    model = Transformer(tiny_config(arch="decoder"))
    h = torch.zeros(1, 1, 1, device="meta")
    assert model._loss_in_graph(h, None) is False  # not a GPU
    model.loss_in_graph = True
    assert model._loss_in_graph(h, torch.ones(1, 1)) is False  # per-token weights take the selecting path
    assert Transformer(tiny_config(arch="encoder")).loss_in_graph is None
