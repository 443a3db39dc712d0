"""Every PEFT method on encoder, decoder and encoder-decoder models: identity at initialisation, base
untouched, gradients only on the adapter, save -> load bit-exact."""

from __future__ import annotations

import copy

import pytest
import torch

from lmforge.peft import PeftConfig, apply_peft, load_adapter
from peft_helpers import ARCHS, CHANGES_OUTPUT, IDENTITY_AT_INIT, METHODS, batch, config, on, perturb, tiny_model

MATRIX = [(arch, method) for arch in ARCHS for method in METHODS]


@pytest.mark.parametrize("arch,method", [(a, m) for a, m in MATRIX if m in IDENTITY_AT_INIT])
def test_identity_at_initialisation(arch, method, device):
    base = tiny_model(arch).to(device)
    b = on(batch(arch), device)
    expected = base(**b).logits
    model = apply_peft(base, config(method))
    # Wrapping q/k/v switches attention from its fused to its unfused projection: equal up to fp32 rounding.
    torch.testing.assert_close(model(**b).logits, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_qlora_starts_as_its_quantised_base(arch, device):
    model = apply_peft(tiny_model(arch).to(device), config("qlora"))
    b = on(batch(arch), device)
    with model.disable_adapters():
        expected = model(**b).logits
    assert torch.equal(model(**b).logits, expected)


@pytest.mark.parametrize("arch,method", [(a, m) for a, m in MATRIX if m in CHANGES_OUTPUT])
def test_virtual_tokens_change_output_but_disabled_is_base_and_base_untouched(arch, method):
    base = tiny_model(arch)
    b = batch(arch, labels=True)
    expected = base(**{k: v for k, v in b.items() if k != "labels"}).logits
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    params = dict(base.named_parameters())
    model = apply_peft(base, config(method))
    plain = {k: v for k, v in b.items() if k != "labels"}
    assert not torch.allclose(model(**plain).logits, expected, atol=1e-3)
    with model.disable_adapters():
        torch.testing.assert_close(model(**plain).logits, expected, atol=1e-6, rtol=1e-6)
    model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(**b).loss.backward()
    optimizer.step()
    for name, p in params.items():
        assert torch.equal(p, before[name]), f"base parameter {name} changed"


@pytest.mark.parametrize("arch,method", MATRIX)
def test_only_adapter_parameters_receive_gradients(arch, method, device):
    model = apply_peft(tiny_model(arch).to(device), config(method)).train()
    perturb(model)  # B = 0 / W_up = 0 would leave the other factor's gradient at exactly zero
    model.zero_grad()
    model(**on(batch(arch, labels=True), device)).loss.backward()
    adapter = {id(p) for p in model.adapter_parameters("default").values()}
    assert adapter
    for name, p in model.named_parameters():
        if id(p) in adapter:
            assert p.requires_grad and p.grad is not None and p.grad.abs().sum() > 0, f"{name} got no gradient"
        else:
            assert not p.requires_grad and p.grad is None, f"base parameter {name} got a gradient"


@pytest.mark.parametrize("arch,method", MATRIX)
def test_save_load_is_bit_exact(arch, method, tmp_path):
    base = tiny_model(arch)
    fresh = copy.deepcopy(base)
    model = apply_peft(base, config(method))
    perturb(model)
    b = batch(arch)
    expected = model(**b).logits
    model.save_adapter(tmp_path / "adapter")
    loaded = load_adapter(fresh, tmp_path / "adapter")
    assert loaded.peft_configs["default"].method == method
    assert torch.equal(loaded(**b).logits, expected)


def test_parameter_report_counts_trainable_and_total():
    base = tiny_model("gpt-tiny")
    total = base.num_parameters()
    model = apply_peft(base, PeftConfig(method="lora", r=4, targets=["q", "v"]))
    report = model.parameter_report()
    assert report.trainable == 2 * 2 * (4 * 64 + 64 * 4)  # layers x targets x (A + B)
    assert report.total == total + report.trainable
    assert report.per_adapter == {"default": report.trainable}
    assert str(report).startswith(f"trainable params: {report.trainable:,} || all params: {report.total:,}")


def test_lora_is_the_paper_formula():
    base = tiny_model("gpt-tiny")
    model = apply_peft(base, PeftConfig(method="lora", r=4, alpha=8, targets=["attn.q"]))
    perturb(model)
    layer = model.base_model.decoder.layers[0].attn.q
    lora = layer.adapters["default"]
    x = torch.randn(3, 64)
    expected = x @ layer.base.weight.T + layer.base.bias + (8 / 4) * x @ lora.A.weight.T @ lora.B.weight.T
    torch.testing.assert_close(layer(x), expected)
    rs = apply_peft(tiny_model("gpt-tiny"), PeftConfig(method="lora", r=4, alpha=8, rslora=True))
    assert rs.base_model.decoder.layers[0].attn.q.adapters["default"].scaling == 8 / 2  # alpha / sqrt(r)


def test_ia3_scales_keys_values_and_the_ffn_activation():
    model = apply_peft(tiny_model("bert-tiny"), PeftConfig(method="ia3"))
    layer = model.base_model.encoder.layers[0]
    assert not layer.attn.k.adapters["default"].on_input and not layer.attn.v.adapters["default"].on_input
    assert layer.ffn.down.adapters["default"].on_input and layer.ffn.down.adapters["default"].scale.shape == (128,)
    assert model.parameter_report().trainable == 2 * (64 + 64 + 128)


def test_bitfit_trains_exactly_the_biases_of_a_biased_model():
    base = tiny_model("bert-tiny")
    stack_biases = sum(p.numel() for n, p in base.named_parameters()
                       if n.startswith("encoder.") and n.endswith(".bias"))
    model = apply_peft(base, PeftConfig(method="bitfit"))
    assert model.parameter_report().trainable == stack_biases


def test_adapters_wrap_the_sublayer_outputs():
    model = apply_peft(tiny_model("gpt-tiny"), config("adapter"))
    layer = model.base_model.decoder.layers[0]
    assert set(layer.attn.o.adapters) == {"default"} and set(layer.ffn.down.adapters) == {"default"}
    mam = apply_peft(tiny_model("gpt-tiny"), config("mam"))
    assert "default" in mam.base_model.decoder.layers[0].ffn.adapters and "default" in mam.prefixes


def test_unknown_target_is_a_clear_error():
    with pytest.raises(ValueError, match="'qq' matches no Linear/NF4Linear module.*attn.q"):
        apply_peft(tiny_model("gpt-tiny"), PeftConfig(method="lora", targets=["qq"]))


def test_prompt_init_from_vocabulary_and_text():
    base = tiny_model("gpt-tiny")
    table = base.embed_tokens.weight
    model = apply_peft(base, PeftConfig(method="prompt", num_virtual_tokens=5), name="vocab")
    emb = model.prompts["vocab"].embedding
    assert all(any(torch.equal(row, t) for t in table) for row in emb)  # every row is a vocabulary row

    class Tok:  # the smallest tokenizer: one id per character
        def encode(self, text, add_special_tokens=True):
            return [ord(c) % 100 + 3 for c in text]

    model.add_adapter("text", PeftConfig(method="prompt", num_virtual_tokens=5, prompt_init="text",
                                         prompt_init_text="abc"), tokenizer=Tok())
    ids = [ord(c) % 100 + 3 for c in "abcab"]  # the text, repeated to length 5
    assert torch.equal(model.prompts["text"].embedding, table[ids])
    with pytest.raises(ValueError, match="needs a tokenizer"):
        model.add_adapter("t2", PeftConfig(method="prompt", prompt_init="text", prompt_init_text="abc"))


def test_deepcopy_gives_an_independent_model():
    model = apply_peft(tiny_model("gpt-tiny"), config("prefix"))
    model.add_adapter("lora", config("lora"))
    perturb(model, "lora")
    clone = copy.deepcopy(model)
    ids = torch.randint(3, 128, (2, 5))
    for name in ("default", "lora"):
        model.set_adapter(name)
        clone.set_adapter(name)
        assert torch.equal(clone(ids).logits, model(ids).logits)
    clone.set_adapter("default")  # the copy's hooks and state serve the copy only
    with torch.no_grad():
        clone.prefixes["default"].stacks["decoder"].embedding.add_(1.0)
    model.set_adapter("default")
    assert not torch.allclose(clone(ids).logits, model(ids).logits)
    assert model.active_adapter == "default"
