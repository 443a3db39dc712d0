"""Mixture of experts in training: `lmforge pretrain` with MoE overrides logs the router metrics, `model info`
shows active parameters, and stopping and resuming stays exact."""

from __future__ import annotations

import json

import pytest

import lmforge
from lmforge.cli.main import main
from lmforge.training.pretrain import build_pretraining
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401
from test_training_resume import assert_same_weights, config, curve, weights

MOE = {"moe_experts": 4, "moe_top_k": 2, "moe_capacity_factor": 1.0, "moe_aux_loss": 0.01, "moe_z_loss": 0.001}
KEYS = ("step", "loss", "grad_norm", "eval_loss", "moe_aux_loss", "moe_z_loss", "moe_dropped", "moe_load")


def test_pretrain_with_moe_overrides_logs_router_metrics(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    args = pretrain_args("clm", prepared(data_root, "gpt"), out)
    for key, value in MOE.items():
        args += ["--override", f"{key}={value}"]
    assert main(args) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert 0.5 < r["moe_aux_loss"] < 4  # ~1 when balanced, E = 4 at collapse
        assert r["moe_z_loss"] > 0 and 0 <= r["moe_dropped"] < 1
        assert len(r["moe_load"]) == 4 and sum(r["moe_load"]) == pytest.approx(1.0, abs=1e-4)
        assert 1.0 <= r["moe_load_max"] <= 4.0
    assert "eval_loss" in records[1]
    model = lmforge.load(out / "model")  # the model folder holds the stacked expert weights
    assert model.config.moe_experts == 4 and model.active_parameters() < model.num_parameters()


def test_model_info_shows_total_and_active_parameters(capsys):
    assert main(["model", "info", "gpt-tiny-moe", "--json"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["experts"] == "8 (top-1, in 1 of every 2 layers)"
    assert info["active_parameters"] < info["parameters"] / 2
    assert main(["model", "info", "gpt-tiny", "--json"]) == 0
    dense = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "active_parameters" not in dense
    # the same active weights as gpt-tiny, plus three 384 x 8 routers
    assert info["train_flops_per_token"] - dense["train_flops_per_token"] == 6 * 3 * 384 * 8


def test_stop_and_resume_with_moe_is_exact(data_root, tmp_path):
    data = prepared(data_root, "gpt")
    settings = dict(overrides={"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64,
                               "moe_every": 2, "moe_jitter": 0.1, **MOE})
    build_pretraining(config("clm", data, tmp_path / "ref", **settings)).trainer.fit()
    build_pretraining(config("clm", data, tmp_path / "run", **settings)).trainer.fit(steps=3)
    build_pretraining(config("clm", data, tmp_path / "run", resume=True, **settings)).trainer.fit()
    assert curve(tmp_path / "run", KEYS) == curve(tmp_path / "ref", KEYS)
    assert curve(tmp_path / "ref", KEYS)[-1][4] is not None  # the MoE metrics were logged
    assert_same_weights(weights(tmp_path / "run" / "model"), weights(tmp_path / "ref" / "model"))
