"""Every config class shares one base: unknown keys, wrong kinds, load/save round trips; and the CLI's error policy."""

from __future__ import annotations

import argparse

import pytest

from lmforge.cli import main as cli_main
from lmforge.config import ConfigBase, ConfigError, ModelConfig
from lmforge.errors import InputFileNotFound, LmforgeError, UserInputError
from lmforge.generation.config import GenerationConfig
from lmforge.models.bilstm_lm import BiLMConfig
from lmforge.peft.config import PeftConfig
from lmforge.prompting.instruct import ChatTemplate
from lmforge.tasks.settings import finetune_settings, save_settings
from lmforge.tasks.spec import TaskSpec
from lmforge.training.config import TrainConfig
from lmforge.utils.flags import add_dataclass_flags, key_values

EXAMPLES = [
    (ModelConfig, ModelConfig.from_preset("gpt-tiny").to_dict()),
    (TrainConfig, {"max_steps": 10}),
    (TaskSpec, {"task": "classify"}),
    (BiLMConfig, {"vocab_size": 10}),
    (PeftConfig, {"method": "lora"}),
    (GenerationConfig, {"max_new_tokens": 3}),
    (ChatTemplate, {}),
]


@pytest.mark.parametrize("cls,data", EXAMPLES, ids=[c.__name__ for c, _ in EXAMPLES])
def test_one_base_gives_every_config_the_same_mechanics(cls, data, tmp_path):
    assert issubclass(cls, ConfigBase)
    with pytest.raises(ConfigError, match="f.yaml: unknown .*zzz_typo"):
        cls.from_dict({**data, "zzz_typo": 1}, source="f.yaml")
    with pytest.raises(ConfigError, match="f.yaml: expected a mapping"):
        cls.from_dict([1, 2], source="f.yaml")
    cfg = cls.from_dict(data)
    assert cls.from_dict(cfg.to_dict()) == cfg
    for name in ("c.yaml", "c.json"):
        ConfigBase.save(cfg, tmp_path / name)
        assert ConfigBase.load.__func__(cls, tmp_path / name) == cfg


def test_unknown_key_suggests_the_closest_or_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"did you mean 'd_model'\?"):
        ModelConfig.from_dict({"d_modle": 8})
    with pytest.raises(ConfigError, match=r"unknown ModelConfig field\(s\) aaa, bbb; known: arch, vocab_size, "):
        ModelConfig.from_dict({"aaa": 1, "bbb": 2})


def test_wrong_kinds_are_config_errors():
    with pytest.raises(ConfigError, match="ModelConfig.dropout='/tmp/x' must be float"):
        ModelConfig.from_preset("gpt-tiny", dropout="/tmp/x")
    with pytest.raises(ConfigError, match="lr='fast' must be a number"):
        TrainConfig.from_dict({"lr": "fast"})


def test_missing_config_file_is_a_user_error_and_a_file_not_found_error(tmp_path):
    with pytest.raises(InputFileNotFound) as caught:
        PeftConfig.load(tmp_path / "nope.yaml")
    assert isinstance(caught.value, FileNotFoundError) and isinstance(caught.value, LmforgeError)


def test_key_values_and_dataclass_flags():
    assert key_values(["a=1", "b=x", "c=[1, 2]"], "--override") == {"a": 1, "b": "x", "c": [1, 2]}
    with pytest.raises(UserInputError, match="expected KEY=VALUE"):
        key_values(["=1"], "--override")
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    add_dataclass_flags(parser, TrainConfig, [("lr", "peak LR"), ("progress", "hide the bar"), ("compile", "compile")])
    assert vars(parser.parse_args(["--lr", "0.1", "--no-progress"])) == {"lr": 0.1, "progress": False}
    assert "(default: 0.0003)" in parser.format_help()


def test_finetune_settings_resume_from_the_saved_file(tmp_path):
    first = finetune_settings({"model": "m", "task": "classify", "train": "t.tsv", "out": str(tmp_path), "lr": 0.1})
    save_settings(first)
    resumed = finetune_settings({"out": str(tmp_path), "resume": True, "max_steps": 7})
    assert resumed["trainer"]["lr"] == 0.1 and resumed["trainer"]["max_steps"] == 7 and resumed["model"] == "m"
    with pytest.raises(UserInputError, match="missing --task"):
        finetune_settings({"model": "m", "train": "t.tsv", "out": str(tmp_path / "other")})


def _cli_raising(monkeypatch, exc):
    def verb(args):
        raise exc

    parser = argparse.ArgumentParser(prog="lmforge")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("boom").set_defaults(func=verb)
    monkeypatch.setattr(cli_main, "build_parser", lambda verb=None: parser)


def test_cli_prints_user_errors_as_one_line_and_lets_bugs_raise(monkeypatch, capsys):
    _cli_raising(monkeypatch, UserInputError("--x: bad"))
    assert cli_main.main(["boom"]) == 2
    assert capsys.readouterr().err == "lmforge boom: error: --x: bad\n"
    _cli_raising(monkeypatch, KeyboardInterrupt())
    assert cli_main.main(["boom"]) == 130
    _cli_raising(monkeypatch, ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        cli_main.main(["boom"])
    _cli_raising(monkeypatch, FileNotFoundError("a bug too"))
    with pytest.raises(FileNotFoundError):
        cli_main.main(["boom"])
    assert issubclass(cli_main.UserError, LmforgeError)


def test_help_documents_the_exit_codes():
    text = cli_main.build_parser().format_help()
    assert "exit codes:" in text and "130" in text and "a bug in lmforge" in text


def test_cli_exit_code_3_when_the_machine_refuses(monkeypatch, capsys):
    import errno

    from lmforge.errors import EXIT_ENVIRONMENT, EnvironmentFault

    _cli_raising(monkeypatch, EnvironmentFault(errno.ENOSPC, "out/x.json: no space left on the device"))
    assert cli_main.main(["boom"]) == EXIT_ENVIRONMENT == 3
    assert capsys.readouterr().err == "lmforge boom: error: out/x.json: no space left on the device\n"
