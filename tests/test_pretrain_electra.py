"""`lmforge pretrain --objective electra` end to end: it learns, it resumes bit for bit, its model folder is the
discriminator (an ordinary encoder that fine-tunes), and models it cannot train are refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

import lmforge
from lmforge.cli.main import main
from lmforge.tasks.model import build_task_model
from lmforge.tasks.spec import TaskSpec
from lmforge.training import TrainConfig
from lmforge.training.pretrain import build_pretraining

import task_helpers as th
from test_training_pretrain import DECODER, data_root, prepared, pretrain_args  # noqa: F401
from test_training_resume import assert_same_weights, curve, metrics

SMALL = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}


def config(data: Path, out: Path, **settings) -> TrainConfig:
    """A tiny ELECTRA run that keeps every source of randomness (the preset's dropout, shuffled data, masking,
    the generator's samples, two micro-batches, evaluation in between)."""
    base = dict(model="bert-tiny", objective="electra", data=str(data), out=str(out), overrides=SMALL, max_steps=6,
                batch_size=2, grad_accum=2, seq_len=32, warmup=2, schedule="linear", eval_every=3, eval_batches=1,
                save_every=3, precision="fp32", progress=False, tensorboard=False)
    return TrainConfig.from_dict({**base, **settings})


def test_short_run_lowers_validation_loss_and_saves_the_discriminator(data_root, tmp_path):
    data = prepared(data_root, "bert")
    out = tmp_path / "run"
    run = build_pretraining(config(data, out, max_steps=40, batch_size=8, grad_accum=1, lr=3e-3, warmup=4,
                                   eval_every=20, eval_batches=2, save_every=40, overrides={**SMALL, "dropout": 0.0},
                                   objective_options={"generator_size": 0.5}))
    assert run.model.generator.config.d_model == 16
    before = run.trainer.evaluate()
    run.trainer.fit()
    records = metrics(out)
    evals = [r for r in records if "eval_loss" in r]
    assert len(evals) == 2
    after = evals[-1]
    # The generator's MLM (eval_loss, eval_ppl = its exp) and the discriminator's RTD both learned.
    assert after["eval_ppl"] == pytest.approx(math.exp(after["eval_loss"]))
    assert after["eval_loss"] < before["eval_loss"] - 0.2, (before, after)
    assert after["eval_rtd_loss"] < before["eval_rtd_loss"] - 0.2, (before, after)
    assert after["eval_rtd_accuracy"] > 0.7, after
    # The logged training loss is the joint one, L_MLM + 50 L_RTD.
    assert records[0]["loss"] > 20 * before["eval_rtd_loss"]

    model = lmforge.load(out / "model")  # an ordinary encoder folder: ElectraForPreTraining's shape
    assert (model.config.arch, model.config.head, model.config.d_model) == ("encoder", "rtd", 32)
    assert not any(k.startswith("generator") for k in load_file(str(out / "model" / "model.safetensors")))
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    assert model(ids).logits.shape == (1, 5)  # one replaced/original logit per token
    # transformers reads it as the ElectraForPreTraining it is.
    hf = transformers.ElectraForPreTraining.from_pretrained(lmforge.to_hf(model, tmp_path / "hf")).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model.eval()(ids).logits, atol=1e-4, rtol=0)
    task = build_task_model(lmforge.load(out / "model"), TaskSpec(task="classify", labels=["neg", "pos"]))
    assert task(ids, labels=torch.tensor([1])).logits.shape == (1, 2)


def test_finetune_classify_from_the_saved_discriminator(data_root, tmp_path, capsys):
    data = prepared(data_root, "bert")
    run = tmp_path / "electra"
    assert main(pretrain_args("mlm", data, run, objective="electra", max_steps=2)) == 0
    train, dev = th.write_sentiment(tmp_path / "train.tsv", 16), th.write_sentiment(tmp_path / "dev.tsv", 8, seed=1)
    out = tmp_path / "clf"
    assert main(["finetune", "--model", str(run / "model"), "--task", "classify", "--train", str(train), "--eval",
                 str(dev), "--out", str(out), "--max-steps", "2", "--eval-every", "2", "--no-progress",
                 "--no-tensorboard", "--precision", "fp32"]) == 0
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
    capsys.readouterr()

    # Continued pre-training: ELECTRA again from the discriminator; MLM cannot train its head and says so.
    assert main(pretrain_args("mlm", data, tmp_path / "more", model=run / "model", objective="electra",
                              max_steps=2)) == 0
    capsys.readouterr()
    assert main(pretrain_args("mlm", data, tmp_path / "mlm", model=run / "model", max_steps=2)) == 2
    err = capsys.readouterr().err.strip()
    assert "head: rtd" in err and "objective 'mlm' cannot train" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "mlm").exists()


def test_stop_and_resume_is_exact(data_root, tmp_path):
    data = prepared(data_root, "bert")
    build_pretraining(config(data, tmp_path / "ref")).trainer.fit()
    first = build_pretraining(config(data, tmp_path / "run")).trainer
    assert first.fit(steps=3).step == 3
    result = build_pretraining(config(data, tmp_path / "run", resume=True)).trainer.fit()
    assert (result.step, result.stopped_by) == (6, "max_steps")
    assert curve(tmp_path / "run") == curve(tmp_path / "ref")
    assert_same_weights(load_file(str(tmp_path / "run" / "model" / "model.safetensors")),
                        load_file(str(tmp_path / "ref" / "model" / "model.safetensors")))
    # The checkpoints hold the generator as well: resuming needs it.
    ck = load_file(str(tmp_path / "run" / "checkpoints" / "step-00000006" / "model" / "model.safetensors"))
    assert any(k.startswith("generator.") for k in ck) and any(k.startswith("discriminator.") for k in ck)


@pytest.mark.parametrize("preset, family, arch", [("gpt-tiny", "gpt", "decoder"),
                                                  ("t5-tiny", "t5", "encoder-decoder")])
def test_models_electra_cannot_train_are_refused(preset, family, arch, data_root, tmp_path, capsys):
    data = prepared(data_root, family)
    args = pretrain_args("clm", data, tmp_path / "run", model=preset, objective="electra")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert f"objective 'electra' does not fit arch='{arch}'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()
