"""TrainConfig: plain data that round-trips through YAML, with errors that name the key and its source."""

from __future__ import annotations

import pytest

from lmforge.config import ConfigError
from lmforge.training.config import TrainConfig, read_settings, setting_names


def test_round_trip_through_yaml(tmp_path):
    cfg = TrainConfig(model="gpt-tiny", objective="clm", overrides={"n_layers": 2}, betas=[0.9, 0.95], warmup=5)
    cfg.save(tmp_path / "c.yaml")
    assert TrainConfig.load(tmp_path / "c.yaml") == cfg
    assert list(TrainConfig().to_dict()) == setting_names()


def test_values_are_coerced_where_unambiguous():
    cfg = TrainConfig.from_dict({"max-steps": 10, "lr": "3e-4", "weight_decay": 0, "betas": [0.9, "0.95"]}, "f.yaml")
    assert (cfg.max_steps, cfg.lr, cfg.weight_decay, cfg.betas) == (10, 3e-4, 0.0, [0.9, 0.95])
    assert isinstance(cfg.weight_decay, float)


@pytest.mark.parametrize("data, message", [
    ({"lerning_rate": 1}, "f.yaml: unknown setting 'lerning_rate'"),
    ({"eval_evry": 1}, "did you mean 'eval_every'?"),
    ({"max_steps": True}, "f.yaml: max_steps=True must be an integer"),
    ({"max_steps": 0}, "f.yaml: max_steps=0 must be >= 1"),
    ({"compile": "yes"}, "f.yaml: compile='yes' must be true or false"),
    ({"precision": "fp16"}, "f.yaml: precision='fp16' is not one of auto, bf16, fp32"),
    ({"objective": "nsp"}, "f.yaml: objective='nsp' is not one of mlm, clm"),
    ({"overrides": [1, 2]}, "f.yaml: overrides=[1, 2] must be a mapping"),
    ({"no_decay": ["bias", "layernorm"]}, "lists unknown kind(s) layernorm"),
    ({"min_lr_ratio": 2}, "min_lr_ratio=2.0 must be in [0, 1]"),
    ({"warmup": 10, "max_steps": 10}, "warmup=10 must be < max_steps=10"),
    ({"warmup": 10, "schedule": "slanted-triangular"}, "warmup=10 does not apply to slanted-triangular"),
    ({"seq_len": 1}, "seq_len=1 must be >= 2"),
])
def test_bad_values_name_key_and_source(data, message):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict(data, source="f.yaml")
    assert message in str(info.value)


def test_updates_merge_mappings_and_require_names_the_flag():
    base = TrainConfig.from_dict({"overrides": {"n_layers": 2, "d_model": 64}})
    cfg = base.updated({"overrides": {"d_model": 32}}, source="command line")
    assert cfg.overrides == {"n_layers": 2, "d_model": 32} and base.overrides["d_model"] == 64
    with pytest.raises(ConfigError, match="missing required setting 'data': pass --data or set `data:` in run.yaml"):
        cfg.require("data", source="run.yaml")


def test_settings_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1,\n")
    with pytest.raises(ConfigError, match=f"{bad}: not valid YAML"):
        read_settings(bad)
    (tmp_path / "empty.yaml").write_text("")
    assert read_settings(tmp_path / "empty.yaml") == {}
    with pytest.raises(FileNotFoundError, match="no such config file"):
        read_settings(tmp_path / "missing.yaml")
