"""ModelConfig validation and serialisation."""

from __future__ import annotations

import pytest

from lmforge.config import ConfigError, ModelConfig


def test_json_and_yaml_round_trip(tmp_path):
    cfg = ModelConfig.from_preset("t5-tiny")
    for name in ("c.json", "c.yaml"):
        cfg.save(tmp_path / name)
        assert ModelConfig.load(tmp_path / name) == cfg


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"arch": "rnn"}, "arch"),
        ({"position": "absolute"}, "position"),
        ({"d_model": 100, "n_heads": 3}, "d_model"),
        ({"n_kv_heads": 4, "n_heads": 6}, "n_kv_heads"),
        ({"dropout": 1.5}, "dropout"),
        ({"activation": "tanh"}, "activation"),
        ({"head": "mlm", "arch": "decoder"}, "head"),
        ({"pad_token_id": 10**6}, "pad_token_id"),
        ({"vocab_size": 0}, "vocab_size"),
        # wrong kinds are named before any range check can fail on them
        ({"dropout": "/tmp/run"}, r"dropout='/tmp/run' must be float"),
        ({"d_model": 384.0}, r"d_model=384.0 must be int"),
        ({"bias": "yes"}, r"bias='yes' must be bool"),
        ({"n_kv_heads": "2"}, r"n_kv_heads='2' must be int or null"),
        ({"tie_embeddings": 1}, "tie_embeddings"),
    ],
)
def test_bad_fields_are_named(change, needle):
    with pytest.raises(ConfigError, match=needle):
        ModelConfig(**change)


def test_unknown_field_in_file_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("arch: decoder\nd_modle: 64\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*d_modle"):
        ModelConfig.load(path)


def test_unknown_preset_lists_the_available_ones():
    with pytest.raises(ConfigError, match="gpt-tiny"):
        ModelConfig.from_preset("gpt-huge")
