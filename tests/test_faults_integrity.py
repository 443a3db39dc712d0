"""Damaged or mismatched inputs on load: model/task/adapter folders checked against their manifest, shards
against their sha256 and the vocabulary, non-finite weights, a tokenizer other than the folder's, and
``peft merge`` of a task's LoRA adapter."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import lmforge
from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.data import PackedDataset, ShardSet
from lmforge.data.prepare import prepare
from lmforge.errors import IntegrityError, UserInputError
from lmforge.peft import PeftConfig, apply_peft, load_adapter
from lmforge.tasks.model import build_task_model, load_task_model, save_task_model
from lmforge.tasks.spec import TaskSpec
from lmforge.tokenization import train_tokenizer
from tests import task_helpers as th

COMMON = ["--no-progress", "--no-tensorboard", "--precision", "fp32"]


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    """Two tokenizers of other kinds with the same vocabulary size (bert: WordPiece; bpe)."""
    folder = tmp_path_factory.mktemp("toks")
    wordpiece, bpe = (train_tokenizer([th.corpus(folder)], kind=kind, vocab_size=150, family="bert", min_frequency=1,
                                      show_progress=False) for kind in ("wordpiece", "bpe"))
    assert bpe.vocab_size == wordpiece.vocab_size and bpe.kind != wordpiece.kind
    return wordpiece, bpe


@pytest.fixture
def folder(toks, tmp_path):
    """A small BERT model folder saved with its tokenizer."""
    return checkpoint.save(th.body("bert", toks[0]), tmp_path / "m", tokenizer=toks[0])


@pytest.fixture(scope="module")
def gpt_folder(tmp_path_factory):
    """A small GPT model folder saved with its tokenizer (one that can generate)."""
    folder = tmp_path_factory.mktemp("gpt")
    tok = th.tokenizer(folder, "gpt")
    return checkpoint.save(th.body("gpt", tok, n_layers=1), folder / "m", tokenizer=tok)


def _flip(path: Path, offset: int = -1) -> None:
    """Flip the lowest bit of one byte (default: the last, inside the tensor data of a safetensors file)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------------- model folders
def test_saved_folder_has_a_manifest_of_every_file_and_its_tokenizer(folder, toks):
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors", "tokenizer.json", "lmforge_tokenizer.json"}
    assert manifest["files"]["model.safetensors"]["bytes"] == (folder / "model.safetensors").stat().st_size
    assert manifest["tokenizer"]["sha256"] == toks[0].sha256() and manifest["tokenizer"]["kind"] == toks[0].kind


def test_bit_flip_in_weights_is_refused_naming_the_file(folder):
    _flip(folder / "model.safetensors")
    with pytest.raises(IntegrityError, match=r"model\.safetensors: sha256 differs .*--no-verify"):
        lmforge.load(folder)
    with pytest.raises(IntegrityError, match="model.safetensors"):
        checkpoint.load_body(folder)
    assert lmforge.load(folder, verify=False).config.vocab_size > 0  # the library keyword skips it
    with checkpoint.load_checks(verify=False):
        checkpoint.read_model_folder(folder)


