"""``lmforge convert``: bad input is one line on stderr, exit code 2, no traceback, and DST is not created."""

from __future__ import annotations

import importlib

import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = importlib.import_module("transformers")

from lmforge.cli.main import main  # noqa: E402
from lmforge.config import ModelConfig  # noqa: E402
from lmforge.models import build_model  # noqa: E402

TINY_BERT = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=32)


class NotATensor:  # anything a weights_only unpickler must refuse
    pass


def _save(model, folder):
    torch.manual_seed(0)
    model.save_pretrained(folder)
    return folder


@pytest.fixture
def bert_folder(tmp_path):
    return _save(tf.BertModel(tf.BertConfig(**TINY_BERT)), tmp_path / "bert")


def _edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))
    return folder


def _edit_weights(folder, fn):
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return folder


def _t5_gated_contradiction(tmp_path):
    folder = _save(tf.T5Model(tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_heads=4)),
                   tmp_path / "t5")
    return _edit_config(folder, is_gated_act=True)


def _llama_rope_scaling(tmp_path):
    cfg = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4)
    folder = _save(tf.LlamaModel(cfg), tmp_path / "llama")
    return _edit_config(folder, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})


def _unsafe_bin(tmp_path, bert_folder):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text((bert_folder / "config.json").read_text())
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(64, 32), "x": NotATensor()},
               folder / "pytorch_model.bin")
    return folder


BAD = {
    "no-config": (lambda tmp, bert: tmp, r"no config\.json"),
    "not-a-folder": (lambda tmp, bert: tmp / "nowhere", r"not a folder"),
    "unknown-model-type": (lambda tmp, bert: _edit_config(bert, model_type="xlnet"),
                           r"model_type 'xlnet' is not supported \(supported: bart, bert, .*\)"),
    "relative-key-positions": (lambda tmp, bert: _edit_config(bert, position_embedding_type="relative_key"),
                               r"position_embedding_type 'relative_key' is not supported"),
    "unknown-activation": (lambda tmp, bert: _edit_config(bert, hidden_act="quick_gelu"),
                           r"hidden_act 'quick_gelu' is not supported"),
    "unsupported-architecture": (lambda tmp, bert: _edit_config(bert, architectures=["BertForTokenClassification"]),
                                 r"architecture 'BertForTokenClassification' is not supported for bert"),
    "shape-mismatch": (lambda tmp, bert: _edit_config(bert, intermediate_size=40),
                       r"tensor 'encoder\.layer\.0\.intermediate\.dense\.weight' has shape \(48, 32\), "
                       r"but .*config\.json implies \(40, 32\)"),
    "missing-tensor": (lambda tmp, bert: _edit_weights(bert, lambda t: t.pop("encoder.layer.0.output.dense.bias")),
                       r"tensor 'encoder\.layer\.0\.output\.dense\.bias' is missing"),
    "no-weights": (lambda tmp, bert: (bert / "model.safetensors").unlink() or bert, r"no weights found"),
    "t5-is-gated-act": (lambda tmp, bert: _t5_gated_contradiction(tmp),
                        r"is_gated_act=True contradicts feed_forward_proj 'relu'"),
    "llama-rope-scaling": (lambda tmp, bert: _llama_rope_scaling(tmp),
                           r"rope_parameters\.rope_type 'linear' is not supported"),
    "unsafe-pickle": (lambda tmp, bert: _unsafe_bin(tmp, bert),
                      r"cannot be read with torch\.load\(weights_only=True\)"),
}


@pytest.mark.parametrize("case", BAD)
def test_from_hf_bad_input_is_one_line_exit_2(case, tmp_path, bert_folder, capsys):
    make, pattern = BAD[case]
    src = make(tmp_path, bert_folder)
    capsys.readouterr()  # drop transformers' own progress output from building SRC
    dst = tmp_path / "out"
    assert main(["convert", "from-hf", str(src), str(dst)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("lmforge convert: error: ")
    assert re.search(pattern, err), err
    assert not dst.exists()


def test_existing_destination_needs_overwrite(bert_folder, tmp_path, capsys):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    assert main(["convert", "from-hf", str(bert_folder), str(dst)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (dst / "keep.txt").read_text() == "mine"
    # --overwrite replaces a model folder, never a folder of something else (issue 63: nothing it did not make).
    assert main(["convert", "from-hf", str(bert_folder), str(dst), "--overwrite"]) == 2
    assert "not empty and not a model folder (it holds keep.txt)" in capsys.readouterr().err
    assert sorted(p.name for p in dst.iterdir()) == ["keep.txt"]
    (dst / "keep.txt").unlink()
    assert main(["convert", "from-hf", str(bert_folder), str(dst), "--overwrite"]) == 0  # an empty folder: replaced
    assert main(["convert", "from-hf", str(bert_folder), str(dst), "--overwrite", "--dtype", "bfloat16"]) == 0
    assert (dst / "model.safetensors").is_file()  # a model folder: replaced
    assert "wrote" in capsys.readouterr().out


def test_unused_tensors_are_reported(tmp_path, capsys):
    src = _save(tf.BertForPreTraining(tf.BertConfig(**TINY_BERT)), tmp_path / "pretraining")
    capsys.readouterr()
    # Read as BertForMaskedLM, its NSP head has no place to go (read as itself, it keeps it: nsp_head).
    assert main(["convert", "from-hf", str(src), str(tmp_path / "out"), "--architecture", "BertForMaskedLM"]) == 0
    assert "not used: cls.seq_relationship.bias, cls.seq_relationship.weight" in capsys.readouterr().err


def test_to_hf_of_an_inexpressible_model_names_the_field(tmp_path, capsys):
    cfg = ModelConfig.from_preset("llama-tiny", d_model=32, n_heads=4, d_ff=64, n_layers=1, norm="layernorm")
    build_model(cfg).save(tmp_path / "lm")
    assert main(["convert", "to-hf", str(tmp_path / "lm"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "closest: llama cannot express norm='layernorm'" in err, err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("argv", [["convert"], ["convert", "from-hf"], ["convert", "to-hf"]])
def test_every_subcommand_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv + ["--help"])
    assert exit_info.value.code == 0
    assert "usage: lmforge convert" in capsys.readouterr().out
