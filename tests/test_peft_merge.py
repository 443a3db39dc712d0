"""Merging: merged equals unmerged (<= 1e-5), unmerge is exact, merge_and_unload gives a plain model, and
``lmforge peft merge`` writes one."""

from __future__ import annotations

import copy

import pytest
import torch

import lmforge
from lmforge.cli.main import main
from lmforge.peft import apply_peft
from lmforge.peft.layer import AdaptedModule
from lmforge.peft.qlora import NF4Linear
from peft_helpers import ARCHS, batch, config, perturb, tiny_model

# BitFit merges where every targeted layer has a bias (T5's RMSNorm and bias-free linears have none).
MERGEABLE = [(a, m) for a in ARCHS for m in ("lora", "qlora", "ia3")] + [
    (a, "bitfit") for a in ("bert-tiny", "gpt-tiny", "bart-tiny")]


@pytest.mark.parametrize("arch,method", MERGEABLE)
def test_merge_equals_unmerged_and_unmerge_is_exact(arch, method):
    model = apply_peft(tiny_model(arch), config(method))
    perturb(model)
    b = batch(arch)
    unmerged = model(**b).logits
    model.merge()
    torch.testing.assert_close(model(**b).logits, unmerged, atol=1e-5, rtol=0)
    with model.disable_adapters():  # the original layers stay available while merged
        base = model(**b).logits
    model.unmerge()
    assert torch.equal(model(**b).logits, unmerged)
    with model.disable_adapters():
        assert torch.equal(model(**b).logits, base)


@pytest.mark.parametrize("arch,method", MERGEABLE)
def test_merge_and_unload_is_a_plain_model(arch, method, tmp_path):
    model = apply_peft(tiny_model(arch), config(method))
    perturb(model)
    b = batch(arch)
    expected = model(**b).logits
    plain = model.merge_and_unload()
    assert type(plain).__name__ == "Transformer"
    assert not any(isinstance(m, (AdaptedModule, NF4Linear)) for m in plain.modules())
    torch.testing.assert_close(plain(**b).logits, expected, atol=1e-5, rtol=0)
    reloaded = lmforge.load(plain.save(tmp_path / "merged"))
    torch.testing.assert_close(reloaded(**b).logits, expected, atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="unloaded"):
        model(**b)


@pytest.mark.parametrize("method", ["adapter", "prefix", "prompt", "mam"])
def test_methods_that_do_not_fold_into_weights_refuse_to_merge(method):
    model = apply_peft(tiny_model("gpt-tiny"), config(method))
    with pytest.raises(ValueError, match=f"\\({method}\\) cannot be merged"):
        model.merge()
    with pytest.raises(ValueError, match="cannot be merged"):
        model.merge_and_unload()


def test_bitfit_on_a_bias_free_model_cannot_become_a_plain_model():
    model = apply_peft(tiny_model("t5-tiny"), config("bitfit", targets=["q", "v"]))
    perturb(model)
    b = batch("t5-tiny")
    expected = model(**b).logits
    model.merge()  # in memory the merged layers may gain a bias ...
    torch.testing.assert_close(model(**b).logits, expected, atol=1e-5, rtol=0)
    model.unmerge()
    with pytest.raises(ValueError, match="adds biases to layers the base model has none for"):
        model.merge_and_unload()  # ... but a bias=False config cannot hold them


def test_merge_one_adapter_while_others_stay_live():
    model = apply_peft(tiny_model("gpt-tiny"), config("lora"), name="a")
    perturb(model, "a")
    model.add_adapter("b", config("lora", r=2))
    perturb(model, "b", seed=5)
    b = batch("gpt-tiny")
    ref = model(**b, adapter_names=["a", "b"]).logits
    model.merge("a")
    torch.testing.assert_close(model(**b, adapter_names=["a", "b"]).logits, ref, atol=1e-5, rtol=0)


def test_cli_merge_writes_a_plain_model(tmp_path, capsys):
    base = tiny_model("gpt-tiny")
    base.save(tmp_path / "base")
    model = apply_peft(copy.deepcopy(base), config("lora"))
    perturb(model)
    model.save_adapter(tmp_path / "adapter")
    b = batch("gpt-tiny")
    expected = model(**b).logits
    argv = ["peft", "merge", "--base", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter"),
            "--out", str(tmp_path / "merged")]
    assert main(argv) == 0
    assert "merged" in capsys.readouterr().out
    torch.testing.assert_close(lmforge.load(tmp_path / "merged")(**b).logits, expected, atol=1e-5, rtol=0)
    assert main(argv) == 2  # OUT exists: refuse without --overwrite
    assert "already exists" in capsys.readouterr().err


def test_cli_merge_refuses_a_non_mergeable_adapter(tmp_path, capsys):
    base = tiny_model("gpt-tiny")
    base.save(tmp_path / "base")
    apply_peft(base, config("adapter")).save_adapter(tmp_path / "adapter")
    assert main(["peft", "merge", "--base", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter"),
                 "--out", str(tmp_path / "merged")]) == 2
    assert "(adapter) cannot be merged" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()