def test_truncated_file_is_refused_with_both_sizes(folder):
    tok_file = folder / "tokenizer.json"
    size = tok_file.stat().st_size
    tok_file.write_bytes(tok_file.read_bytes()[: size // 2])
    with pytest.raises(IntegrityError, match=rf"tokenizer\.json: {size // 2} bytes, the manifest says {size}"):
        checkpoint.read_model_folder(folder)


def test_folder_without_manifest_loads_with_a_notice(folder):
    expected = lmforge.load(folder).state_dict()
    (folder / "manifest.json").unlink()
    with pytest.warns(UserWarning, match=r"no manifest\.json \(saved by an older lmforge\)"):
        model = lmforge.load(folder)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lmforge.load(folder, verify=False)  # --no-verify: no check, so no notice either


def test_cli_refuses_a_damaged_folder_unless_no_verify(gpt_folder, tmp_path, capsys):
    folder = checkpoint.save(lmforge.load(gpt_folder), tmp_path / "m", tokenizer=gpt_folder / "tokenizer.json")
    _flip(folder / "model.safetensors")
    argv = ["generate", "--model", str(folder), "--prompt", "a", "--max-new-tokens", "2", "--no-stream"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.safetensors: sha256 differs from the manifest" in err
    assert main([*argv, "--no-verify"]) == 0


def test_nan_weights_are_refused_naming_the_tensor_even_without_verification(toks, tmp_path):
    model = th.body("bert", toks[0])
    name = next(n for n, p in model.named_parameters() if p.ndim == 2 and ".1." in n)
    with torch.no_grad():
        model.get_parameter(name)[0, 0] = float("nan")
    path = checkpoint.save(model, tmp_path / "nan")
    for verify in (True, False):
        with pytest.raises(IntegrityError, match=rf"tensor '{name}' holds NaN or infinite .*"
                                                 r"always refused, even with --no-verify"):
            lmforge.load(path, verify=verify)


def test_int8_weights_outside_the_symmetric_range_are_refused_naming_the_tensor(gpt_folder, tmp_path):
    from lmforge.models.quantize import quantize_model, save_quantized
    from safetensors.torch import load_file, save_file

    model = lmforge.load(gpt_folder)
    quantize_model(model, "int8")
    path = save_quantized(model, tmp_path / "int8")
    tensors = load_file(path / "model.safetensors")
    name = next(n for n, t in tensors.items() if t.dtype == torch.int8)
    tensors[name][0, 0] = -128
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(IntegrityError, match=rf"tensor '{name}' holds -128, outside the \[-127, 127\]"):
        lmforge.load(path, verify=False)


def test_task_folder_head_is_covered_by_the_manifest(toks, tmp_path):
    spec = TaskSpec(task="classify", labels=["n", "p"])
    path = save_task_model(build_task_model(th.body("bert", toks[0]), spec), tmp_path / "task", toks[0])
    assert {"task.json", "task_head.safetensors"} <= set(json.loads((path / "manifest.json").read_text())["files"])
    load_task_model(path)
    _flip(path / "task_head.safetensors")
    with pytest.raises(IntegrityError, match=r"task_head\.safetensors: sha256 differs"):
        load_task_model(path)


def test_adapter_folder_is_verified(toks, tmp_path):
    base = th.body("bert", toks[0]).eval()
    path = apply_peft(base, PeftConfig(method="lora", r=2)).save_adapter(tmp_path / "lora")
    _flip(path / "adapter.safetensors")
    with pytest.raises(IntegrityError, match=r"adapter\.safetensors: sha256 differs"):
        load_adapter(th.body("bert", toks[0]), path, check_base=False)


# ------------------------------------------------------------------------------------------- shards
@pytest.fixture
def shards(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Document {i} is short.\n\n" for i in range(200)), encoding="utf-8")
    tok = train_tokenizer([corpus], vocab_size=300, family="gpt", show_progress=False)
    data = tmp_path / "data"
    prepare([corpus], tok, data, progress=False)
    manifest = json.loads((data / "manifest.json").read_text())
    return data, manifest["chunks"][0]["train"], manifest["tokenizer"]["vocab_size"]


def test_bit_flip_in_a_shard_is_refused_naming_it(shards):
    data, shard, _ = shards
    _flip(data / shard["bin"], offset=len((data / shard["bin"]).read_bytes()) // 2)
    with pytest.raises(IntegrityError, match=rf"{shard['bin']}: sha256 differs from .*manifest\.json"):
        next(iter(PackedDataset(data, seq_len=16, batch_size=4)))


def test_token_ids_outside_the_vocabulary_are_refused_naming_shard_and_position(shards):
    data, shard, vocab = shards
    tokens = np.memmap(data / shard["bin"], dtype=np.uint16, mode="r+")
    tokens[7] = vocab + 3
    tokens.flush()
    with pytest.raises(IntegrityError, match=rf"{shard['bin']}: token id {vocab + 3} at position 7 is outside "
                                             rf"the tokenizer's vocabulary of {vocab}"):
        ShardSet(data, verify=False).arrays(0)  # the hash would catch it first; the range check stands alone


# ------------------------------------------------------------------------------------------- tokenizer identity
def test_other_tokenizer_with_the_same_vocab_size_is_refused_naming_both(folder, toks, tmp_path):
    _, bpe = toks
    with pytest.raises(UserInputError, match=r"trained with another tokenizer \(wordpiece bert, \d+ ids.*\) than "
                                             r"the given tokenizer \(bpe bert"):
        checkpoint.load_body(folder, tokenizer=bpe)
    body, tok = checkpoint.load_body(folder, tokenizer=bpe, allow_tokenizer_mismatch=True)
    assert tok is bpe
    checkpoint.load_body(folder, tokenizer=toks[0])  # its own tokenizer, given explicitly: fine


def test_cli_finetune_refuses_another_tokenizer_unless_allowed(folder, toks, tmp_path, capsys):
    other = toks[1].save(tmp_path / "bpe")
    train = th.write_sentiment(tmp_path / "train.tsv", 16)
    argv = ["finetune", "--model", str(folder), "--tokenizer", str(other), "--task", "classify", "--train",
            str(train), "--max-steps", "1", "--batch-size", "8", *COMMON]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"than {other}" in err and "--allow-tokenizer-mismatch" in err
    assert main([*argv, "--out", str(tmp_path / "b"), "--allow-tokenizer-mismatch"]) == 0


def test_cli_prompt_refuses_another_tokenizer_unless_allowed(folder, toks, tmp_path, capsys):
    other = toks[1].save(tmp_path / "bpe")
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": l}) + "\n" for t, l in th.sentiment_rows(4)))
    argv = ["prompt", "classify", "--model", str(folder), "--tokenizer", str(other), "--template", "{x} It was {z}.",
            "--verbalizer", '{"0": ["bad"], "1": ["great"]}', "--data", str(data)]
    assert main(argv) == 2
    assert f"than {other}" in capsys.readouterr().err
    assert main([*argv, "--allow-tokenizer-mismatch"]) == 0


# ------------------------------------------------------------------------------------------- peft merge
@pytest.mark.parametrize("check_base", [True, False])
def test_peft_merge_of_a_classification_lora_adapter_onto_its_base(folder, tmp_path, capsys, check_base):
    dev = th.write_sentiment(tmp_path / "dev.tsv", 8, seed=1)
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(folder), "--task", "classify", "--train", str(dev), "--max-steps", "2",
                 "--batch-size", "8", "--lr", "3e-2", "--peft", "lora", "--peft-option", "r=4", "--out", str(out),
                 *COMMON]) == 0
    merged = tmp_path / "merged"
    flags = [] if check_base else ["--no-check-base"]
    assert main(["peft", "merge", "--base", str(folder), "--adapter", str(out / "model"), "--out", str(merged),
                 *flags]) == 0, capsys.readouterr().err
    ids = torch.randint(5, 100, (2, 9))
    with torch.no_grad():
        want = load_task_model(out / "model")(ids).logits
        got = load_task_model(merged)(ids).logits
    assert not json.loads((merged / "task.json").read_text()).get("peft")  # a plain task folder
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
