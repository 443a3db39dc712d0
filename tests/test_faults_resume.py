"""Resume is a transaction: a refused resumed or re-run command leaves its run folder byte-identical.

Each case runs a tiny real run, hashes every file of its folder, runs the refused command, and checks the
exit code (2), the one-line error and the hashes; then a plain ``--resume`` still works.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from lmforge import checkpoint
from lmforge.cli.main import main
from tests import task_helpers as th
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder``: relative name -> sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(args: list[str], folder: Path, capsys, expect: str) -> None:
    before = snapshot(folder)
    capsys.readouterr()
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and expect in err[0], err
    assert "Traceback" not in err[0]
    assert snapshot(folder) == before


@pytest.fixture(scope="module")
def pretrained(data_root, tmp_path_factory):  # noqa: F811
    data = prepared(data_root, "gpt")
    out = tmp_path_factory.mktemp("pre") / "run"
    assert main(pretrain_args("clm", data, out, max_steps=2, save_every=1, eval_every=0)) == 0
    return data, out


def test_pretrain_resume_with_another_batch_size_leaves_the_run_untouched(pretrained, capsys):
    data, out = pretrained
    refused(["pretrain", "--no-progress", "--out", str(out), "--resume", "--batch-size", "4"], out, capsys,
            "--batch-size: 2 in the run, 4 given")
    # config.yaml still holds the run's settings, so a plain --resume continues it.
    assert main(["pretrain", "--no-progress", "--out", str(out), "--resume", "--max-steps", "3"]) == 0


def test_pretrain_fresh_run_into_an_existing_run_is_refused_untouched(pretrained, capsys):
    data, out = pretrained
    refused(pretrain_args("clm", data, out, max_steps=2, batch_size=4), out, capsys, "already holds a run")


def test_resume_of_a_missing_folder_says_so(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main(["pretrain", "--out", str(missing), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "no such folder, so there is no run to resume" in err and "model" not in err
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    assert main(["pretrain", "--out", str(tmp_path / "empty"), "--resume"]) == 2
    assert "holds no run to resume" in capsys.readouterr().err
    assert list((tmp_path / "empty").iterdir()) == []
    assert main(["finetune", "--out", str(missing), "--resume"]) == 2
    assert "no such folder, so there is no run to resume" in capsys.readouterr().err and not missing.exists()
    assert main(["finetune", "--out", str(tmp_path / "empty"), "--resume"]) == 2
    assert "holds no run to resume (no finetune.yaml)" in capsys.readouterr().err


def test_finetune_resume_with_another_batch_size_leaves_the_run_untouched(tmp_path, capsys):
    tok = th.tokenizer(tmp_path, "bert")
    model_dir = checkpoint.save(th.body("bert", tok), tmp_path / "base", tokenizer=tok)
    train = th.write_sentiment(tmp_path / "train.tsv", 32)
    out = tmp_path / "run"
    common = ["--no-progress", "--no-tensorboard", "--precision", "fp32"]
    assert main(["finetune", "--model", str(model_dir), "--task", "classify", "--train", str(train),
                 "--out", str(out), "--max-steps", "2", "--save-every", "1", "--batch-size", "4", *common]) == 0
    refused(["finetune", "--out", str(out), "--resume", "--batch-size", "8", *common], out, capsys, "batch")
    refused(["finetune", "--out", str(out), "--resume", "--peft", "lora", *common], out, capsys, "--peft")
    assert main(["finetune", "--out", str(out), "--resume", "--max-steps", "3", *common]) == 0


def test_data_prepare_rerun_with_other_settings_leaves_the_folder_untouched(data_root, tmp_path, capsys):  # noqa: F811
    data = prepared(data_root, "gpt")  # its corpus.txt and tokenizer
    corpus, out = data_root / "corpus.txt", tmp_path / "data"
    common = ["data", "prepare", "--tokenizer", str(data / "tokenizer"), "--out", str(out), "--no-progress"]
    assert main([*common, "--val-fraction", "0.1", str(corpus)]) == 0
    refused([*common, "--val-fraction", "0.2", str(corpus)], out, capsys, "prepared with different val_fraction")


def test_quickstart_with_other_minutes_leaves_the_folder_untouched(tmp_path, capsys, monkeypatch):
    from lmforge.quickstart import runner
    from test_quickstart import _fake_stages

    monkeypatch.setattr(runner, "STAGES", tuple(_fake_stages([])))
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), "--minutes", "1", "--no-progress"]) == 0
    refused(["quickstart", "--out", str(out), "--minutes", "2", "--no-progress"], out, capsys, "--minutes 1.0")
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "mine.txt").write_text("precious")
    refused(["quickstart", "--out", str(stranger), "--minutes", "1", "--restart", "--no-progress"], stranger,
            capsys, "refusing to delete it")


def test_peft_merge_refused_over_an_existing_folder_leaves_it_untouched(tmp_path, capsys):
    from peft_helpers import config, perturb, tiny_model

    from lmforge.peft import apply_peft

    model = apply_peft(tiny_model("gpt-tiny"), config("lora"))
    perturb(model)
    adapter = model.save_adapter(tmp_path / "adapter")
    tiny_model("gpt-tiny", seed=7).save(tmp_path / "other")
    out = tmp_path / "merged"
    tiny_model("gpt-tiny", seed=3).save(out)  # a model already there, which --overwrite would replace
    args = ["peft", "merge", "--base", str(tmp_path / "other"), "--adapter", str(adapter), "--out", str(out)]
    refused(args + ["--overwrite"], out, capsys, "weights differ")
    refused(args, out, capsys, "already exists")


def test_embedding_finetune_resume_with_another_batch_size_leaves_the_run_untouched(tmp_path, capsys):
    import embedding_helpers as h

    folder = h.model_folder(tmp_path, "bert")
    out = tmp_path / "run"
    common = ["finetune", "--model", str(folder), "--task", "embedding", "--loss", "triplet", "--train",
              "bible-triplets:train", "--max-length", "32", "--precision", "fp32", "--device", "cpu",
              "--no-progress", "--no-tensorboard", "--out", str(out)]
    assert main([*common, "--max-steps", "2", "--save-every", "1", "--batch-size", "4"]) == 0
    refused([*common, "--max-steps", "3", "--batch-size", "8", "--resume"], out, capsys, "batch")
    assert main([*common, "--max-steps", "3", "--batch-size", "4", "--resume"]) == 0
