"""`lmforge cost`: a run's price tag, an experiment's sum, recomputed CO2e, the estimate before a run, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

import lmforge
from lmforge.cli.main import main
from lmforge.objectives import build_objective
from lmforge.training import TrainConfig, Trainer
from lmforge.training.price_tag import PriceSettings, PriceTag, RaplMeter


def tiny_run(out, steps: int = 2) -> dict:
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)
    data = [torch.randint(0, 50, (2, 9)) for _ in range(steps)]
    cfg = TrainConfig(max_steps=steps, lr=1e-3, eval_every=0, progress=False, tensorboard=False, precision="fp32",
                      region="fr", price_per_hour=1.0)
    Trainer(model, build_objective("clm", pad_token_id=0), data, cfg, out=out).fit()
    return json.loads((out / "price_tag.json").read_text())


def test_cost_of_a_run_and_of_an_experiment(tmp_path, capsys):
    a = tiny_run(tmp_path / "exp" / "cells" / "a")
    b = tiny_run(tmp_path / "exp" / "cells" / "b")
    assert a["settings"]["grid_intensity"] == 55.0 and a["total_tokens"] == 2 * 2 * 8  # (B, T+1) blocks: T inputs each
    assert main(["cost", str(tmp_path / "exp" / "cells" / "a"), "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["runs"] == 1 and one["total_flops"] == a["total_flops"]
    assert one["co2e_kg"] == pytest.approx(a["energy_kwh"] * 55.0 / 1000, rel=0.01)
    assert one["cost_usd"] == pytest.approx(a["device_s"] / 3600 * 1.0)
    assert one["references_lbs_co2e"]["Transformer (big) w/ neural arch. search"] == 626155.0

    assert main(["cost", str(tmp_path / "exp"), "--json", "--grid-intensity", "1000"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["runs"] == 2 and both["total_flops"] == a["total_flops"] + b["total_flops"]
    assert both["co2e_kg"] == pytest.approx(both["energy_kwh"])  # 1000 g/kWh: kg equals kWh
    assert main(["cost", str(tmp_path / "exp")]) == 0
    text = capsys.readouterr().out
    assert "2 runs (sum)" in text and "Strubell" in text and "626,155" in text


def test_bad_input_is_one_line(tmp_path, capsys):
    assert main(["cost", str(tmp_path / "nothing")]) == 2
    assert main(["cost", str(tmp_path), "--region", "mars"]) == 2
    assert main(["cost", "--plan", "--model", "gpt-tiny", "--tokens", "0"]) == 2
    assert main(["cost", "--plan", "--model", "gpt-tiny", "--tokens", "1e6", "--device", "tpu"]) == 2
    assert main(["cost", "--plan", "--model", "gpt-tiny", "--tokens", "1e6", "--grid-intensity", "-3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(line.startswith("lmforge cost: error:") for line in err)
    assert "--tokens" in err[2] and "--device" in err[3] and "--grid-intensity" in err[4]
    with pytest.raises(ValueError, match="--region 'mars'"):
        PriceSettings.resolve("cpu", "mars")


def test_plan_estimate_from_a_probe(capsys):
    assert main(["cost", "--plan", "--model", "gpt-tiny", "--tokens", "1e5", "--override", "n_layers=1",
                 "--override", "d_model=32", "--override", "n_heads=2", "--seq-len", "16", "--batch-size", "2",
                 "--probe-steps", "1", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["flops_per_second"] > 0 and est["throughput_method"].startswith("measured")
    assert est["seconds"] == pytest.approx(est["total_flops"] / est["flops_per_second"])
    assert est["energy_kwh"] == pytest.approx(est["seconds"] * 65 / 3.6e6)


def test_price_tag_arithmetic_and_state():
    tag = PriceTag(PriceSettings.resolve("cuda", "us", power_watts=250, price_per_hour=2.0))
    tag.add(tokens=10, flops=100, seconds=3600.0, device_s=7200.0)  # two ranks, one hour
    r = tag.record()
    assert (r["device_s"], r["energy_kwh"], r["cost_usd"]) == (7200.0, 0.5, 4.0)
    assert r["co2e_kg"] == pytest.approx(0.5 * 370 / 1000)
    again = PriceTag(tag.settings)
    again.load_state_dict(json.loads(json.dumps(tag.state_dict())))
    assert again.record() == r


def test_rapl_counter_wraps(tmp_path):
    domain = tmp_path / "intel-rapl:0"
    (domain / "intel-rapl:0:0").mkdir(parents=True)  # a sub-domain: already inside the package, not added
    (domain / "max_energy_range_uj").write_text("1000000\n")
    (domain / "energy_uj").write_text("900000\n")
    (domain / "intel-rapl:0:0" / "energy_uj").write_text("5\n")
    meter = RaplMeter(tmp_path)
    (domain / "energy_uj").write_text("100000\n")  # wrapped: 0.1 J to the top, 0.1 J after
    assert math.isclose(meter.joules(), 0.2)


def test_a_model_without_a_formula_is_charged_the_counted_flops(tmp_path):
    """A custom loss (or ELECTRA, a biLSTM, PEFT): the first step's FlopCounterMode count per token, x tokens."""
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)
    data = [torch.randint(0, 50, (2, 9)) for _ in range(3)]
    cfg = TrainConfig(max_steps=3, lr=1e-3, eval_every=0, progress=False, tensorboard=False, precision="fp32")

    def loss(model, batch):
        return model(**batch)

    Trainer(model, build_objective("clm", pad_token_id=0), data, cfg, out=tmp_path, loss=loss).fit()
    tag = json.loads((tmp_path / "price_tag.json").read_text())
    assert tag["flops_method"].startswith("counted") and tag["flop_check"]["ratio"] is None
    assert tag["total_flops"] == 3 * tag["flop_check"]["counted"] > 0  # three steps of one shape


def test_nvml_meter_reads_the_total_energy_counter(monkeypatch):
    import types

    from lmforge.training.price_tag import NvmlMeter, open_meter

    readings = iter([5_000.0, 7_500.0])  # millijoules since the driver loaded
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
                                 nvmlDeviceGetTotalEnergyConsumption=lambda handle: next(readings))
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    meter = NvmlMeter(0)
    assert meter.joules() == 2.5 and meter.method.startswith("measured: NVML")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # not installed: estimated instead
    assert open_meter("cuda:0") is None


def test_pretrain_refuses_an_unknown_region_in_one_line(tmp_path, capsys):
    from test_training_pretrain import prepared, pretrain_args

    (tmp_path / "prepared").mkdir()
    data = prepared(tmp_path / "prepared", "gpt")
    assert main(pretrain_args("clm", data, tmp_path / "run", region="mars")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("lmforge pretrain: error: --region 'mars': unknown region")
    assert not (tmp_path / "run").exists()
