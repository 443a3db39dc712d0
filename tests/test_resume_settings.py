"""Resume is exact or refused: `--resume` with a setting that changes the trajectory is refused in one line
naming each flag, and the run folder stays byte for byte as it was; an allowed change (a larger --max-steps)
continues the run and is appended to OUT/history.jsonl."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from lmforge.cli.main import main
from test_finetune_peft_cli import COMMON, cli_run, toks  # noqa: F401  (fixtures)
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401  (fixtures)


def snapshot(out: Path) -> dict[str, str]:
    """Every path under ``out`` -> the SHA-256 of its bytes ('dir' for folders)."""
    return {str(p.relative_to(out)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*"))}


def steps(out: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def history(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


def refused(argv: list[str], out: Path, capsys) -> str:
    """Run ``argv``; assert exit 2, one line on stderr and ``out`` unchanged; return that line."""
    before = snapshot(out)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert snapshot(out) == before
    return err


# ------------------------------------------------------------------------------------------- finetune
@pytest.fixture
def finetuned(cli_run, tmp_path):
    """A finished 2-step full fine-tuning run at lr 0.03 (batch 8, linear schedule, seed 0)."""
    *_, flags = cli_run
    out = tmp_path / "run"
    assert main(["finetune", *flags, "--out", str(out), "--max-steps", "2"]) == 0
    return out


FINETUNE_CHANGES = [
    (["--lr", "1e-4"], "--lr: 0.03 in the run, 0.0001 given"),
    (["--batch-size", "4"], "--batch-size: 8 in the run, 4 given"),
    (["--seed", "3"], "--seed: 0 in the run, 3 given"),
    (["--schedule", "cosine"], "--schedule: linear in the run, cosine given"),
    (["--warmup", "1"], "--warmup: 0 in the run, 1 given"),
    (["--grad-accum", "2"], "--grad-accum: 1 in the run, 2 given"),
    (["--max-length", "16"], "--max-length: the default in the run, 16 given"),
    (["--precision", "bf16"], "--precision: fp32 in the run, bf16 given"),
    (["--task", "regress"], "--task: classify in the run, regress given"),
    (["--lr", "1e-4", "--seed", "3"], "--lr: 0.03 in the run, 0.0001 given; --seed: 0 in the run, 3 given"),
]


@pytest.mark.parametrize("change, message", FINETUNE_CHANGES)
def test_finetune_resume_with_a_trajectory_change_is_refused(finetuned, change, message, capsys):
    err = refused(["finetune", "--out", str(finetuned), "--resume", "--max-steps", "4", *COMMON, *change],
                  finetuned, capsys)
    assert f"these differ: {message}; drop those flags" in err, err  # --max-steps may change: not listed


def test_finetune_resume_with_other_data_or_peft_is_refused(finetuned, tmp_path, capsys):
    err = refused(["finetune", "--out", str(finetuned), "--resume", "--train", str(tmp_path / "dev.tsv"), *COMMON],
                  finetuned, capsys)
    assert f"--train: {tmp_path / 'train.tsv'} in the run, {tmp_path / 'dev.tsv'} given" in err
    err = refused(["finetune", "--out", str(finetuned), "--resume", "--peft", "lora", *COMMON], finetuned, capsys)
    assert "--peft" in err and "full fine-tuning" in err


def test_finetune_resume_extends_and_records_the_change(finetuned, capsys):
    saved = yaml.safe_load((finetuned / "finetune.yaml").read_text())
    assert not (finetuned / "history.jsonl").exists()
    assert main(["finetune", "--out", str(finetuned), "--resume", "--max-steps", "4", "--eval-every", "2",
                 *COMMON]) == 0
    assert steps(finetuned) == [1, 2, 3, 4]
    [line] = history(finetuned)
    assert line["changes"] == {"trainer.max_steps": {"run": 2, "given": 4},
                               "trainer.eval_every": {"run": 3, "given": 2}}
    now = yaml.safe_load((finetuned / "finetune.yaml").read_text())
    assert now["trainer"]["lr"] == saved["trainer"]["lr"] == 0.03 and now["trainer"]["max_steps"] == 4
    # A second extension appends a line; the first stays.
    assert main(["finetune", "--out", str(finetuned), "--resume", "--max-steps", "5", *COMMON]) == 0
    assert [h["changes"] for h in history(finetuned)][1] == {"trainer.max_steps": {"run": 4, "given": 5}}
    assert steps(finetuned) == [1, 2, 3, 4, 5]


def test_finetune_finished_folder_without_resume_names_the_flag(finetuned, cli_run, capsys):
    *_, flags = cli_run
    err = refused(["finetune", *flags, "--out", str(finetuned), "--max-steps", "2"], finetuned, capsys)
    assert "--resume" in err and "resume=True" not in err


# ------------------------------------------------------------------------------------------- pretrain
@pytest.fixture
def pretrained(data_root, tmp_path):
    """A finished 2-step clm run (lr 3e-4 cosine, batch 2, seq_len 32, fp32, seed 0, one layer)."""
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    assert main(pretrain_args("clm", data, out, max_steps=2, eval_every=0)) == 0
    return out


PRETRAIN_CHANGES = [
    (["--lr", "1e-3"], "--lr: 0.0003 in the run, 0.001 given"),
    (["--batch-size", "4"], "--batch-size: 2 in the run, 4 given"),
    (["--seq-len", "16"], "--seq-len: 32 in the run, 16 given"),
    (["--objective", "prefix-lm"], "--objective: clm in the run, prefix-lm given"),
    (["--override", "n_layers=2"], "--override n_layers: 1 in the run, 2 given"),
    (["--precision", "bf16"], "--precision: fp32 in the run, bf16 given"),
    (["--seed", "3"], "--seed: 0 in the run, 3 given"),
    (["--schedule", "linear", "--warmup", "0"],
     "--schedule: cosine in the run, linear given; --warmup: 1 in the run, 0 given"),
]


@pytest.mark.parametrize("change, message", PRETRAIN_CHANGES)
def test_pretrain_resume_with_a_trajectory_change_is_refused(pretrained, change, message, capsys):
    err = refused(["pretrain", "--no-progress", "--out", str(pretrained), "--resume", "--max-steps", "4", *change],
                  pretrained, capsys)
    assert f"these differ: {message}; drop those flags" in err, err


def test_pretrain_resume_with_other_data_is_refused(pretrained, data_root, capsys):
    other = prepared(data_root, "bert")
    err = refused(["pretrain", "--no-progress", "--out", str(pretrained), "--resume", "--data", str(other)],
                  pretrained, capsys)
    assert f"--data: {(data_root / 'gpt').resolve()} in the run, {other} given" in err


def test_pretrain_resume_extends_and_records_the_change(pretrained, capsys):
    assert main(["pretrain", "--no-progress", "--out", str(pretrained), "--resume", "--max-steps", "4"]) == 0
    assert steps(pretrained) == [1, 2, 3, 4]
    [line] = history(pretrained)
    assert line["changes"] == {"max_steps": {"run": 2, "given": 4}} and line["time"].endswith("Z")
    saved = yaml.safe_load((pretrained / "config.yaml").read_text())
    assert saved["max_steps"] == 4 and saved["lr"] == 0.0003


def test_pretrain_finished_folder_without_resume_names_the_flag(pretrained, data_root, capsys):
    err = refused(pretrain_args("clm", prepared(data_root, "gpt"), pretrained, max_steps=2), pretrained, capsys)
    assert "--resume" in err and "resume=True" not in err


def test_resume_help_lists_what_may_change(capsys):
    for verb in ("finetune", "pretrain"):
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "Only these may change on resume: --max-steps (to extend the run)" in text
        assert "OUT/history.jsonl" in text
