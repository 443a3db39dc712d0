"""Adapter folders: only the adapter is written, with the base's identity; the wrong base fails clearly;
trainer checkpoints round-trip; ``lmforge peft info``."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from lmforge.cli.main import main
from lmforge.peft import AdapterMismatchError, apply_peft, load_adapter, load_peft_state_dict, peft_state_dict
from peft_helpers import batch, config, perturb, tiny_model


def _saved(tmp_path, method="lora", arch="gpt-tiny", **options):
    base = tiny_model(arch)
    fresh = copy.deepcopy(base)
    model = apply_peft(base, config(method, **options))
    perturb(model)
    return model, fresh, model.save_adapter(tmp_path / "adapter")


def test_folder_holds_only_the_adapter_and_the_base_identity(tmp_path):
    model, base, path = _saved(tmp_path)
    meta = json.loads((path / "adapter_config.json").read_text())
    assert meta["format"] == "lmforge-peft" and meta["peft"]["method"] == "lora" and meta["name"] == "default"
    assert meta["base"]["name"] == base.config.name and len(meta["base"]["weights_sha256"]) == 64
    assert meta["base"]["parameters"] == base.num_parameters()
    tensors = load_file(str(path / "adapter.safetensors"))
    assert set(tensors) == set(model.adapter_parameters("default"))
    assert all(k.endswith(("A.weight", "B.weight")) for k in tensors)
    assert sum(t.numel() for t in tensors.values()) == meta["parameters"] == model.parameter_report().trainable


def test_wrong_architecture_fails_naming_the_difference(tmp_path):
    _, _, path = _saved(tmp_path)
    with pytest.raises(AdapterMismatchError, match="architecture differs.*d_model=64 \\(this base: 96\\)"):
        load_adapter(tiny_model("gpt-tiny", d_model=96), path)


def test_wrong_weights_fail_unless_the_check_is_skipped(tmp_path):
    model, _, path = _saved(tmp_path)
    other = tiny_model("gpt-tiny", seed=5)  # same architecture, other weights
    with pytest.raises(AdapterMismatchError, match="weights differ .* check_base=False"):
        load_adapter(other, path)
    loaded = load_adapter(other, path, check_base=False)
    assert torch.equal(loaded.adapter_state_dict()["decoder.layers.0.attn.q.A.weight"],
                       model.adapter_state_dict()["decoder.layers.0.attn.q.A.weight"])


def test_prefix_is_saved_folded_and_reloads_bit_exact(tmp_path):
    model, base, path = _saved(tmp_path, "prefix", arch="t5-tiny")
    meta = json.loads((path / "adapter_config.json").read_text())
    assert meta["peft"]["prefix_projection"] is False
    assert set(load_file(str(path / "adapter.safetensors"))) == {"prefix.stacks.encoder.kv", "prefix.stacks.decoder.kv"}
    b = batch("t5-tiny")
    assert torch.equal(load_adapter(base, path)(**b).logits, model(**b).logits)
    assert model.peft_configs["default"].prefix_projection  # saving did not fold the live model


def test_keys_do_not_depend_on_other_adapters(tmp_path):
    # MAM wraps the whole FFN; an IA3 adapter added next sits inside it, but saves under its plain names.
    base = tiny_model("bert-tiny")
    fresh = copy.deepcopy(base)
    model = apply_peft(base, config("mam"), name="mam")
    model.add_adapter("ia3", config("ia3"))
    perturb(model, "ia3")
    path = model.save_adapter(tmp_path / "ia3")
    assert "encoder.layers.0.ffn.down.scale" in load_file(str(path / "adapter.safetensors"))
    b = batch("bert-tiny")
    assert torch.equal(load_adapter(fresh, path)(**b).logits, model(**b).logits)


def test_trainer_state_dict_round_trip_keeps_the_reparameterisation():
    model = apply_peft(tiny_model("gpt-tiny"), config("prefix"))
    perturb(model)
    state = peft_state_dict(model)
    assert any(".mlp." in k for k in state)  # resumable: the MLP, not its folded output
    other = apply_peft(tiny_model("gpt-tiny"), config("prefix"))
    load_peft_state_dict(other, state)
    ids = torch.randint(3, 128, (2, 5))
    assert torch.equal(other(ids).logits, model(ids).logits)
    with pytest.raises(ValueError, match="missing .*unexpected"):
        load_peft_state_dict(other, {"nope": torch.zeros(1), **{k: v for k, v in list(state.items())[1:]}})
    bad = {k: v[..., :1] if v.dim() else v for k, v in state.items()}
    with pytest.raises(ValueError, match="has shape"):
        load_peft_state_dict(other, bad)


def test_unreadable_folders_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an adapter folder"):
        load_adapter(tiny_model("gpt-tiny"), tmp_path)
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    with pytest.raises(ValueError, match="not an lmforge adapter config.*HF peft folder"):
        load_adapter(tiny_model("gpt-tiny"), tmp_path)


def test_cli_info(tmp_path, capsys):
    _, _, path = _saved(tmp_path, "ia3")
    assert main(["peft", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ia3" in out and "mergeable" in out and "yes" in out
    assert main(["peft", "info", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peft"]["method"] == "ia3"


def test_cli_wrong_base_is_one_line_exit_2(tmp_path, capsys):
    _, _, path = _saved(tmp_path)
    tiny_model("gpt-tiny", seed=7).save(tmp_path / "other")
    assert main(["peft", "merge", "--base", str(tmp_path / "other"), "--adapter", str(path),
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmforge peft: error:") and "weights differ" in err and "\n" not in err
