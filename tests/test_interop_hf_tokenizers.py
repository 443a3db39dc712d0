"""Tokenizers come along: GPT-2 byte-level BPE files through from-hf / to-hf give the same ids as HF."""

from __future__ import annotations

import importlib

import json
import os
import shutil

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = importlib.import_module("transformers")

from lmforge.checkpoint import load  # noqa: E402
from lmforge.interop.hf import convert_from_hf, convert_to_hf  # noqa: E402
from lmforge.tokenization import Tokenizer  # noqa: E402

TEXT = ("Hello  wörld! 🤗🎉👩‍👩‍👧 日本語のテキスト、中文字符  \n\n\tcafé naïve Ωμέγα — “quotes” "
        "한국어    trailing   spaces\r\n<|endoftext|> x   ")


@pytest.fixture
def gpt2_files(gpt2_dir):
    return gpt2_dir


def _reference(folder):
    return tf.GPT2TokenizerFast(vocab=str(folder / "encoder.json"), merges=str(folder / "vocab.bpe"))


def test_gpt2_bpe_ids_match_gpt2_tokenizer_fast(gpt2_files):
    ours = Tokenizer.load(gpt2_files)
    ids = ours.encode(TEXT)
    assert ids == _reference(gpt2_files)(TEXT)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=False) == TEXT  # byte-level BPE is lossless


@pytest.fixture
def hf_gpt2_folder(gpt2_files, tmp_path):
    """A tiny GPT-2 saved by transformers, with the real vocabulary as vocab.json + merges.txt."""
    torch.manual_seed(0)
    hf = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=50257, n_embd=32, n_layer=1, n_head=4, n_positions=64))
    folder = tmp_path / "hf-gpt2"
    hf.save_pretrained(folder)
    shutil.copy(gpt2_files / "encoder.json", folder / "vocab.json")
    shutil.copy(gpt2_files / "vocab.bpe", folder / "merges.txt")
    return folder


def test_from_hf_and_back_keep_gpt2_token_ids(gpt2_files, hf_gpt2_folder, tmp_path):
    expected = _reference(gpt2_files)(TEXT)["input_ids"]
    convert_from_hf(hf_gpt2_folder, tmp_path / "lm")
    assert Tokenizer.load(tmp_path / "lm").encode(TEXT) == expected
    cfg = load(tmp_path / "lm").config
    assert (cfg.bos_token_id, cfg.eos_token_id) == (50256, 50256)

    convert_to_hf(tmp_path / "lm", tmp_path / "hf")
    auto = tf.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert auto(TEXT)["input_ids"] == expected
    assert auto.eos_token == "<|endoftext|>"
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["model_max_length"] == 64
