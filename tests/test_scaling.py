"""Scaling laws: `scaling fit` recovers a known L(N, D) from noisy synthetic losses, refuses a thin sweep, the
sweep grid keeps C = 6ND, and `plan` puts Chinchilla's own budget at ~70B parameters and ~1.4T tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lmforge.cli.main import main
from lmforge.cost.chinchilla import PUBLISHED, ScalingLaw

TRUE = ScalingLaw(E=1.8, A=400.0, B=600.0, alpha=0.34, beta=0.28)


def synthetic(folder, budgets=(1e18, 1e19, 1e20, 1e21, 1e22), sizes=7, noise=0.005, seed=1):
    """IsoFLOP rows around each budget's optimum from TRUE's L(N, D), with 0.5% multiplicative noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in budgets:
        n_opt, _ = TRUE.parametric_optimum(c)
        for f in np.geomspace(1 / 8, 8, sizes):
            n, d = n_opt * f, c / (6 * n_opt * f)
            rows.append({"n": n, "d": d, "c": c, "budget": c, "loss": TRUE.loss(n, d) * float(np.exp(rng.normal(0, noise)))})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_fit_recovers_known_coefficients(tmp_path, capsys):
    synthetic(tmp_path / "sweep")
    assert main(["scaling", "fit", str(tmp_path / "sweep"), "--bootstrap", "5", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    three, two = fit["approach3"], fit["approach2"]
    assert three["alpha"] == pytest.approx(TRUE.alpha, abs=0.03)
    assert three["beta"] == pytest.approx(TRUE.beta, abs=0.03)
    a_true = TRUE.beta / (TRUE.alpha + TRUE.beta)
    assert two["a"] == pytest.approx(a_true, abs=0.03) and two["b"] == pytest.approx(1 - a_true, abs=0.03)
    assert three["E"] == pytest.approx(TRUE.E, rel=0.05)
    low, high = fit["intervals"]["approach3.alpha"]
    assert low <= three["alpha"] <= high
    for b in two["budgets"]:  # tokens per parameter of the true optimum
        n, d = TRUE.parametric_optimum(b["c"])
        assert b["tokens_per_param"] == pytest.approx(d / n, rel=0.25)
    assert (tmp_path / "sweep" / "isoflop.png").stat().st_size > 0
    assert (tmp_path / "sweep" / "frontier.png").stat().st_size > 0
    # the fit is a law `plan` can use
    assert main(["plan", "--compute", "1e20", "--fit", str(tmp_path / "sweep" / "scaling_fit.json"), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["n_opt"] == pytest.approx(TRUE.parametric_optimum(1e20)[0], rel=0.25)
    assert "lmforge scaling fit" in planned["law"]


def test_fit_refuses_fewer_than_three_sizes_per_budget(tmp_path, capsys):
    rows = synthetic(tmp_path / "thin", budgets=(1e18, 1e19), sizes=3)
    (tmp_path / "thin" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    assert main(["scaling", "fit", str(tmp_path / "thin")]) == 2
    err = capsys.readouterr().err
    assert "at least 3 model sizes per budget" in err and "1e+18 FLOPs: 3" in err and "1e+19 FLOPs: 2" in err
    assert len(err.strip().splitlines()) == 1


def test_plan_reproduces_chinchilla(capsys):
    assert main(["plan", "--compute", "5.76e23", "--n", "175e9", "--d", "300e9", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_opt"] == pytest.approx(70e9, rel=0.25) and out["d_opt"] == pytest.approx(1.4e12, rel=0.25)
    assert "published" in out["law"]
    assert out["yours"]["loss"] > out["loss_opt"]  # GPT-3's allocation is worse than the optimum
    assert out["nearest_preset"]["name"] == "llama-1b"  # the largest dense decoder shipped; MoE only when asked
    # approach 3's own (rounded, published) optimum is smaller: why the planner takes approach 1's allocation
    n3, _ = PUBLISHED.parametric_optimum(5.76e23)
    assert n3 < 0.75 * 70e9


def test_plan_from_device_hours(capsys):
    assert main(["plan", "--budget-hours", "2", "--device", "cpu", "--flops-per-second", "1e10", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compute"] == 2 * 3600 * 1e10
    assert 6 * out["n_opt"] * out["d_opt"] == pytest.approx(out["compute"])


def test_plan_bad_input(capsys):
    assert main(["plan", "--compute", "0"]) == 2
    assert main(["plan", "--budget-hours", "-1"]) == 2
    assert main(["plan", "--budget-hours", "1", "--device", "tpu", "--flops-per-second", "1e9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert ["--compute" in err[0], "--budget-hours" in err[1], "--device" in err[2]] == [True] * 3


def test_sweep_grid(tmp_path, capsys):
    import yaml

    from lmforge.cost.sweep import sweep_cells

    out = tmp_path / "sweep"
    assert main(["scaling", "sweep", "--dry-run", "--smallest-budget", "3e11", "--budgets", "2", "--sizes", "3",
                 "--out", str(out)]) == 0
    grid = yaml.safe_load((out / "sweep.yaml").read_text())
    assert grid["command"] == "pretrain" and [a["name"] for a in grid["axes"]] == ["cell"]
    cells = sweep_cells(grid)
    assert len(cells) == 6 and sorted({c["budget"] for c in cells}) == [3e11, 6e11]
    for cell in cells:
        assert 6 * cell["n"] * cell["d"] == pytest.approx(cell["budget"], rel=0.2)
        assert cell["steps"] * 8 * 64 == cell["d"]
    assert [c["steps"] for c in cells] == sorted((c["steps"] for c in cells), reverse=True)  # longest first
    sizes = sorted(c["n"] for c in cells if c["budget"] == 3e11)
    assert sizes[-1] > 2 * sizes[0]
    # a budget too small for one step of the smallest model, or a bad size: one line naming the option
    assert main(["scaling", "sweep", "--dry-run", "--smallest-budget", "1e6", "--out", str(out)]) == 2
    assert main(["scaling", "sweep", "--dry-run", "--sizes", "2", "--out", str(out)]) == 2
    assert main(["scaling", "sweep", "--dry-run", "--smallest-budget", "-5", "--out", str(out)]) == 2
    assert main(["scaling", "sweep", "--dry-run", "--smallest-budget", "1e11", "--out", str(out)]) == 2
    assert main(["scaling", "sweep", "--out", str(out)]) == 2  # running needs data
    assert main(["scaling", "sweep", "--out", str(out), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--budgets" in err[0] and "less than one step" in err[0]
    assert "--sizes" in err[1] and "--smallest-budget" in err[2]
    assert "--sizes" in err[3] and "round to the same" in err[3] and "--data" in err[4]
    assert "--workers 0" in err[5] and len(err) == 6


def test_a_microscopic_sweep_runs_on_the_experiment_runner_resumes_and_fits(tmp_path, capsys):
    """1 budget x 3 sizes (888 to 3,312 parameters, 29 to 117 steps) on bundled Austen, end to end."""
    from test_training_pretrain import prepared

    from lmforge.cost.report import tag_line

    data = prepared(tmp_path, "gpt")
    out = tmp_path / "sweep"
    args = ["scaling", "sweep", "--smallest-budget", "2.7e8", "--budgets", "1", "--sizes", "3", "--head-dim", "4",
            "--lr", "1e-2", "--data", str(data), "--out", str(out), "--workers", "2", "--threads", "1"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and {r["status"] for r in rows} == {"ok"}
    for row in rows:  # what the fit needs: non-embedding N, tokens, FLOPs, the final validation loss, the budget
        assert row["params"] == row["labels"]["n"] and row["tokens"] == row["labels"]["d"]
        assert row["labels"]["budget"] == 2.7e8 and row["flops"] > row["labels"]["budget"]  # + attention, vocab
        assert row["metrics"]["eval_loss"] > 0
    assert sorted(r["params"] for r in rows) == [888, 1908, 3312]
    # the experiment report carries each cell's price tag, read from its run's price_tag.json
    table = (out / "table.md").read_text()
    for row in rows:
        tag = json.loads((out / row["run"] / "pretrain" / "price_tag.json").read_text())
        assert tag["total_flops"] == row["flops"]  # the runner's count per step x steps, and the Trainer's agree
        assert f"- {row['cell']}: {tag_line(tag)}" in table
    total = sum(json.loads(p.read_text())["total_flops"] for p in out.glob("cells/*/seed-0/pretrain/price_tag.json"))
    assert f"- total: {total:.3g} FLOPs" in table and "<h2>Price tags</h2>" in (out / "report.html").read_text()
    capsys.readouterr()
    # rerunning the same command resumes: nothing runs again
    done = {p: p.stat().st_mtime_ns for p in out.rglob("result.json")}
    assert main(args) == 0
    assert "3 already done" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in out.rglob("result.json")} == done
    # the same folder with another sweep is refused in one line, before anything is written
    assert main([*args[:-4], "--lr", "1e-3", "--workers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differs from the grid" in err[0]
    assert main(["scaling", "fit", str(out), "--bootstrap", "3", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["rows"] == 3 and [b["c"] for b in fitted["approach2"]["budgets"]] == [2.7e8]
    assert (out / "isoflop.png").stat().st_size > 0 and (out / "frontier.png").stat().st_size > 0


def test_run_folders_are_read_as_results(tmp_path):
    from lmforge.cost.scaling_report import read_results
    from lmforge.cost.shapes import non_embedding_parameters
    from lmforge.checkpoint import read_config
    from test_cost_cli import tiny_run

    tag = tiny_run(tmp_path / "sweep" / "cells" / "a")
    (tmp_path / "sweep" / "cells" / "a" / "cell.json").write_text(json.dumps({"budget": 1e9}))
    (row,) = read_results(tmp_path / "sweep")
    cfg = read_config(tmp_path / "sweep" / "cells" / "a" / "model")
    assert row["n"] == non_embedding_parameters(cfg) and row["d"] == tag["total_tokens"]
    assert row["c"] == tag["total_flops"] and row["budget"] == 1e9 and row["loss"] > 0


def test_a_vertex_outside_the_sizes_measured_is_flagged(tmp_path, capsys):
    from lmforge.cost.scaling_fit import approach2

    def profile(c, low, high):
        n_opt, _ = TRUE.parametric_optimum(c)
        return [{"n": n, "d": c / (6 * n), "c": c, "loss": TRUE.loss(n, c / (6 * n))}
                for n in n_opt * np.geomspace(low, high, 5)]

    right, around = profile(1e19, 4, 64), profile(1e20, 1 / 4, 4)
    (fitted,) = approach2(right)["budgets"]
    assert not fitted["inside"] and fitted["n_opt"] < right[0]["n"]  # the loss only rises: the vertex lies left
    assert fitted["n_best"] == right[0]["n"] and fitted["loss_best"] == right[0]["loss"]
    assert approach2(around)["budgets"][0]["inside"]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in right + around))
    assert main(["scaling", "fit", str(tmp_path), "--bootstrap", "0"]) == 0
    flagged = [line for line in capsys.readouterr().out.splitlines() if "outside the sizes measured" in line]
    assert len(flagged) == 1 and flagged[0].startswith("budget 1e+19: the vertex")
