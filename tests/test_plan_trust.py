"""`lmforge plan` a user can trust: D beside the tokens of --data, the median of several throughput probes with
their spread, --from a finished run's measured FLOP/s; `lmforge cost` bills CPU seconds and reads old tags."""

from __future__ import annotations

import json

import pytest

from lmforge.cli.main import main
from lmforge.cost.chinchilla import CHINCHILLA_C, CHINCHILLA_N, PUBLISHED


def manifest_folder(path, tokens: int, complete: bool = True):
    (path / "train").mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({
        "format": "lmforge-shards", "complete": complete, "chunks": [],
        "splits": {"train": {"tokens": tokens, "documents": 3}, "val": {"tokens": 10, "documents": 1}}}))
    return path


def plan_json(capsys, *args) -> tuple[dict, list[str]]:
    assert main(["plan", *args, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err.strip().splitlines()


def test_data_smaller_than_the_plan_warns_with_epochs_and_the_plan_at_its_size(tmp_path, capsys):
    data = manifest_folder(tmp_path / "data", 288_000)
    out, err = plan_json(capsys, "--compute", "1e15", "--data", str(data))
    d_opt = out["d_opt"]
    assert out["data"]["tokens"] == 288_000 and out["data"]["epochs"] == pytest.approx(d_opt / 288_000)
    # by hand: N = n0 (C/c0)^0.5 and D = C / 6N, so the budget whose D is the data's is C = (6 n0 D)^2 / c0
    c_data = (6 * CHINCHILLA_N * 288_000) ** 2 / CHINCHILLA_C
    at = out["data"]["at_data_size"]
    assert at["compute"] == pytest.approx(c_data, rel=1e-6)
    assert at["n_opt"] == pytest.approx(c_data / (6 * 288_000), rel=1e-6)
    line = [w for w in err if "epochs" in w]
    assert len(line) == 1 and "holds 288k" in line[0] and f"{d_opt / 288_000:,.0f} epochs" in line[0]
    assert "compute-optimal model is N = " in line[0] and at["nearest_preset"]["name"] in line[0]
    # enough data: no warning, the epochs are still reported
    big = manifest_folder(tmp_path / "big", 10**9)
    out, err = plan_json(capsys, "--compute", "1e15", "--data", str(big))
    assert out["data"]["epochs"] < 1 and not [w for w in err if "epochs" in w]


def test_raw_text_is_counted_with_the_tokenizer_as_data_prepare_counts_it(tmp_path, capsys):
    from lmforge.data.prepare import prepare
    from lmforge.tokenization import train_tokenizer

    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"Document {i} is short and plain.\n\n" for i in range(60)))
    tok = train_tokenizer([text], vocab_size=300, family="gpt", show_progress=False)
    tok.save(tmp_path / "tok")
    prepared = prepare([text], tok, tmp_path / "data", val_fraction=0.0, progress=False)
    out, _ = plan_json(capsys, "--compute", "1e12", "--data", str(text), "--tokenizer", str(tmp_path / "tok"))
    assert out["data"]["tokens"] == prepared["splits"]["train"]["tokens"] > 0
    out, _ = plan_json(capsys, "--compute", "1e12", "--data", str(tmp_path / "data"))
    assert out["data"]["tokens"] == prepared["splits"]["train"]["tokens"]


