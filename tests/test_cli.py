"""Every command and subcommand answers --help; user errors are one line with exit code 2."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from lmforge.cli.main import build_parser, main


def _all_command_paths(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from _all_command_paths(sub, prefix + (name,))


COMMANDS = list(_all_command_paths(build_parser()))


def test_there_are_commands():
    assert ("model", "info") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help(path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*path, "--help"])
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_model_info_json_last_line_has_parameters(capsys):
    assert main(["model", "info", "bert-base", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last)["parameters"] == 109_514_298


def test_unknown_preset_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "lmforge.cli.main", "model", "info", "nope"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown preset 'nope'" in proc.stderr


def test_every_command_loads_without_the_optional_extras():
    """A command module that imports an optional extra at module level (serve's FastAPI/pydantic, Ray, ...) would
    break that command, --help included, for a user without it (every verb's --help: tests/test_cli_lazy.py)."""
    blocked = ["pydantic", "fastapi", "uvicorn", "prometheus_client", "ray", "torchao", "codecarbon", "scipy",
               "sklearn", "seqeval", "sacrebleu", "rouge_score", "transformers", "peft", "sentence_transformers"]
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"
            "from lmforge.cli.main import main\n"
            "raise SystemExit(main(['serve', '--model', 'nothing']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "needs the serve extra" in proc.stderr and "Traceback" not in proc.stderr
