"""`lmforge experiment run/report`: a grid file becomes a measured table, and the runner survives kills and failures.

Every cell trains a 1-layer, d_model 32 decoder for 20 steps on prepared Austen shards, in a child process. The
exact comparisons fix the thread count (``--threads 1``): a different count may reorder float sums.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from experiment_helpers import (
    LR_AXIS,
    POSITION_AXIS,
    TINY,
    comparable,
    grid_text,
    rows,
    run_cli,
    tree_state,
    write_grid,
)
from test_training_pretrain import prepared

from lmforge.cli.main import main
from lmforge.experiments.backends import threads_per_cell
from lmforge.experiments.grid import load_grid

EXAMPLES = Path(__file__).resolve().parents[1] / "experiments"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return prepared(tmp_path_factory.mktemp("experiment-data"), "gpt")


@pytest.fixture(scope="module")
def small(data, tmp_path_factory) -> Path:
    """Two cells (rope, alibi) x one seed, run uninterrupted with one worker and one thread: the reference."""
    root = tmp_path_factory.mktemp("small")
    grid = write_grid(root, grid_text(data, [POSITION_AXIS], seeds=[0]))
    assert run_cli(grid, "--out", root / "out", "--threads", "1") == 0
    return grid


def test_a_2x2_grid_with_2_seeds_gives_8_rows_and_a_table_of_their_means(data, tmp_path, capsys):
    grid = write_grid(tmp_path, grid_text(data, [POSITION_AXIS, LR_AXIS]))
    out = tmp_path / "out"
    assert run_cli(grid, "--out", out, "--workers", "2") == 0
    results = rows(out)
    assert len(results) == 8 and {r["status"] for r in results} == {"ok"}
    assert [(r["cell"], r["seed"]) for r in results][:3] == [("pos=rope,lr=low", 0), ("pos=rope,lr=low", 1),
                                                            ("pos=rope,lr=high", 0)]
    first = results[0]
    assert first["steps"] == 20 and first["tokens"] == 20 * 2 * 32 and first["threads"] == threads_per_cell(2)
    assert first["flops"] > 0 and first["seconds"] > 0 and first["axes"] == {"pos": "rope", "lr": "low"}
    assert first["settings"]["pretrain"]["lr"] == 1e-3 and first["settings"]["pretrain"]["overrides"]["position"] \
        == "rope"
    # each row is its run folder's own last evaluation
    metrics = [json.loads(line) for line in (out / first["run"] / "pretrain/metrics.jsonl").read_text().splitlines()]
    assert first["metrics"]["eval_loss"] == [m for m in metrics if "eval_loss" in m][-1]["eval_loss"]
    table = list(csv.DictReader((out / "table.csv").open()))
    assert [t["cell"] for t in table] == ["pos=rope,lr=low", "pos=rope,lr=high", "pos=alibi,lr=low",
                                          "pos=alibi,lr=high"]
    for entry in table:
        for metric in ("eval_loss", "eval_ppl"):
            values = [r["metrics"][metric] for r in results if r["cell"] == entry["cell"]]
            assert float(entry[f"{metric}_mean"]) == statistics.fmean(values)
            assert float(entry[f"{metric}_std"]) == statistics.stdev(values)
            assert entry[f"{metric}_n"] == "2"
    best = min(table, key=lambda t: float(t["eval_loss_mean"]))
    assert "eval_loss" in best["best"].split(";")
    assert sum("eval_loss" in t["best"].split(";") for t in table) == 1
    md = [line for line in (out / "table.md").read_text().splitlines() if line.startswith("| pos=")]
    for metric, column in (("eval_loss", 4), ("eval_ppl", 5)):  # the best cell's value, and only its, in bold
        best = min(table, key=lambda t: float(t[f"{metric}_mean"]))["cell"]
        assert [line.split(" | ")[0][2:] for line in md if line.split(" | ")[column].startswith("**")] == [best]
    for metric in ("eval_loss", "eval_ppl"):
        assert (out / "plots" / f"{metric}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "http" not in html.replace("http-equiv", "")
    assert (out / "grid.yaml").read_text() == grid.read_text()
    # `report` rewrites the same table from results.jsonl
    before = (out / "table.csv").read_text()
    (out / "table.csv").unlink()
    assert main(["experiment", "report", str(out)]) == 0
    assert (out / "table.csv").read_text() == before


def test_sigkill_mid_grid_then_rerun_skips_finished_cells_and_matches_an_uninterrupted_run(small, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    runner = subprocess.Popen([sys.executable, "-m", "lmforge.cli.main", "experiment", "run", str(small), "--out",
                               str(out), "--threads", "1"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    finished, interrupted = [], None
    deadline = time.time() + 300
    try:
        # Kill it once a run has finished and another one has a checkpoint but no result yet.
        while time.time() < deadline and runner.poll() is None:
            runs = sorted(out.glob("cells/*/seed-*"))
            finished = [r for r in runs if (r / "result.json").is_file()]
            started = [r for r in runs if not (r / "result.json").is_file()
                       and any((r / "pretrain/checkpoints").glob("step-*"))]
            if finished and started:
                runner.send_signal(signal.SIGKILL)
                interrupted = started[0]
                break
            time.sleep(0.01)
    finally:
        if runner.poll() is None and interrupted is None:
            runner.kill()
        runner.wait()
    assert interrupted is not None, "the runner finished before it could be killed mid-grid"
    time.sleep(0.5)  # the cell's process dies with the runner (its parent-death signal)
    kept = {run: tree_state(run) for run in finished}
    assert run_cli(small, "--out", out, "--threads", "1") == 0
    for run, state in kept.items():
        assert tree_state(run) == state, f"{run} was touched by the rerun"
    assert "resuming from the newest checkpoint" in (interrupted / "cell.log").read_text()
    assert comparable(out) == comparable(small.parent / "out")


def test_workers_2_gives_the_same_results_as_workers_1(small, tmp_path):
    out = tmp_path / "out"
    assert run_cli(small, "--out", out, "--threads", "1", "--workers", "2") == 0
    assert comparable(out) == comparable(small.parent / "out")


@pytest.mark.slow
def test_the_ray_backend_gives_the_same_results_as_the_local_one(small, tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'lmforge[ray]')")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        out = tmp_path / "out"
        assert run_cli(small, "--out", out, "--backend", "ray") == 0  # num_cpus 1 per cell: one thread
    finally:
        ray.shutdown()
    assert [r["threads"] for r in rows(out)] == [1, 1]
    assert comparable(out) == comparable(small.parent / "out")


def test_without_ray_the_ray_backend_says_how_to_install_it(small, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    assert run_cli(small, "--out", tmp_path / "out", "--backend", "ray") == 2
    assert "pip install 'lmforge[ray]'" in capsys.readouterr().err


def test_a_failing_cell_is_recorded_the_others_finish_and_retry_failed_reruns_it(data, tmp_path, capsys):
    late = tmp_path / "late-data"  # not prepared yet (a missing folder is refused before any cell runs):
    late.mkdir()                    # the cell fails when it reads its data
    axis = {"name": "data", "variants": [{"name": "good"}, {"name": "late", "data": str(late)}]}
    grid = write_grid(tmp_path, grid_text(data, [axis], seeds=[0]))
    out = tmp_path / "out"
    assert run_cli(grid, "--out", out, "--threads", "1") == 1
    good, bad = rows(out)
    assert good["status"] == "ok" and bad["status"] == "failed"
    assert str(late) in bad["error"] and bad["metrics"] == {"eval_loss": None, "eval_ppl": None}
    assert "data=late seed 0" in (out / "table.md").read_text()
    kept = tree_state(out / good["run"])
    # A plain rerun leaves the failed cell alone; --retry-failed runs it again.
    assert run_cli(grid, "--out", out, "--threads", "1") == 1
    shutil.copytree(data, late, dirs_exist_ok=True)
    assert run_cli(grid, "--out", out, "--threads", "1", "--retry-failed") == 0
    good_again, fixed = rows(out)
    assert tree_state(out / good["run"]) == kept
    assert fixed["status"] == "ok" and fixed["metrics"] == good["metrics"]  # the same data, seed and settings

    # A changed grid is refused unless --extend, which adds cells but never changes one.
    capsys.readouterr()
    extra = {**axis, "variants": [*axis["variants"], {"name": "lower-lr", "lr": 1e-3}]}
    grid.write_text(grid_text(data, [extra], seeds=[0]))
    assert run_cli(grid, "--out", out, "--threads", "1") == 2
    err = capsys.readouterr().err
    assert "differs from the grid" in err and "--extend" in err and str(grid) in err
    assert run_cli(grid, "--out", out, "--threads", "1", "--extend") == 0
    assert [r["cell"] for r in rows(out)] == ["data=good", "data=late", "data=lower-lr"]
    assert tree_state(out / good["run"]) == kept
    changed = {**extra, "variants": [{"name": "good", "lr": 1e-3}, *extra["variants"][1:]]}
    grid.write_text(grid_text(data, [changed], seeds=[0]))
    assert run_cli(grid, "--out", out, "--extend") == 2
    assert "cell data=good: --extend cannot change an existing cell's settings (lr changed)" in capsys.readouterr().err


BAD = {
    "an unknown axis field": ({"axes": [{"name": "lr", "variants": [{"lrr": 0.1}]}]},
                              "cell lr=0.1: unknown setting 'lrr' (did you mean 'lr'?)"),
    "an override ModelConfig refuses": ({"axes": [{"name": "pos", "variants": [{"overrides": {"position": "sinus"}}]}]},
                                        "cell pos=sinus: overrides: ", "position"),
    "an unknown model field": ({"axes": [{"name": "w", "variants": [{"overrides": {"widthh": 3}}]}]},
                               "cell w=3: overrides: ", "widthh"),
    "an unknown metric": ({"metrics": ["eval_loss", "eval_bleu"]}, "metrics: unknown metric 'eval_bleu'"),
    "a method that does not exist yet": ({"axes": [{"name": "obj", "variants": [{"objective": "tlm"}]}]},
                                         "cell obj=tlm: objective='tlm': ", "does not exist yet"),
    "an objective that does not fit": ({"axes": [{"name": "obj", "variants": [{"objective": "mlm"}]}]},
                                       "cell obj=mlm: objective: ", "arch='decoder'"),
    "an unknown objective option": ({"axes": [{"name": "o", "variants": [{"objective_options": {"p": 1}}]}]},
                                    "cell o=1: objective_options: 'clm' has no option 'p'"),
    "an unknown grid field": ({"axis": []}, "unknown grid field(s) axis (did you mean 'axes'?)"),
    "a seconds budget": ({"budget": {"seconds": 60}}, "budget: seconds is not supported", "steps, tokens or flops"),
    "a variant's bad budget": ({"axes": [{"name": "b", "variants": [{"name": "x", "budget": {"steps": 0}}]}]},
                               "cell b=x: budget: ", "steps=0 must be > 0"),
    "a variant's bad labels": ({"axes": [{"name": "l", "variants": [{"name": "x", "labels": {"n": [1]}}]}]},
                               "cell l=x: labels: expected a mapping of names to numbers or strings"),
    "an unknown command": ({"command": "distill"}, "command='distill' is not a grid command; supported: pretrain"),
    "finetune metrics without a finetune stage": ({"metrics": ["finetune_accuracy"]}, "unknown metric"),
    "a bad finetune stage": ({"finetune": {"task": "classify", "train": "rt-sentiment:train", "lrr": 1}},
                             "cell base: finetune: unknown fine-tuning setting(s) 'lrr'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_grid_is_one_line_naming_file_cell_and_field(case, data, tmp_path, capsys):
    change, *expected = BAD[case]
    grid_data = {**yaml.safe_load(grid_text(data, [])), **change}
    grid = write_grid(tmp_path, yaml.safe_dump(grid_data, sort_keys=False))
    out = tmp_path / "out"
    assert run_cli(grid, "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"lmforge experiment: error: {grid}: "), err
    for text in expected:
        assert text in err, err
    assert not out.exists()  # refused before anything was written


def test_budgets_convert_to_steps_per_cell(data, tmp_path):
    axis = {"name": "bs", "variants": [{"batch_size": 2}, {"batch_size": 4}]}
    tokens = load_grid(write_grid(tmp_path, grid_text(data, [axis], budget={"tokens": 12800})))
    assert [c.steps for c in tokens.cells] == [200, 100]  # 12800 / (batch x 32 tokens)
    assert [c.tokens_per_step * c.steps for c in tokens.cells] == [12800, 12800]
    flops = load_grid(write_grid(tmp_path, grid_text(data, [axis], budget={"flops": 1e9})))
    per_step = flops.cells[0].flops_per_step
    assert flops.cells[0].steps == int(1e9 // per_step) and flops.cells[1].flops_per_step == 2 * per_step
    # a variant's own budget replaces the grid's, which may then be left out; labels and N go to the rows
    own = {"name": "n", "variants": [{"name": "a", "budget": {"steps": 7}, "labels": {"budget": 1e9}},
                                     {"name": "b", "budget": {"steps": 9}, "warmup": 8,
                                      "overrides": {"d_model": 64, "n_heads": 4}}]}
    grid = yaml.safe_load(grid_text(data, [own]))
    del grid["budget"]
    cells = load_grid(write_grid(tmp_path, yaml.safe_dump(grid))).cells
    assert [c.steps for c in cells] == [7, 9] and [c.labels for c in cells] == [{"budget": 1e9}, {}]
    # N: 4d^2 attention + 2 d x d_ff feed-forward weights, their biases and two layer norms; the final norm
    def n(d, ff):
        return 4 * d * d + 4 * d + 2 * d * ff + d + ff + 2 * 2 * d + 2 * d

    assert [c.params for c in cells] == [n(32, 64), n(64, 64)]


def test_sizes_replace_fields(data, tmp_path):
    grid = write_grid(tmp_path, grid_text(data, [POSITION_AXIS], sizes={"small": {"budget": {"steps": 5},
                                                                                  "seeds": [3]}}))
    small = load_grid(grid, "small")
    assert small.seeds == [3] and [c.steps for c in small.cells] == [5, 5]
    with pytest.raises(Exception, match="no size 'huge'; the grid's sizes: small"):
        load_grid(grid, "huge")


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_example_grids_are_valid(example, capsys):
    assert main(["experiment", "run", str(example), "--size", "small", "--dry-run"]) == 0
    listing = capsys.readouterr().out
    assert listing.startswith(str(example)) and "cell(s)" in listing
    assert main(["experiment", "run", str(example), "--dry-run"]) == 0


def test_a_grid_naming_a_missing_method_is_refused_until_it_exists(tmp_path, capsys):
    text = (EXAMPLES / "bert_ablations.yaml").read_text()
    grid = yaml.safe_load(text)
    grid["axes"][0]["variants"].append({"name": "tlm", "objective": "tlm"})  # XLM's translation LM: not in lmforge
    path = write_grid(tmp_path, yaml.safe_dump(grid, sort_keys=False))
    assert main(["experiment", "run", str(path), "--dry-run"]) == 2
    assert "does not exist yet" in capsys.readouterr().err


def test_a_chained_cell_pretrains_then_finetunes_its_own_model(data, tmp_path):
    from lmforge.tasks.data import read_table

    table = tmp_path / "sentiment.tsv"
    rows_ = read_table("rt-sentiment:train").rows[:48]
    table.write_text("text\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows_))
    axis = {"name": "tune", "variants": [{"name": "full"}, {"name": "lora", "finetune": {"peft": {"method": "lora",
                                                                                                    "r": 4}}}]}
    stage = {"task": "classify", "train": str(table), "eval": str(table), "max_length": 32, "batch_size": 8,
             "max_steps": 4, "lr": 1e-3, "precision": "fp32", "device": "cpu"}
    grid = write_grid(tmp_path, grid_text(data, [axis], seeds=[0], finetune=stage,
                                          metrics=["eval_loss", "finetune_accuracy", "finetune_loss"]))
    out = tmp_path / "out"
    assert run_cli(grid, "--out", out, "--workers", "2") == 0
    full, lora = rows(out)
    for row in (full, lora):
        run = out / row["run"]
        settings = yaml.safe_load((run / "finetune/finetune.yaml").read_text())
        assert settings["model"] == str(run / "pretrain/model") and settings["trainer"]["seed"] == 0
        evaluation = [json.loads(line) for line in (run / "finetune/metrics.jsonl").read_text().splitlines()][-1]
        assert row["metrics"]["finetune_accuracy"] == evaluation["eval_accuracy"]
        assert row["metrics"]["finetune_loss"] == evaluation["eval_loss"]
        assert row["steps"] == 20 and row["tokens"] == 20 * 2 * 32  # the budget's stage: pre-training
    # the same pre-training (same settings and seed) under both fine-tuning variants
    assert full["metrics"]["eval_loss"] == lora["metrics"]["eval_loss"]
    assert yaml.safe_load((out / lora["run"] / "finetune/finetune.yaml").read_text())["peft"]["method"] == "lora"
    assert full["settings"]["finetune"]["peft"] is None


def test_a_grid_that_is_not_yaml_is_one_line(tmp_path, capsys):
    grid = write_grid(tmp_path, "command: [pretrain\n")
    assert main(["experiment", "run", str(grid), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"lmforge experiment: error: {grid}: not valid YAML: expected ',' or ']', but got '<stream end>' " \
                  "at line 2, column 1"
    assert not (tmp_path / "out").exists()


def test_variants_may_ask_for_their_own_resources(data, tmp_path, capsys):
    axis = {"name": "size", "variants": [{"name": "small"}, {"name": "big", "resources": {"num_gpus": 1}}]}
    grid = load_grid(write_grid(tmp_path, grid_text(data, [axis], resources={"num_cpus": 2})))
    assert [(c.resources.num_cpus, c.resources.num_gpus) for c in grid.cells] == [(2, 0), (2, 1)]
    assert "resources" not in grid.cells[1].stages["pretrain"]
    axis["variants"][1]["resources"] = {"num_gpu": 1}
    path = write_grid(tmp_path, grid_text(data, [axis]))
    assert main(["experiment", "run", str(path), "--dry-run"]) == 2
    assert f"{path}: cell size=big: resources: unknown resources field(s) num_gpu (did you mean 'num_gpus'?)" \
        in capsys.readouterr().err


def test_a_flops_budget_pays_for_electras_generator_too():
    from lmforge.config import resolve_config
    from lmforge.experiments.grid import _train_flops
    from lmforge.models.electra import ElectraPretrainer
    from lmforge.training.config import TrainConfig

    cfg = resolve_config("bert-tiny").replace(n_layers=2, d_model=64, n_heads=4, d_ff=128, vocab_size=500)
    settings = {"model": "bert-tiny", "data": "d", "objective_options": {"generator_size": 0.5}}
    electra, params = _train_flops(cfg, 32, TrainConfig.from_dict({**settings, "objective": "electra"}))
    pair = ElectraPretrainer.from_config(cfg, generator_size=0.5)
    # the generator's vocabulary projection (tied: 500 x 64) runs on the 15% masked positions only
    disc, gen = pair.discriminator.train_flops(32), pair.generator.train_flops(32)
    assert electra == disc + gen - round(6 * 500 * 64 * 32 * 0.85)
    assert disc < electra < 2 * disc  # a half-width generator: its layers cost about a quarter of the model's
    assert params == pair.discriminator.num_parameters(True)


def test_electras_planned_flops_match_what_flopcountermode_counts_in_a_step():
    # The price tag charges ELECTRA the FlopCounterMode count of a real step; a FLOPs budget planned with
    # _train_flops must agree with it, or ELECTRA's cells get less (or more) compute than the others.
    from lmforge.config import resolve_config
    from lmforge.experiments.grid import _train_flops
    from lmforge.models.electra import ElectraPretrainer
    from lmforge.objectives import build_objective
    from lmforge.training.config import TrainConfig
    from lmforge.training.price_tag import counted_flops

    torch.manual_seed(0)
    cfg = resolve_config("bert-tiny").replace(n_layers=2, d_model=64, n_heads=4, d_ff=256, vocab_size=2000,
                                              max_seq_len=64)
    settings = {"model": "bert-tiny", "data": "d", "objective": "electra",
                "objective_options": {"generator_size": 0.25}}
    planned, _ = _train_flops(cfg, 64, TrainConfig.from_dict(settings))
    pair = ElectraPretrainer.from_config(cfg, generator_size=0.25)
    objective = build_objective("electra", generator_size=0.25, mask_token_id=3, pad_token_id=0, vocab_size=2000,
                                special_token_ids=[0, 1, 2, 3], seed=0)
    batch = objective([torch.randint(5, 2000, (64,)).tolist() for _ in range(32)])
    with counted_flops() as counter:
        pair(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}).loss.backward()
    masked = (batch["labels"] != -100).float().mean().item()
    assert 0.12 < masked < 0.18
    assert counter.get_total_flops() / 32 == pytest.approx(planned, rel=0.05)


def test_the_permuted_lms_planned_flops_count_both_streams():
    # XLNet's two streams double the rows the stack runs; the price tag counts a real step with FlopCounterMode.
    from lmforge.config import resolve_config
    from lmforge.experiments.grid import _train_flops
    from lmforge.models.transformer import Transformer
    from lmforge.models.two_stream import TwoStreamLM
    from lmforge.objectives import build_objective
    from lmforge.training.config import TrainConfig
    from lmforge.training.price_tag import counted_flops

    torch.manual_seed(0)
    cfg = resolve_config("bert-tiny").replace(n_layers=2, d_model=128, n_heads=4, d_ff=512, vocab_size=2000,
                                              max_seq_len=64)
    planned, _ = _train_flops(cfg, 64, TrainConfig.from_dict({"model": "bert-tiny", "data": "d",
                                                              "objective": "permuted-lm"}))
    model = TwoStreamLM(Transformer(cfg))
    batch = build_objective("permuted-lm", pad_token_id=0, seed=0)([torch.randint(5, 2000, (64,)).tolist()
                                                                    for _ in range(8)])
    with counted_flops() as counter:
        model(**batch).loss.backward()
    # within 5%: the analytic 6N also charges biases and norms, and the MLM head's transform on every row
    assert counter.get_total_flops() / 8 == pytest.approx(planned, rel=0.05)


def test_a_flops_budget_counts_each_objectives_real_batches(data, tmp_path):
    # A causal LM labels every position, so its counted step equals the analytic count; a prefix LM labels the
    # target half only (only labelled rows reach the vocabulary), so the same budget buys it more steps.
    import torch

    from lmforge.models import Transformer
    from lmforge.training.config import TrainConfig
    from lmforge.training.pretrain import load_tokenizer, model_config_for
    from lmforge.training.price_tag import batch_flops

    axis = {"name": "obj", "variants": [{"name": "clm"}, {"name": "prefix", "objective": "prefix-lm"}]}
    clm, prefix = load_grid(write_grid(tmp_path, grid_text(data, [axis], budget={"flops": 1e10}))).cells
    tokenizer = load_tokenizer(TrainConfig.from_dict({"model": "gpt-tiny", "objective": "clm", "data": str(data)}))
    model = Transformer(model_config_for("gpt-tiny", tokenizer, dict(TINY)))
    assert clm.flops_per_step == 2 * model.train_flops(32)  # batch 2 x seq_len 32, every position labelled
    ids = torch.zeros(2, 32, dtype=torch.long)
    assert batch_flops(model, {"input_ids": ids, "labels": ids}, 0) < prefix.flops_per_step  # no row labelled
    assert prefix.flops_per_step < clm.flops_per_step and prefix.steps > clm.steps
    assert clm.steps == int(1e10 // clm.flops_per_step) and prefix.steps == int(1e10 // prefix.flops_per_step)
