"""`lmforge distill --data`: DistilBERT-style pre-training distillation end to end on tiny prepared shards.

The student starts from every other teacher layer, training lowers the distillation loss and the student's
validation MLM loss, ``OUT/model`` is an ordinary model folder (``lmforge.load``, ``lmforge finetune``), and bad
input (vocabularies of different sizes, a teacher that is no model folder, a folder holding another run) is
refused in one line before anything is written.

The helpers here (``teacher``, ``distill_args``) are shared with the resume test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import command_args
import lmforge
from lmforge.cli.main import main
from lmforge.data import DocumentDataset
from lmforge.distillation import cosine_embedding_loss, soft_target_kl
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401

TEACHER_LAYERS = 4
SHAPE = {"d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}


@pytest.fixture(scope="module")
def teacher(data_root) -> tuple[Path, Path]:  # noqa: F811
    """(shards, teacher model folder): a 4-layer BERT pre-trained for a few steps on 60 kB of Austen."""
    data = prepared(data_root, "bert")
    out = data_root / "teacher"
    if not (out / "model").is_dir():
        args = pretrain_args("mlm", data, out, max_steps=30, eval_every=0, save_every=0, batch_size=8, lr=3e-3)
        args += ["--no-tensorboard", "--override", f"n_layers={TEACHER_LAYERS}"]
        args += [a for k, v in SHAPE.items() for a in ("--override", f"{k}={v}")]
        assert main(args) == 0
    return data, out / "model"


def distill_args(teacher: Path, data: Path, out: Path, *extra: str, **settings) -> list[str]:
    """A tiny, fp32, one-thread-friendly distillation run; ``settings`` add or replace options."""
    options = {"teacher": teacher, "data": data, "out": out, "max_steps": 4, "batch_size": 4, "seq_len": 32,
               "eval_every": 0, "save_every": 0, "precision": "fp32", "warmup": 0, "lr": 1e-3, **settings}
    return [*command_args(["distill", "--no-progress", "--no-tensorboard"], options), *extra]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@torch.no_grad()
def distance(student, teacher, data: Path) -> float:
    """KL (T = 2) + cosine loss between the two models on the first validation batch (eval mode)."""
    ids = torch.stack(next(iter(DocumentDataset(data, 30, 8, split="val", shuffle=False))))  # (8, 30)
    s, t = student.eval()(ids), teacher.eval()(ids)
    V = s.logits.shape[-1]
    return float(soft_target_kl(s.logits.view(-1, V), t.logits.view(-1, V), 2.0) +
                 cosine_embedding_loss(s.last_hidden_state.flatten(0, 1), t.last_hidden_state.flatten(0, 1)))


def test_student_starts_from_every_other_teacher_layer_and_lowers_the_losses(teacher, tmp_path, capsys):
    data, folder = teacher
    out = tmp_path / "run"
    # eval_every=1: the student's validation loss after step 1 and at the end, on the same batches.
    assert main(distill_args(folder, data, out, max_steps=24, eval_every=1, eval_batches=4, warmup=2)) == 0
    assert "init from teacher layers 0, 2" in capsys.readouterr().err

    evals = [r["eval_loss"] for r in records(out)]
    assert len(evals) == 24 and evals[-1] < evals[0]  # the student's own validation MLM loss went down

    student = lmforge.load(out / "model")  # an ordinary model folder
    t = lmforge.load(folder)
    assert student.config.n_layers == TEACHER_LAYERS // 2 and student.config.vocab_size == t.config.vocab_size
    assert (out / "distill.yaml").is_file() and (out / "config.yaml").is_file()

    # The initialisation itself: with lr ~0 (and no decay) the saved student is the teacher's layers 0 and 2.
    frozen = tmp_path / "frozen"
    assert main(distill_args(folder, data, frozen, max_steps=1, lr=1e-12, weight_decay=0, warmup=0)) == 0
    s = lmforge.load(frozen / "model")
    # Training brought the student closer to the teacher: soft-target KL and cosine loss on held-out text.
    assert distance(student, t, data) < distance(s, t, data)
    for i, j in enumerate([0, 2]):
        for (name, p), (_, q) in zip(s.encoder.layers[i].named_parameters(), t.encoder.layers[j].named_parameters()):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=name)
    torch.testing.assert_close(s.embed_tokens.weight, t.embed_tokens.weight, atol=1e-6, rtol=0)


def test_the_student_fine_tunes_like_any_model_folder(teacher, tmp_path):
    data, folder = teacher
    out = tmp_path / "run"
    assert main(distill_args(folder, data, out, max_steps=2)) == 0
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\n" + "".join(f"{w} is here\t{i % 2}\n" for i, w in
                                               enumerate(["emma", "anne", "mr", "the", "she", "he"] * 3)))
    ft = tmp_path / "ft"
    assert main(["finetune", "--model", str(out / "model"), "--task", "classify", "--train", str(train),
                 "--out", str(ft), "--max-steps", "2", "--batch-size", "4", "--precision", "fp32", "--no-progress",
                 "--no-tensorboard", "--eval-every", "0"]) == 0
    assert (ft / "model" / "task.json").is_file()


def test_a_preset_student_with_overrides_and_a_width_refusal(teacher, tmp_path, capsys):
    data, folder = teacher
    out = tmp_path / "run"
    extra = [a for k, v in SHAPE.items() for a in ("--override", f"{k}={v}")]
    assert main(distill_args(folder, data, out, "--override", "n_layers=1", *extra, student="bert-tiny",
                             max_steps=1)) == 0
    assert "init from teacher layers 0" in capsys.readouterr().err
    assert lmforge.load(out / "model").config.n_layers == 1
    # A preset of another width cannot share the cosine loss's space: refused, naming both widths.
    assert main(distill_args(folder, data, tmp_path / "wide", student="bert-tiny")) == 2
    err = capsys.readouterr().err
    assert "d_model (384) differs from the teacher's (32)" in err and "--alpha-cos 0" in err
    assert not (tmp_path / "wide").exists()


def test_vocabulary_mismatch_is_refused_before_anything_is_written(teacher, tmp_path, capsys):
    data, folder = teacher
    out = tmp_path / "run"
    vocab = lmforge.load(folder).config.vocab_size
    assert main(distill_args(folder, data, out, "--override", f"vocab_size={vocab + 50}")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"teacher's vocabulary has {vocab} ids but the student's {vocab + 50}" in err[0]
    assert not out.exists()


def test_bad_teacher_and_occupied_run_folder_are_one_line_refusals(teacher, tmp_path, capsys):
    data, folder = teacher
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(distill_args(empty, data, tmp_path / "a")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a model or task folder" in err[0] and not (tmp_path / "a").exists()
    assert main(distill_args(tmp_path / "nowhere", data, tmp_path / "b")) == 2
    assert "no such folder" in capsys.readouterr().err and not (tmp_path / "b").exists()

    out = tmp_path / "run"
    assert main(distill_args(folder, data, out, max_steps=1)) == 0
    before = sorted(p.name for p in out.rglob("*"))
    assert main(distill_args(folder, data, out, max_steps=1)) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert sorted(p.name for p in out.rglob("*")) == before

    # A student folder keeps its own weights (continued distillation), and is paired with the teacher as well.
    again = tmp_path / "again"
    assert main(distill_args(folder, data, again, max_steps=1, student=out / "model")) == 0
    assert f"the weights of {out / 'model'}" in capsys.readouterr().err


def test_a_decoder_teacher_distils_on_its_causal_lm_objective(data_root, tmp_path, capsys):  # noqa: F811
    data = prepared(data_root, "gpt")
    teacher_run = tmp_path / "gpt"
    args = pretrain_args("clm", data, teacher_run, max_steps=2, eval_every=0, save_every=0)
    assert main([*args, "--no-tensorboard", "--override", "n_layers=2"]) == 0
    out = tmp_path / "run"
    assert main(distill_args(teacher_run, data, out, max_steps=2, eval_every=2, eval_batches=1)) == 0
    err = capsys.readouterr().err
    assert "init from teacher layers 0 | objective clm" in err  # a run folder means its model/; clm by default
    student = lmforge.load(out / "model")
    assert student.config.arch == "decoder" and student.config.n_layers == 1
    assert all(r["loss"] > 0 and "eval_loss" in r for r in records(out)[1:])
