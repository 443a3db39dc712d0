"""PeftConfig: plain data that round-trips, validated with messages that name the field."""

from __future__ import annotations

import pytest

from lmforge.config import ConfigError
from lmforge.peft import METHODS, PeftConfig, apply_peft
from peft_helpers import config, tiny_model


@pytest.mark.parametrize("method", METHODS)
def test_round_trip_through_dict_json_and_yaml(method, tmp_path):
    cfg = PeftConfig(method=method)
    assert PeftConfig.from_dict(cfg.to_dict()) == cfg
    import json

    import yaml

    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    assert PeftConfig.load(tmp_path / "c.json") == cfg == PeftConfig.load(tmp_path / "c.yaml")


@pytest.mark.parametrize("fields,message", [
    (dict(method="lorra"), "method='lorra' is not one of lora, qlora"),
    (dict(method="ia3", r=4), "r=4 is not used by method 'ia3'"),
    (dict(method="prefix", targets=["q"]), "targets=\\['q'\\] is not used by method 'prefix'"),
    (dict(method="lora", r=0), "r=0 must be a positive integer"),
    (dict(method="lora", alpha=-1.0), "alpha=-1.0 must be a positive number"),
    (dict(method="lora", dropout=1.0), "dropout=1.0 must be in \\[0, 1\\)"),
    (dict(method="lora", targets=[]), "targets=\\[\\] must be a non-empty list"),
    (dict(method="adapter", adapter_activation="swish"), "adapter_activation='swish' is not one of"),
    (dict(method="prompt", prompt_init="text"), "prompt_init_text is needed exactly when prompt_init='text'"),
    (dict(method="qlora", nf4_block_size=63), "nf4_block_size=63 must be even"),
])
def test_bad_values_name_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        PeftConfig(**fields)


def test_unknown_keys_are_named():
    with pytest.raises(ConfigError, match="run.yaml: unknown PeftConfig field\\(s\\) rank"):
        PeftConfig.from_dict({"method": "lora", "rank": 4}, source="run.yaml")


def test_options_lists_what_differs_from_the_defaults():
    assert PeftConfig(method="lora", r=4, rslora=True).options() == {"method": "lora", "r": 4, "rslora": True}
    assert PeftConfig(method="lora").scaling == 2.0 and PeftConfig(method="lora", rslora=True, r=4).scaling == 8.0


def test_attaching_errors_are_clear():
    model = apply_peft(tiny_model("gpt-tiny"), config("lora"), name="a")
    with pytest.raises(ConfigError, match="already attached"):
        model.add_adapter("a", config("ia3"))
    with pytest.raises(ConfigError, match="QLoRA quantises the base model, so it must be the first adapter"):
        model.add_adapter("q", config("qlora"))
    with pytest.raises(ConfigError, match="adapter name 'a b'"):
        model.add_adapter("a b", config("ia3"))
    with pytest.raises(KeyError, match="no adapter named 'zz' \\(attached: a\\)"):
        model.set_adapter("zz")
    with pytest.raises(AttributeError, match="save_adapter"):
        model.save("x")
    assert model.config is model.base_model.config  # the rest is delegated to the base model
