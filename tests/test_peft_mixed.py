"""Several adapters on one base: switching, and mixed-adapter batches that equal running each row alone."""

from __future__ import annotations

import pytest
import torch

from lmforge.nn.kv_cache import KVCache
from lmforge.peft import PeftConfig, apply_peft
from peft_helpers import ARCHS, batch, config, perturb, rows, tiny_model


def _model(arch: str, specs: dict[str, PeftConfig]):
    model = None
    for i, (name, cfg) in enumerate(specs.items()):
        model = apply_peft(tiny_model(arch) if model is None else model, cfg, name=name)
        perturb(model, name, seed=10 + i)
    return model


def _check_rows_equal_alone(model, arch: str, names: list):
    b = batch(arch, B=len(names), T=6)
    mixed = model(**b, adapter_names=names).logits
    for i, name in enumerate(names):
        model.set_adapter(name)
        alone = model(**rows(b, i)).logits
        torch.testing.assert_close(mixed[i:i + 1], alone, atol=1e-5, rtol=1e-5, msg=f"row {i} ({name})")


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_lora_batch_equals_each_row_alone(arch):
    model = _model(arch, {"a": config("lora"), "b": config("lora", r=2, targets=["k", "ffn.up"])})
    _check_rows_equal_alone(model, arch, ["a", "b", None, "b"])


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_prefix_batch_equals_each_row_alone(arch):
    # Different prefix lengths (3 and 5) and a row with none: shorter prefixes are padded and masked.
    model = _model(arch, {"p3": config("prefix"),
                          "p5": config("prefix", num_virtual_tokens=5, prefix_projection=False)})
    _check_rows_equal_alone(model, arch, ["p3", "p5", None, "p3"])


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_methods_in_one_batch(arch):
    model = _model(arch, {"lora": config("lora"), "prefix": config("prefix"), "ia3": config("ia3"),
                          "mam": config("mam"), "adapter": config("adapter")})
    _check_rows_equal_alone(model, arch, ["lora", "prefix", "ia3", "mam", "adapter", None])


def test_mixed_prefix_batch_with_kv_cached_decoding():
    model = _model("gpt-tiny", {"p3": config("prefix"), "lora": config("lora"),
                                "p5": config("prefix", num_virtual_tokens=5)})
    names = ["p3", "lora", "p5"]
    ids = torch.randint(3, 128, (3, 6))
    full = model(ids, adapter_names=names).logits
    cache = KVCache()
    steps = [model(ids[:, t:t + 1], past_key_values=cache, use_cache=True, adapter_names=names).logits
             for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="keep the rows. adapters fixed during generation"):
        model(ids[:, :1], past_key_values=cache, use_cache=True, adapter_names=["p3", "p3", "lora"])


def test_mixed_batch_trains_each_adapter_on_its_rows():
    model = _model("gpt-tiny", {"a": config("lora"), "b": config("lora")})
    model.set_trainable(["a", "b"])
    b = batch("gpt-tiny", B=2, labels=True)
    model(**b, adapter_names=["a", "a"]).loss.backward()
    assert all(p.grad is None for p in model.adapter_parameters("b").values())  # b's rows: none
    assert all(p.grad is not None for p in model.adapter_parameters("a").values())


def test_switching_adapters_and_trainable_flags():
    model = _model("bert-tiny", {"a": config("lora"), "b": config("ia3")})
    b = batch("bert-tiny")
    outs = {}
    for name in ("a", "b", None):
        model.set_adapter(name)
        outs[name] = model(**b).logits
        for n in ("a", "b"):
            assert all(p.requires_grad == (n == name) for p in model.adapter_parameters(n).values())
    assert not torch.allclose(outs["a"], outs["b"]) and not torch.allclose(outs["a"], outs[None])
    model.set_adapter("a")
    assert torch.equal(model(**b).logits, outs["a"])
    model.delete_adapter("a")
    assert model.adapters == ["b"] and model.active_adapter is None
    assert torch.equal(model(**b).logits, outs[None])


def test_mixed_batch_errors_are_clear():
    model = _model("gpt-tiny", {"a": config("lora"), "p": config("prompt")})
    ids = torch.randint(3, 128, (2, 5))
    with pytest.raises(KeyError, match="no adapter named 'zz'"):
        model(ids, adapter_names=["a", "zz"])
    with pytest.raises(ValueError, match="2 rows"):
        model(ids, adapter_names=["a", "a", "a"])
    with pytest.raises(ValueError, match="prompt tuning adapters \\(p\\) cannot share a mixed-adapter batch"):
        model(ids, adapter_names=["a", "p"])
    assert model(ids, adapter_names=["p", "p"]).logits.shape == (2, 5, 128)
