"""`lmforge distill --train`: a fine-tuned classifier's soft labels teach a smaller student the task.

The result is an ordinary task folder (``lmforge evaluate --model RUN`` scores it), the student learns the toy
task, the loss is the one of :class:`TaskDistillation`, and a teacher of the wrong kind or vocabulary is refused.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.cli.main import main
from lmforge.distillation.task import TaskDistillation
from lmforge.tasks.finetune import finetune
from lmforge.tasks.model import build_task_model, load_task_model
from lmforge.tasks.spec import TaskSpec
from tests import task_helpers as th


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """(tokenizer, train file, dev file, teacher task folder): a 4-layer BERT fine-tuned on toy sentiment."""
    folder = tmp_path_factory.mktemp("teacher")
    tok = th.tokenizer(folder, "bert")
    train, dev = th.write_sentiment(folder / "train.tsv", 64), th.write_sentiment(folder / "dev.tsv", 16, seed=1)
    torch.manual_seed(0)  # the same teacher whichever tests ran before in this process
    body = th.body("bert", tok, n_layers=4)
    result = finetune(body, TaskSpec(task="classify"), str(train), str(dev), config=th.train_config(40),
                      out=folder / "run", tokenizer=tok)
    assert result.best_value == 1.0  # the teacher knows the task
    return tok, train, dev, folder / "run" / "model"


def distill_args(teacher, train, dev, out, *extra):
    return ["distill", "--teacher", str(teacher), "--train", str(train), "--eval", str(dev), "--out", str(out),
            "--max-steps", "30", "--batch-size", "8", "--lr", "3e-3", "--eval-every", "10", "--save-every", "30",
            "--schedule", "constant", "--precision", "fp32", "--no-progress", "--no-tensorboard", *extra]


def test_task_distillation_writes_a_task_folder_that_evaluates(teacher, tmp_path, capsys):
    tok, train, dev, folder = teacher
    out = tmp_path / "run"
    assert main(distill_args(folder, train, dev, out)) == 0
    assert "init from teacher layers 0, 2" in capsys.readouterr().err
    student = load_task_model(out / "model")
    assert student.body.config.n_layers == 2 and student.spec.labels == load_task_model(folder).spec.labels

    assert main(["evaluate", "--model", str(out), "--data", str(dev)]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["accuracy"] == 1.0 and scores["examples"] == 16  # the student learned the toy task
    saved = (out / "distill.yaml").read_text()
    assert "alpha: 0.5" in saved and "temperature: 2.0" in saved


def test_the_loss_mixes_soft_and_gold_labels(teacher):
    tok, _, _, folder = teacher
    t = load_task_model(folder)
    spec = t.spec
    student = build_task_model(th.body("bert", tok, n_layers=1), spec)
    batch = {"input_ids": torch.randint(5, tok.vocab_size, (4, 7)),
             "attention_mask": torch.ones(4, 7, dtype=torch.long), "labels": torch.tensor([0, 1, 1, 0])}
    student.eval()  # no dropout: the two forward passes below see the same logits
    out = TaskDistillation(t, alpha=0.3, temperature=3.0)(student, batch)
    z_s = student(batch["input_ids"], batch["attention_mask"]).logits
    z_t = t(batch["input_ids"], batch["attention_mask"]).logits
    kl = F.kl_div(F.log_softmax(z_s / 3, -1), F.softmax(z_t / 3, -1), reduction="batchmean") * 9
    want = 0.3 * kl + 0.7 * F.cross_entropy(z_s, batch["labels"])
    torch.testing.assert_close(out.loss, want)
    assert out.n_targets == 4 and not any(p.requires_grad for p in t.parameters())


def test_wrong_teacher_kinds_and_vocabularies_are_refused(teacher, tmp_path, capsys):
    tok, train, dev, folder = teacher
    plain = lmforge.save(th.body("bert", tok), tmp_path / "plain", tokenizer=tok)
    assert main(distill_args(plain, train, dev, tmp_path / "a")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a fine-tuned task folder" in err[0] and not (tmp_path / "a").exists()

    assert main(distill_args(folder, train, dev, tmp_path / "b", "--student", "bert-tiny", "--override",
                             f"vocab_size={tok.vocab_size + 7}")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"has {tok.vocab_size} ids but the student's {tok.vocab_size + 7}" in err[0]
    assert not (tmp_path / "b").exists()


def test_dist_timeout_reaches_the_process_group(teacher, tmp_path, monkeypatch):
    """--dist-timeout was accepted by distill and then dropped: it must reach the group's setup."""
    from lmforge.training import distributed
    seen, real = [], distributed.setup

    def setup(strategy="auto", device="auto", timeout=None):
        seen.append(timeout)
        return real(strategy, device, timeout)
    monkeypatch.setattr(distributed, "setup", setup)
    tok, train, dev, folder = teacher
    args = distill_args(folder, train, dev, tmp_path / "run", "--dist-timeout", "7")
    args[args.index("--max-steps") + 1] = "1"
    assert main(args) == 0
    assert seen and set(seen) == {7.0}