def test_bad_data_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "text.txt").write_text("some words\n")
    manifest_folder(tmp_path / "half", 100, complete=False)
    manifest_folder(tmp_path / "none", 0)
    cases = [tmp_path / "missing", tmp_path / "empty", tmp_path / "text.txt", tmp_path / "half", tmp_path / "none"]
    for path in cases:
        assert main(["plan", "--compute", "1e15", "--data", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(cases) and all(line.startswith("lmforge plan: error: --data") for line in err)
    assert "--tokenizer" in err[2] and "incomplete" in err[3] and "no training tokens" in err[4]


def test_throughput_is_the_median_of_the_probes_with_their_spread(monkeypatch, capsys):
    import lmforge.cost.estimate as estimate

    rates = iter([4e9, 1e9, 3e9, 100e9, 2e9])  # one probe slowed, one sped up by the neighbours
    calls = []

    def fake(model, device, batch_size, seq_len, steps=3, warmup=True):
        calls.append(warmup)
        return next(rates)

    monkeypatch.setattr(estimate, "probe_throughput", fake)
    out, _ = plan_json(capsys, "--budget-hours", "1", "--device", "cpu")
    assert calls == [True, False, False, False, False]  # only the first probe warms up
    assert out["compute"] == pytest.approx(3600 * 3e9)
    assert (out["throughput"]["median"], out["throughput"]["min"], out["throughput"]["max"]) == (3e9, 1e9, 1e11)
    assert "median of 5 probes" in out["compute_from"] and "spread 1e+09-1e+11" in out["compute_from"]
    assert main(["plan", "--budget-hours", "1", "--probes", "0"]) == 2


def price_tag_folder(path, **tag):
    path.mkdir(parents=True)
    (path / "price_tag.json").write_text(json.dumps(tag))
    return path


def test_from_a_run_reads_its_measured_flops_per_second(tmp_path, capsys):
    run = price_tag_folder(tmp_path / "run", total_flops=3.6e13, device_s=100.0, wall_s=200.0, cpu_s=100.0,
                           settings={"device": "cpu"})
    out, _ = plan_json(capsys, "--budget-hours", "2", "--from", str(run))
    assert out["compute"] == pytest.approx(2 * 3600 * 3.6e11)  # 3.6e13 FLOPs / 100 device-s
    assert "CPU seconds / threads" in out["compute_from"] and "throughput" not in out
    gpu = price_tag_folder(tmp_path / "gpu", total_flops=1e15, device_s=10.0, settings={"device": "cuda"})
    out, _ = plan_json(capsys, "--budget-hours", "1", "--from", str(gpu))
    assert out["compute"] == pytest.approx(3600 * 1e14) and "wall seconds" in out["compute_from"]
    (tmp_path / "bare").mkdir()
    bad = [["--budget-hours", "1", "--from", str(tmp_path / "bare")],
           ["--budget-hours", "1", "--from", str(tmp_path / "missing")],
           ["--budget-hours", "1", "--from", str(gpu), "--device", "cpu"],
           ["--budget-hours", "1", "--from", str(run), "--flops-per-second", "1e9"],
           ["--compute", "1e15", "--from", str(run)]]
    for args in bad:
        assert main(["plan", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(bad) and "no price_tag.json" in err[0] and "ran on cuda" in err[2]


def test_from_a_real_run(tmp_path, capsys):
    from test_cost_cli import tiny_run

    tag = tiny_run(tmp_path / "run")
    assert tag["cpu_s"] > 0 and tag["cpu_threads"] >= 1 and tag["device_time"].startswith("cpu: process CPU")
    out, _ = plan_json(capsys, "--budget-hours", "1", "--from", str(tmp_path / "run"))
    assert out["compute"] == pytest.approx(3600 * tag["total_flops"] / tag["device_s"])


def test_cost_bills_cpu_seconds_and_reads_an_old_tag(tmp_path, capsys):
    new = price_tag_folder(tmp_path / "new", total_flops=1e12, total_tokens=10, wall_s=40.0, device_s=10.0,
                           cpu_s=10.0, cpu_threads=1, energy_kwh=10 * 65 / 3.6e6, energy_method="estimated",
                           settings={"device": "cpu", "region": "world"})
    assert main(["cost", str(new)]) == 0
    text = capsys.readouterr().out
    assert "10.0 CPU-s, beside 40.0 s of wall time" in text
    assert "billed: CPU seconds / threads (1), not wall time; the run had its cores 25% of the wall time" in text
    old = price_tag_folder(tmp_path / "old", total_flops=1e12, total_tokens=10, wall_s=40.0, device_s=40.0,
                           energy_kwh=40 * 65 / 3.6e6, energy_method="estimated",
                           settings={"device": "cpu", "region": "world", "price_per_hour": 0.05})
    assert main(["cost", str(old), "--json"]) == 0
    tag = json.loads(capsys.readouterr().out)
    assert tag["cpu_s"] == 40.0 and tag["cost_usd"] == pytest.approx(40 / 3600 * 0.05)
    assert tag["billing"] == "billed: wall time (1 price tag from before CPU seconds were recorded)"


def test_compute_for_tokens_inverts_the_optimum():
    for tokens in (1e5, 3e8, 1.4e12):
        assert PUBLISHED.optimum(PUBLISHED.compute_for_tokens(tokens))[1] == pytest.approx(tokens, rel=1e-9)
