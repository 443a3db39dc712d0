"""Input normalised the same way everywhere: BOM and CRLF, colliding config keys, ignored decoding flags and
lengths beyond the model's context."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import pytest
import torch

import lmforge
from lmforge.cli.main import main
from lmforge.config import ConfigError
from lmforge.data.prepare import prepare
from lmforge.data.sources import iter_documents
from lmforge.generation import GenerationConfig
from lmforge.tasks.data import read_table
from lmforge.tokenization import train_tokenizer
from lmforge.training.config import TrainConfig

DOCS = "the cat sat on the mat\nand the dog sat too\n\nsecond document here\n\nthird one, café ☃\n"


def _windows(text: str) -> bytes:
    """``text`` as a Windows editor saves it: a UTF-8 byte-order mark and CRLF line ends."""
    return b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tok")
    (root / "corpus.txt").write_text(DOCS * 30, encoding="utf-8")
    tok = train_tokenizer([root / "corpus.txt"], kind="byte-bpe", family="gpt", vocab_size=300, show_progress=False)
    return tok.save(root / "tok")


def _shards(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted((folder / "train").rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------- BOM and CRLF
@pytest.mark.parametrize("name", ["docs.txt", "docs.jsonl", "docs.tsv", "docs.csv.gz"])
def test_prepare_gives_the_same_shards_for_a_bom_crlf_file_as_for_its_unix_twin(tmp_path, tok_dir, name):
    docs = [d for d in DOCS.split("\n\n") if d.strip()]
    if name.startswith("docs.jsonl"):
        text = "".join('{"text": "%s"}\n' % d.replace("\n", "\\n") for d in docs)
    elif ".tsv" in name or ".csv" in name:
        text = "text\n" + "".join(d.replace("\n", " ").replace(",", "") + "\n" for d in docs)
    else:
        text = DOCS
    for kind, data in (("unix", text.encode("utf-8")), ("windows", _windows(text))):
        (tmp_path / kind).mkdir()
        path = tmp_path / kind / name
        path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        prepare([path], tok_dir, tmp_path / f"out-{kind}", val_fraction=0, progress=False)
    assert _shards(tmp_path / "out-unix") == _shards(tmp_path / "out-windows")
    assert _shards(tmp_path / "out-unix")


def test_lone_cr_line_ends_are_line_ends_and_a_cr_split_across_reads_is_one(tmp_path, monkeypatch):
    import lmforge.data.sources as sources

    monkeypatch.setattr(sources, "BLOCK", 3)  # cut every CRLF of the file across two reads somewhere
    (tmp_path / "mac.txt").write_bytes(b"\xef\xbb\xbfone\rtwo\r\rthree\r\n\r\nfour\r")
    (tmp_path / "mac.jsonl").write_bytes(b'{"text": "a"}\r{"text": "b"}\r\n')
    assert list(iter_documents([tmp_path / "mac.txt"])) == ["one\ntwo", "three", "four"]
    assert list(iter_documents([tmp_path / "mac.jsonl"])) == ["a", "b"]


def test_finetune_tables_share_the_normalisation(tmp_path):
    (tmp_path / "a.tsv").write_bytes(_windows("text\tlabel\ngood film\t1\n"))
    (tmp_path / "a.jsonl").write_bytes(_windows('{"text": "good film", "label": "1"}\n'))
    for name in ("a.tsv", "a.jsonl"):
        table = read_table(tmp_path / name)
        assert table.columns == ["text", "label"] and table.rows[0]["text"] == "good film"


def test_bad_utf8_in_a_task_table_is_a_one_line_error_naming_the_file(tmp_path):
    from lmforge.tasks.data import TaskDataError

    (tmp_path / "a.tsv").write_bytes(b"text\tlabel\ngood \xff film\t1\n")
    with pytest.raises(TaskDataError, match=r"a.tsv: not UTF-8 at byte 16 \(b'\\xff fi'\)"):
        read_table(tmp_path / "a.tsv")


# ------------------------------------------------------------------------------- colliding config keys
def test_a_setting_spelled_with_a_dash_and_an_underscore_is_refused_naming_both(tmp_path):
    with pytest.raises(ConfigError, match=r"run.yaml: 'max-steps' and 'max_steps' are the same setting"):
        TrainConfig.from_dict({"max-steps": 5, "max_steps": 7}, source="run.yaml")
    assert TrainConfig.from_dict({"max-steps": 5}).max_steps == 5


def test_pretrain_refuses_a_config_file_with_colliding_keys(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("model: gpt-tiny\nmax_steps: 5\nmax-steps: 7\n", encoding="utf-8")
    assert main(["pretrain", "--config", str(config), "--data", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{config}: 'max_steps' and 'max-steps' are the same setting" in err
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------- decoding flags left unused
@pytest.mark.parametrize("settings, flag, strategy", [
    ({"temperature": 0.7}, "--temperature", "greedy"),
    ({"top_p": 0.9}, "--top-p", "greedy"),
    ({"top_k": 5, "num_beams": 3}, "--top-k", "beam"),
    ({"strategy": "sample", "length_penalty": 2.0}, "--length-penalty", "sample"),
    ({"early_stopping": True}, "--early-stopping", "greedy"),
])
def test_a_setting_the_strategy_ignores_warns_naming_it(settings, flag, strategy):
    with pytest.warns(UserWarning, match=rf"{flag} \S+ \(GenerationConfig\.\w+\) is ignored by {strategy} decoding"):
        GenerationConfig(**settings)


def test_settings_the_strategy_reads_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GenerationConfig(strategy="sample", temperature=0.7, top_p=0.9, top_k=5, min_p=0.1)
        GenerationConfig(num_beams=3, length_penalty=2.0, early_stopping="never")
        GenerationConfig(top_k=0, min_p=0.0, temperature=1.0)


@pytest.fixture(scope="module")
def gpt_folder(tmp_path_factory, tok_dir) -> Path:
    from lmforge.tokenization import Tokenizer

    tok = Tokenizer.load(tok_dir)
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", vocab_size=len(tok), d_model=32, n_heads=4, d_ff=64, n_layers=1,
                                max_seq_len=32, **{k: v for k, v in tok.special_token_ids().items()
                                                   if k.endswith("_token_id")})
    return lmforge.save(model, tmp_path_factory.mktemp("gpt") / "model", tokenizer=tok)


def test_generate_warns_once_in_one_line_about_a_temperature_greedy_ignores(gpt_folder, capsys):
    assert main(["generate", "--model", str(gpt_folder), "--prompt", "the cat", "--max-new-tokens", "3",
                 "--temperature", "0.7", "--no-stream"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "warning" in line]
    assert lines == ["lmforge generate: warning: --temperature 0.7 (GenerationConfig.temperature) is ignored by "
                     "greedy decoding; it applies to sample decoding only (--strategy sample)"]


# ------------------------------------------------------------------- --max-length past the model's context
def test_embed_cuts_a_max_length_past_the_position_table_with_a_warning(tmp_path, gpt_folder, capsys):
    (tmp_path / "in.txt").write_text(" ".join(["the cat sat"] * 60) + "\nshort\n", encoding="utf-8")
    assert main(["embed", "--model", str(gpt_folder), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "v.npy"), "--max-length", "100000", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "lmforge embed: warning: --max-length 100000 is more than the model reads: inputs are cut to its " \
           "context of 32 tokens" in err
    assert (tmp_path / "v.npy").is_file()


def _task(tok_dir, **spec):
    from lmforge.config import ModelConfig
    from lmforge.tasks import build_task
    from lmforge.tasks.spec import TaskSpec
    from lmforge.tokenization import Tokenizer

    tok = Tokenizer.load(tok_dir)
    cfg = ModelConfig(arch="decoder", vocab_size=len(tok), d_model=32, n_heads=2, d_ff=64, n_layers=1,
                      max_seq_len=16, **{k: v for k, v in tok.special_token_ids().items() if k.endswith("_token_id")})
    return build_task(TaskSpec(**spec), tok, cfg)


def test_finetune_says_when_max_length_is_capped_and_that_raising_it_cannot_help(tmp_path, tok_dir, capsys):
    (tmp_path / "long.tsv").write_text("text\tlabel\n" + " ".join(["the cat sat"] * 20) + "\t1\nshort\t0\n",
                                       encoding="utf-8")
    task = _task(tok_dir, task="classify", labels=["0", "1"], max_length=100000)
    task.encode(read_table(tmp_path / "long.tsv"))
    err = capsys.readouterr().err
    assert "--max-length 100000 is more than the model reads: inputs are cut to its context of 16 tokens" in err
    assert "raise --max-length" not in err
    assert "long.tsv: 1 of 2 rows are longer than 16 tokens and were truncated (first: row 1 (line 2)); the model " \
           "reads at most 16 tokens (its max_seq_len), so a larger --max-length cannot keep more" in err


# --------------------------------------------------------------------------------------- config files
def test_config_files_share_the_normalisation_and_bad_utf8_names_the_file(tmp_path):
    from lmforge.errors import UserInputError
    from lmforge.utils.io import read_mapping_file

    (tmp_path / "a.json").write_bytes(_windows('{"max_steps": 5,\n "lr": 0.1}\n'))
    assert read_mapping_file(tmp_path / "a.json") == {"max_steps": 5, "lr": 0.1}
    (tmp_path / "b.yaml").write_bytes(b"max_steps: 5\nname: caf\xe9\n")
    with pytest.raises(UserInputError, match=r"b.yaml: not UTF-8 at byte 22"):
        read_mapping_file(tmp_path / "b.yaml")
    (tmp_path / "c.yaml").write_text("max_steps: 5\nwhen: 2024-13-45\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"c.yaml: not valid YAML"):
        read_mapping_file(tmp_path / "c.yaml")


@pytest.mark.parametrize("data", [{"label_map": None}, {"label_map": ["a"]}, {"labels": "pos,neg"},
                                  {"mixture": {"name": "x"}}, {"max_length": "long"}])
def test_a_task_spec_of_the_wrong_shape_is_a_config_error(data):
    from lmforge.tasks.spec import TaskSpec

    with pytest.raises(ConfigError, match=f"TaskSpec.{next(iter(data))}="):
        TaskSpec.from_dict(data)


def test_prompt_and_line_files_are_normalised_like_every_other_input(tmp_path):
    from lmforge.utils.io import read_text_file

    windows = tmp_path / "prompt.txt"
    windows.write_bytes("\ufeffIt is a truth\r\nuniversally acknowledged\r".encode())
    assert read_text_file(windows, "--prompt-file") == "It is a truth\nuniversally acknowledged\n"


def test_every_command_that_loads_a_model_folder_offers_no_verify():
    import argparse

    from lmforge.cli.main import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("pretrain", "finetune", "generate", "evaluate", "predict", "embed"):
        assert "--no-verify" in commands[name]._option_string_actions, name
