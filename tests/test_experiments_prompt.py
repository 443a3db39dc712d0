"""Prompt grids: each cell x seed is one `prompt generate` at the cell's k with the seed's demonstrations, and its
row holds exactly the score that command reports; a prompt grid that asks for training or a score its task does not
give is one line."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from experiment_helpers import rows, run_cli, write_grid

from lmforge import checkpoint
from lmforge.cli.main import main
from tests import task_helpers as th

SETTINGS = {"task": "arithmetic", "limit": 3, "max_new_tokens": 8, "shots": 2}
AXIS = {"name": "prompting", "variants": [{"name": "standard", "cot": False}, {"name": "cot", "cot": True}]}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt")
    tok = th.tokenizer(folder, "gpt")
    torch.manual_seed(0)
    return checkpoint.save(th.body("gpt", tok, max_seq_len=64).eval(), folder / "model", tokenizer=tok)


def grid_text(model, **change) -> str:
    grid = {"command": "prompt", "settings": {"model": str(model), **SETTINGS}, "axes": [AXIS], "seeds": [0, 1],
            "metrics": ["prompt_exact_match"], **change}
    return yaml.safe_dump(grid, sort_keys=False)


def test_a_prompt_grid_s_rows_are_the_prompt_command_s_own_scores(model, tmp_path, capsys):
    grid = write_grid(tmp_path, grid_text(model))
    out = tmp_path / "out"
    assert run_cli(grid, "--out", out, "--threads", "1") == 0
    results = rows(out)
    assert [(r["cell"], r["seed"], r["status"]) for r in results] == [
        ("prompting=standard", 0, "ok"), ("prompting=standard", 1, "ok"), ("prompting=cot", 0, "ok"),
        ("prompting=cot", 1, "ok")]
    assert results[2]["settings"]["prompt"] == {"model": str(model), **SETTINGS, "cot": True}
    assert results[0]["steps"] is None and results[0]["flops"] is None
    capsys.readouterr()
    for cot, mine in ((False, results[:2]), (True, results[2:])):
        argv = ["prompt", "generate", "--model", str(model), "--task", "arithmetic", "--shots", "2", "--limit", "3",
                "--max-new-tokens", "8", *(["--cot"] if cot else [])]
        for row in mine:
            assert main([*argv, "--seeds", str(row["seed"])]) == 0
            printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
            assert row["metrics"] == {"prompt_exact_match": printed[str(model)]["2"]}
            saved = json.loads((out / row["run"] / "prompt" / "results.json").read_text())
            assert saved["cot"] is cot and saved["seeds"] == [row["seed"]] and saved["shots"] == [2]
            assert [len(r["outputs"]) for r in saved["models"][str(model)]["runs"]] == [3]
    assert "| prompting=cot | cot | 2/2 |" in (out / "table.md").read_text()


BAD = {
    "a budget": ({"budget": {"steps": 10}}, "budget: a prompt grid trains nothing; remove it"),
    "a score the task does not give": ({"metrics": ["prompt_bleu"]},
                                       "cell prompting=standard: metrics: prompt_bleu, but the cell scores its "
                                       "answers by exact_match"),
    "a training metric": ({"metrics": ["eval_loss"]}, "metrics: unknown metric 'eval_loss' for a prompt grid"),
    "several k in one cell": ({"settings": {"model": "m", **SETTINGS, "shots": [1, 2]}},
                              "cell prompting=standard: shots=[1, 2]: give one k >= 0 per cell"),
    "seeds as a setting": ({"settings": {"model": "m", **SETTINGS, "seeds": [0]}},
                           "cell prompting=standard: seeds: set by the runner"),
    "an unknown setting": ({"settings": {"model": "m", **SETTINGS, "shot": 2}}, "unknown prompt setting(s) 'shot'"),
    "cot on a task without rationales": ({"settings": {"model": "m", **SETTINGS, "task": "kjv-rv1909"},
                                          "metrics": ["prompt_bleu"]},
                                         "cell prompting=cot: --cot: the pool kjv-rv1909:train has no 'rationale'"),
    "a limit of no queries": ({"settings": {"model": "m", **SETTINGS, "limit": 0}},
                              "cell prompting=standard: limit=0 must be an integer >= 1"),
    "more shots than the pool": ({"settings": {"model": "m", **SETTINGS, "shots": 5000}},
                                 "shots=5000 is more than the 1000 demonstrations in the pool"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_prompt_grid_is_one_line(case, tmp_path, capsys):
    change, expected = BAD[case]
    grid = write_grid(tmp_path, grid_text("m", **change))
    assert run_cli(grid, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"lmforge experiment: error: {grid}: "), err
    assert expected in err, err
    assert not (tmp_path / "out").exists()
