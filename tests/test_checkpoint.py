"""Model folders: atomic save, bit-exact load, clear errors on damaged files."""

from __future__ import annotations

import json

import pytest
import torch

import lmforge
from lmforge.checkpoint import CheckpointError
from lmforge.models import Transformer
from tests.helpers import tiny_config


@pytest.mark.parametrize(
    "cfg",
    [
        tiny_config(arch="decoder", position="rope", n_kv_heads=2, tie_embeddings=False),
        tiny_config(arch="encoder", head="mlm", type_vocab_size=2, pooler=True, position="sinusoidal"),
        tiny_config(arch="encoder-decoder", position="t5-bias", share_embeddings=True),
        tiny_config(arch="encoder-decoder", position="alibi", share_embeddings=False),
    ],
    ids=["decoder-rope", "encoder-sinusoidal", "t5-shared", "seq2seq-unshared"],
)
def test_save_load_round_trips_bit_exactly(tmp_path, cfg):
    model = Transformer(cfg).eval()
    path = model.save(tmp_path / "m")
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    again = lmforge.load(path)
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(1, 97, (2, 6))
    kw = {"decoder_input_ids": ids} if cfg.arch == "encoder-decoder" else {}
    assert torch.equal(model(ids, **kw).logits, again(ids, **kw).logits)


def test_tied_weights_are_stored_once_and_stay_tied(tmp_path):
    from safetensors import safe_open

    model = Transformer(tiny_config(arch="decoder"))
    path = model.save(tmp_path / "m")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert not any("lm_head" in k for k in f.keys())
    assert lmforge.load(path).lm_head.weight is None  # the head reads the embedding


def test_truncated_weights_give_a_clear_error(tmp_path):
    path = Transformer(tiny_config()).save(tmp_path / "m")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        lmforge.load(path)


def test_shape_mismatch_names_the_tensor(tmp_path):
    path = Transformer(tiny_config()).save(tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["d_ff"] = 128
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"ffn\.up\.weight.*\(64, 32\).*\(128, 32\)"):
        lmforge.load(path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        lmforge.load(tmp_path)
    path = Transformer(tiny_config()).save(tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        lmforge.load(path)


def test_failed_save_leaves_previous_folder_intact(tmp_path):
    model = Transformer(tiny_config())
    path = model.save(tmp_path / "m")
    before = (path / "model.safetensors").read_bytes()

    class Boom:
        def save(self, folder):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        Transformer(tiny_config(d_ff=128)).save(path, tokenizer=Boom())
    assert (path / "model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary folder left behind


def test_load_never_unpickles(tmp_path):
    # A folder with only a pickle checkpoint is refused rather than loaded.
    path = Transformer(tiny_config()).save(tmp_path / "m")
    (path / "model.safetensors").unlink()
    torch.save({"x": torch.zeros(1)}, path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="missing weights file"):
        lmforge.load(path)
