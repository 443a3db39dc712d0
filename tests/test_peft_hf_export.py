"""``export_hf``: adapters load in HF peft onto the to_hf export of the base with the same logits (<= 1e-4)."""

from __future__ import annotations

import importlib

import copy
import json
import warnings

import pytest
import torch

import lmforge
from lmforge.cli.main import main
from lmforge.peft import apply_peft
from lmforge.peft.hf_export import HFExportError, export_hf
from lmforge.peft.qlora import NF4Linear
from lmforge.peft.targets import logical_name
from peft_helpers import batch, config, perturb, tiny_model

peft = importlib.import_module("peft")
transformers = importlib.import_module("transformers")

AUTO = {"decoder": "AutoModelForCausalLM", "encoder": "AutoModelForMaskedLM",
        "encoder-decoder": "AutoModelForSeq2SeqLM"}
CASES = [
    ("gpt-tiny", "lora", dict(targets=["q", "v", "o", "ffn"])),  # q and v share GPT-2's fused c_attn
    ("gpt-tiny", "lora", dict(targets=["k"], rslora=True, alpha=6.0)),
    ("bert-tiny", "lora", dict(targets=["q", "k", "v", "o", "ffn"])),
    ("t5-tiny", "lora", dict(targets=["q", "v", "ffn"])),
    ("bart-tiny", "lora", dict()),
    ("gpt-tiny", "qlora", dict()),
    ("gpt-tiny", "ia3", dict()),
    ("bert-tiny", "ia3", dict()),
    ("gpt-tiny", "prefix", dict(prefix_projection=False)),
    ("gpt-tiny", "prompt", dict()),
]


def _copy_dequantised(model, plain):
    with torch.no_grad():
        for path, module in model.base_model.named_modules():
            if isinstance(module, NF4Linear):
                plain.get_submodule(logical_name(path)).weight.copy_(module.dense_weight())


def _hf_peft(base, folder, tmp_path):
    hf_path = lmforge.to_hf(base, tmp_path / "base-hf")
    hf = getattr(transformers, AUTO[base.config.arch]).from_pretrained(hf_path).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.PeftModel.from_pretrained(hf, folder).eval()


@pytest.mark.parametrize("arch,method,options", CASES, ids=[f"{a}-{m}-{i}" for i, (a, m, _) in enumerate(CASES)])
def test_export_loads_in_hf_peft_with_the_same_logits(arch, method, options, tmp_path):
    base = tiny_model(arch)
    hf_base = copy.deepcopy(base)
    model = apply_peft(base, config(method, **options))
    perturb(model, scale=0.2)
    if method == "qlora":  # give HF the weights QLoRA trained against: the dequantised NF4 ones
        _copy_dequantised(model, hf_base)
    folder = export_hf(model, tmp_path / "adapter")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    hf = _hf_peft(hf_base, folder, tmp_path)
    b = batch(arch)
    with torch.no_grad():
        ours = model(**b).logits
        with model.disable_adapters():
            plain = model(**b).logits
        theirs = hf(**b).logits
    if method == "prompt":
        theirs = theirs[:, config(method).num_virtual_tokens:]  # HF returns the prompt positions too
    # Compare real tokens (a padded row's pad positions are computed, but by no contract).
    mask = b["attention_mask"].bool() if arch in ("gpt-tiny", "bert-tiny") else torch.ones(ours.shape[:2], dtype=bool)
    assert (ours - plain)[mask].abs().max() > 1e-3  # the adapter does something, so agreeing means something
    torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-4, rtol=0)


def test_fused_module_gets_a_block_lora_at_the_combined_rank(tmp_path):
    model = apply_peft(tiny_model("gpt-tiny"), config("lora", r=4, alpha=8.0, targets=["q", "v"]))
    cfg = json.loads((export_hf(model, tmp_path / "a") / "adapter_config.json").read_text())
    assert cfg["target_modules"] == ["h.0.attn.c_attn", "h.1.attn.c_attn"] and cfg["fan_in_fan_out"]
    assert cfg["rank_pattern"] == {r"h\.0\.attn\.c_attn": 8, r"h\.1\.attn\.c_attn": 8}
    assert cfg["alpha_pattern"] == {r"h\.0\.attn\.c_attn": 16.0, r"h\.1\.attn\.c_attn": 16.0}  # alpha'/r' = 8/4


@pytest.mark.parametrize("arch,method", [("gpt-tiny", "adapter"), ("gpt-tiny", "bitfit"), ("gpt-tiny", "mam"),
                                         ("bert-tiny", "prefix"), ("t5-tiny", "prompt")])
def test_methods_without_an_hf_equivalent_are_refused(arch, method, tmp_path):
    model = apply_peft(tiny_model(arch), config(method))
    with pytest.raises(HFExportError):
        export_hf(model, tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_cli_export_hf(tmp_path, capsys):
    base = tiny_model("bert-tiny")
    base.save(tmp_path / "base")
    model = apply_peft(copy.deepcopy(base), config("lora"))
    perturb(model, scale=0.2)
    model.save_adapter(tmp_path / "adapter")
    assert main(["peft", "export-hf", "--base", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter"),
                 "--out", str(tmp_path / "hf-adapter")]) == 0
    assert "LORA" in capsys.readouterr().out
    hf = _hf_peft(base, tmp_path / "hf-adapter", tmp_path)
    b = batch("bert-tiny")
    with torch.no_grad():
        torch.testing.assert_close(hf(**b).logits, model(**b).logits, atol=1e-4, rtol=0)
