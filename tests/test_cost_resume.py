"""The price tag's cumulative FLOPs, tokens and seconds survive a SIGKILL and --resume without double counting."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from lmforge.cli.main import main
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401
from test_training_resume import _latest, _spawn, _wait_for


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_price_tag_survives_sigkill_and_resume(data_root, tmp_path):
    N = 4
    data = prepared(data_root, "gpt")

    def args(out: Path) -> list[str]:
        return pretrain_args("clm", data, out, max_steps=2 * N, save_every=N, eval_every=0, grad_accum=2)

    out = tmp_path / "killed"
    proc = _spawn(args(out))
    _wait_for(lambda: _latest(out) == f"step-{N:08d}", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "model").exists()
    before = {r["step"]: r for r in records(out)}
    assert main(args(out) + ["--resume"]) == 0

    got = records(out)
    assert [r["step"] for r in got] == list(range(1, 2 * N + 1))
    # FLOPs and tokens are exact: each step counted once, whatever happened in between (every step of this
    # run has the same shapes, so the same FLOPs)
    assert [r["total_tokens"] for r in got] == [sum(r["tokens"] for r in got[:i + 1]) for i in range(2 * N)]
    assert [r["total_flops"] for r in got] == [(i + 1) * got[0]["total_flops"] for i in range(2 * N)]
    # the seconds continue from the checkpoint's totals: they grow, and the resumed part adds no copy of the first
    for key in ("wall_s", "device_s", "energy_kwh", "co2e_kg", "cost_usd"):
        values = [r[key] for r in got]
        assert values == sorted(values) and values[0] > 0
    assert got[N - 1]["wall_s"] == before[N]["wall_s"]
    tag = json.loads((out / "price_tag.json").read_text())
    model_tag = json.loads((out / "model" / "price_tag.json").read_text())
    assert tag["total_flops"] == model_tag["total_flops"] == got[-1]["total_flops"]
    assert tag["device_s"] == got[-1]["device_s"]
    assert 0.95 < tag["flop_check"]["ratio"] < 1.05
