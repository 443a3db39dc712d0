"""`lmforge pretrain --objective mlm+nsp` and RoBERTa's formats end to end on tiny prepared shards: the CLI run,
learning (validation loss falls), exact resume, plain mlm unchanged, and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lmforge
from lmforge.cli.main import main
from lmforge.data import DocumentDataset
from lmforge.objectives import MaskedLM, MaskedLMAndNSP
from lmforge.objectives.input_formats import FullSentences
from lmforge.training import TrainConfig
from lmforge.training.pretrain import build_pretraining
from test_training_pretrain import TINY, data_root, prepared, pretrain_args  # noqa: F401
from test_training_resume import assert_same_weights, curve, metrics, weights

SMALL = TINY["mlm"][2]  # a 1-layer, 32-wide bert-tiny


def config(data: Path, out: Path, objective: str = "mlm+nsp", fmt: str | None = None, **settings) -> TrainConfig:
    base = dict(model="bert-tiny", objective=objective, data=str(data), out=str(out), overrides=SMALL, max_steps=6,
                batch_size=2, grad_accum=2, seq_len=32, warmup=2, schedule="linear", eval_every=3, eval_batches=1,
                save_every=3, precision="fp32", progress=False, tensorboard=False,
                objective_options={"format": fmt} if fmt else {})
    return TrainConfig.from_dict({**base, **settings})


def test_cli_run_trains_the_nsp_head(data_root, tmp_path, capsys):
    data = prepared(data_root, "bert")
    out = tmp_path / "run"
    assert main(pretrain_args("mlm", data, out, objective="mlm+nsp")) == 0
    model = lmforge.load(out / "model")
    assert model.config.nsp_head and model.config.pooler and model.nsp_head is not None
    evals = [r for r in metrics(out) if "eval_loss" in r]
    assert evals and all(0.0 <= r["eval_nsp_accuracy"] <= 1.0 and r["eval_nsp_loss"] > 0 for r in evals)
    assert "objective mlm+nsp" in capsys.readouterr().err


def test_mlm_nsp_lowers_validation_loss(data_root, tmp_path):
    data = prepared(data_root, "bert")
    run = build_pretraining(config(data, tmp_path / "run", max_steps=40, batch_size=8, grad_accum=1, seq_len=64,
                                   lr=2e-3, warmup=4, eval_every=40, eval_batches=4, save_every=40,
                                   overrides={**SMALL, "dropout": 0.0, "attn_dropout": 0.0}))
    before = run.trainer.evaluate()
    run.trainer.fit()
    after = run.trainer.evaluate()
    total = lambda r: r["eval_loss"] + r["eval_nsp_loss"]  # noqa: E731  the loss the model is trained on
    assert total(after) < total(before) - 0.2, (before, after)
    assert after["eval_loss"] < before["eval_loss"]


@pytest.mark.parametrize("objective, fmt", [("mlm+nsp", None), ("mlm+nsp", "sentence-pair"),
                                            ("mlm", "full-sentences"), ("mlm", "doc-sentences")])
def test_stop_and_resume_is_exact(objective, fmt, data_root, tmp_path):
    data = prepared(data_root, "bert")
    build_pretraining(config(data, tmp_path / "ref", objective, fmt)).trainer.fit()
    first = build_pretraining(config(data, tmp_path / "run", objective, fmt)).trainer
    assert first.fit(steps=3).step == 3
    resumed = build_pretraining(config(data, tmp_path / "run", objective, fmt, resume=True)).trainer
    assert resumed.fit().step == 6
    keys = ("step", "loss", "lr", "grad_norm", "eval_loss", "eval_accuracy", "eval_nsp_loss", "eval_nsp_accuracy")
    assert curve(tmp_path / "run", keys) == curve(tmp_path / "ref", keys)
    assert_same_weights(weights(tmp_path / "run" / "model"), weights(tmp_path / "ref" / "model"))
    if objective == "mlm+nsp":
        assert any(r.get("eval_nsp_accuracy") is not None for r in metrics(tmp_path / "ref"))


def test_objectives_and_data_of_each_format(data_root, tmp_path):
    data = prepared(data_root, "bert")

    def built(objective, fmt=None):
        return build_pretraining(config(data, tmp_path / f"{objective}-{fmt}", objective, fmt)).trainer

    plain = built("mlm")  # unchanged: MaskedLM over segments cut every seq_len - 2 tokens, whatever the sentences
    assert type(plain.objective) is MaskedLM and plain.train_data.sentence_end_ids is None
    assert plain.train_data.max_len == 30 and not plain.model.config.nsp_head
    nsp = built("mlm+nsp")
    assert isinstance(nsp.objective, MaskedLMAndNSP) and nsp.objective.format == "segment-pair"
    assert nsp.train_data.max_len == 29 and nsp.train_data.sentence_end_ids and nsp.objective.max_length == 32
    full, doc = built("mlm", "full-sentences"), built("mlm", "doc-sentences")
    assert isinstance(full.objective, FullSentences) and full.objective.max_length == 30
    assert type(doc.objective) is MaskedLM and isinstance(doc.train_data, DocumentDataset)
    assert doc.train_data.sentence_end_ids == full.train_data.sentence_end_ids == nsp.train_data.sentence_end_ids
    batch = full.objective(next(iter(full.train_data)))
    assert batch["input_ids"].shape[1] <= 32


@pytest.mark.parametrize("objective, extra, expected", [
    ("mlm", ["--objective-option", "format=segment-pair"],
     "format='segment-pair' trains NSP: use it with --objective mlm+nsp"),
    ("mlm+nsp", ["--objective-option", "format=full-sentences"],
     "format='full-sentences' has no NSP: use it with --objective mlm; --objective mlm+nsp takes "
     "format=segment-pair|sentence-pair"),
    ("mlm+nsp", ["--objective-option", "format=paragraphs"], "unknown format='paragraphs'; choose one of"),
    ("clm", ["--objective-option", "format=doc-sentences"], "--objective clm takes no format"),
    ("mlm+nsp", ["--batch-size", "1"], "needs batch_size >= 2 (got 1)"),
    ("mlm+nsp", ["--override", "nsp_head=false"], "needs a model with nsp_head=True"),
    ("mlm+nsp", ["--override", "type_vocab_size=1"], "pass --override type_vocab_size=2"),
    ("mlm+nsp", ["--seq-len", "4"], "seq_len=4 leaves no room for 2 token(s) of text besides the 3 framing tokens"),
    ("mlm+nsp", ["--objective-option", "masking=static", "--objective-option", "whole_word=true"],
     "objective option masking='static' does not work with NSP pairs"),
])
def test_bad_combinations_are_one_line_errors(objective, extra, expected, data_root, tmp_path, capsys):
    data = prepared(data_root, "bert")
    out = tmp_path / "run"
    assert main(pretrain_args("mlm", data, out, objective=objective) + extra) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_a_model_folder_without_an_nsp_head_is_refused(data_root, tmp_path, capsys):
    data = prepared(data_root, "bert")
    assert main(pretrain_args("mlm", data, tmp_path / "mlm", max_steps=2, eval_every=0)) == 0
    capsys.readouterr()
    args = pretrain_args("mlm", data, tmp_path / "nsp", objective="mlm+nsp", model=tmp_path / "mlm" / "model")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "needs a model with pooler=True, nsp_head=True" in err and len(err.strip().splitlines()) == 1, err
    assert json.loads((tmp_path / "mlm" / "model" / "config.json").read_text()).get("nsp_head") is False
