"""`lmforge bench`: runs benchmark scripts in subprocesses, reads their last JSON line, prints one table.

The benchmark scripts here are fakes written into tmp_path that print a few lines and a JSON line in the
format of the real ones, so these tests take a second and measure nothing.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from lmforge.cli import bench
from lmforge.cli.main import main

RESULTS = {
    "train_step": {"benchmark": "train_step", "device": "cpu", "peak_gflops": 400.0, "results": [
        {"family": "gpt", "mode": "eager", "hf_mode": "eager", "lmforge_tok_s": 2890.0, "hf_tok_s": 2541.0,
         "ratio": 1.137, "lmforge_mfu": 0.6, "hf_mfu": 0.5}]},
    "generate": {"benchmark": "generate", "device": "cpu", "results": [
        {"batch": 1, "new_tokens": 32, "hf_tok_s": 100.0, "lmforge_tok_s": 132.0, "ratio": 1.32, "identical": True},
        {"batch": 8, "new_tokens": 32, "hf_tok_s": 400.0, "lmforge_tok_s": 700.0, "ratio": 1.75, "identical": False}]},
    "data_pipeline": {"benchmark": "data_pipeline", "mb": 5.0, "raw_mb_s": 10.0, "raw_fast_mb_s": 11.0,
                      "prepare_mb_s": 9.5, "prepare_over_raw": 0.95, "prepare_over_raw_fast": 0.86,
                      "loader_tokens_s": 2.5e7, "loader_target_tokens_s": 100000},
    "peft_memory": {"benchmark": "peft_memory", "preset": "bert-base", "runs": {"full": {"train_mb": 1000.0},
                    "lora": {"train_mb": 560.0}}, "lora_over_full": 0.56, "qlora_nf4_bytes": 2**20,
                    "fp32_bytes": 8 * 2**20, "qlora_over_fp32": 0.125},
    "verify_cost": {"benchmark": "verify_cost", "preset": "gpt2", "parameters": 124_000_000, "folder_bytes": 5e8,
                    "repeats": 5, "load_verified_s": 1.2, "load_unverified_s": 1.0, "verify_only_s": 0.3, "ratio": 1.2},
    "attention_scaling": {"benchmark": "attention_scaling", "linformer_k": 256, "at_longest": {
        "full-sdpa": {"n": 8192, "linformer_s": 0.05, "full_s": 0.2}}},
    "moe_vs_dense": {"benchmark": "moe_vs_dense", "mode": "speed", "results": [
        {"precision": "fp32", "dense_tok_s": 1000.0, "moe_tok_s": 800.0, "ratio": 0.8}]},
    "price_tag_overhead": {"benchmark": "price_tag_overhead", "steps": 60, "accounting_us_per_step": 200.0,
                           "median_step_s": 0.5, "accounting_share": 0.0004},
    "cli_startup": {"benchmark": "cli_startup", "median_s": {"lmforge --help": 0.25, "lmforge finetune --help": 5.0,
                                                             "import torch": 4.0}},
    "training_jobs": {"benchmark": "training_jobs", "jobs": [
        {"job": "finetune", "loop_speedup": 1.5, "loop_cpu_speedup": 1.4, "wall_speedup": 1.25, "rss_ratio": 0.9,
         "lmforge": {"loop_s": {"median": 10.0}, "loop_cpu_s": {"median": 5.0}, "wall_s": {"median": 20.0}, "rss_mb": {"median": 900.0}},
         "reference": {"loop_s": {"median": 15.0}, "loop_cpu_s": {"median": 7.0}, "wall_s": {"median": 25.0}, "rss_mb": {"median": 1000.0}}}]},
    "serve_load": {"benchmark": "serve_load", "compile": False, "models": {"gpt-tiny": {"rows": [
        {"concurrency": 1, "tok_s": 50.0, "ttft_p99": 0.1}, {"concurrency": 4, "tok_s": 150.0, "ttft_p99": 0.3},
        {"concurrency": 16, "tok_s": 250.0, "ttft_p99": 1.25}]}}},
    "generate_engines": {"benchmark": "generate_engines", "results": [
        {"batch": 1, "impl": "lmforge fp32 eager", "engine": "lmforge", "precision": "fp32",
         "tok_s": {"median": 30.0}, "checked": True, "identical": True, "quiet": True},
        {"batch": 1, "impl": "lmforge int8", "engine": "lmforge", "precision": "int8", "tok_s": {"median": 45.0},
         "checked": True, "identical": False, "quiet": False},
        {"batch": 1, "impl": "HF generate fp32", "engine": "hf", "precision": "fp32", "tok_s": {"median": 20.0},
         "checked": True, "identical": True, "quiet": True},
        {"batch": 1, "impl": "CTranslate2 fp32", "engine": "ctranslate2", "precision": "fp32",
         "tok_s": {"median": 60.0}, "checked": True, "identical": False, "quiet": True,
         "partner": "lmforge fp32 eager"}],
        "ttft": {"compiled_cold": {"second_output_s": 40.0}, "compiled_warm": {"second_output_s": 10.0},
                 "int8_compiled_cold": {"second_output_s": 5.0}, "int8_compiled_warm": {"second_output_s": 4.0},
                 "int8_compiled_now_cold": {"second_output_s": 17.0}},
        "skipped": {"llama.cpp": "llama_cpp is not installed: pip install 'lmforge[engines]'"}},
}


def _script(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body), encoding="utf-8")


def _fake_benchmarks(root: Path) -> Path:
    folder = root / "benchmarks"
    folder.mkdir()
    for name, result in RESULTS.items():
        # Each fake records its arguments (so --quick can be checked), prints lines, then the JSON line.
        _script(folder, name, f"""
            import sys
            from pathlib import Path
            Path(__file__).with_suffix(".args").write_text(" ".join(sys.argv[1:]))
            print("measuring {name} ...")
            print('{{"not": "the last json"}}')
            print({json.dumps(json.dumps(result))})
            """)
    return folder


def test_last_json_takes_the_final_object():
    assert bench.last_json('{"a": 1}\nsome text\n{"b": 2}\ntrailing words\n') == {"b": 2}
    assert bench.last_json("no json here\n{broken\n") is None


def test_rows_for_each_benchmark_format():
    rows = {name: bench.rows_for(name, data) for name, data in RESULTS.items()}
    assert [r.case for r in rows["train_step"]] == ["gpt eager"] and rows["train_step"][0].ratio == pytest.approx(1.137)
    assert rows["generate"][1].case.endswith("(tokens DIFFER)")
    unsteady = bench.rows_for("train_step", {**RESULTS["train_step"], "steady": False})
    assert [r.case for r in unsteady] == ["gpt eager (machine unsteady)"]
    assert [r.ratio for r in rows["data_pipeline"]] == [pytest.approx(0.95), pytest.approx(250.0)]
    assert [(r.ratio, r.better) for r in rows["peft_memory"]] == [(0.56, "lower"), (0.125, "lower")]
    assert [(r.case, r.ratio) for r in rows["attention_scaling"]] == [
        ("Linformer k=256 vs full attention (sdpa), fwd+bwd, n=8192", pytest.approx(4.0))]
    assert [(r.case, r.lmforge, r.reference, r.ratio) for r in rows["moe_vs_dense"]] == [
        ("8 experts top-1 vs dense, equal active weights, train step fp32", "800 tok/s", "dense 1,000 tok/s", 0.8)]
    assert [(r.case, r.reference, r.ratio, r.better) for r in rows["training_jobs"]] == [
        ("finetune: training loop", "HF Trainer 15.0 s", 1.5, "higher"),
        ("finetune: training loop, CPU seconds", "HF Trainer 7.0 s", 1.4, "higher"),
        ("finetune: wall, process start to saved model", "HF Trainer 25.0 s", 1.25, "higher"),
        ("finetune: peak RSS", "HF Trainer 1,000.0 MB", 0.9, "lower")]
    assert [(r.case, r.lmforge, r.reference, r.ratio, r.better) for r in rows["price_tag_overhead"]] == [
        ("per-step accounting, 60 steps of gpt-tiny", "200 us/step", "loop 500.0 ms/step", 0.0004, "lower")]
    assert [(r.case, r.lmforge, r.reference, r.ratio, r.better) for r in rows["cli_startup"]] == [
        ("lmforge --help", "0.25 s", "import torch 4.00 s", 0.0625, "lower"),
        ("lmforge finetune --help", "5.00 s", "import torch 4.00 s", 1.25, "lower")]
    assert [(r.case, r.lmforge, r.reference, r.ratio) for r in rows["serve_load"]] == [
        ("gpt-tiny, 4 concurrent streams", "150.0 tok/s, p99 TTFT 0.30 s", "one at a time 50.0 tok/s", 3.0),
        ("gpt-tiny, 16 concurrent streams", "250.0 tok/s, p99 TTFT 1.25 s", "one at a time 50.0 tok/s", 5.0)]
    assert [(r.case, r.lmforge, r.reference, r.ratio, r.better) for r in rows["generate_engines"]] == [
        ("batch 1: lmforge fp32 eager", "30.0 tok/s", "HF generate fp32 20.0 tok/s", 1.5, "higher"),
        ("batch 1: lmforge int8 (machine busy)", "45.0 tok/s", "HF generate fp32 20.0 tok/s", 2.25, "higher"),
        ("batch 1: lmforge fp32 eager vs CTranslate2 fp32 (tokens DIFFER)", "30.0 tok/s", "CTranslate2 fp32 60.0 tok/s",
         0.5, "higher"),
        ("fresh process to its second fp32 token, warm compile cache", "10.0 s", "cold cache 40.0 s", 0.25, "lower"),
        ("fresh process to its second int8 token, warm compile cache", "4.0 s",
         "cold cache 5.0 s (--compile now: 17.0 s)", 0.8, "lower"),
        ("llama.cpp: not run", "-", "llama_cpp is not installed: pip install 'lmforge[engines]'", None, "higher")]
    generic = bench.rows_for("new_bench", {"speed_ratio": 2.0, "other": 5, "a_over_b": 0.5})
    assert [(r.case, r.ratio) for r in generic] == [("speed_ratio", 2.0), ("a_over_b", 0.5)]
    with pytest.raises(ValueError, match="train_step: unexpected result format"):
        bench.rows_for("train_step", {"benchmark": "train_step", "results": [{"family": "gpt"}]})


def _training_jobs_module():
    import sys

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:  # the benchmarks package lives in the checkout root, beside src/
        sys.path.insert(0, root)
    from benchmarks import training_jobs

    return training_jobs


def test_every_training_job_names_its_reference_tool():
    jobs = _training_jobs_module().JOBS
    assert {"mlm", "clm", "seq2seq"} <= set(jobs)
    assert set(jobs) <= set(bench.JOB_REFERENCES)


def _job_runs(lmforge: list[float], reference: list[float]) -> list[dict]:
    runs = []
    for tool, metrics in (("lmforge", lmforge), ("reference", reference)):
        for seed, m in enumerate(metrics, 1):
            runs.append({"tool": tool, "seed": seed, "metric": m, "cpu_share": 1.0, "wall_s": 2.0, "loop_s": 1.0,
                         "loop_cpu_s": 1.0, "cpu_s": 2.0, "rss_mb": 100.0})
    return runs


def test_training_jobs_metric_noise_check_knows_which_way_is_better():
    tj = _training_jobs_module()
    # Far apart and no spread overlap: a lower loss is as good as the reference's, a lower BLEU is not.
    assert tj.summarise("clm", _job_runs([3.0, 3.0], [4.0, 4.0]), 0.8)["metric_within_noise"]
    assert not tj.summarise("clm", _job_runs([5.0, 5.0], [4.0, 4.0]), 0.8)["metric_within_noise"]
    assert not tj.summarise("seq2seq", _job_runs([3.0, 3.0], [4.0, 4.0]), 0.8)["metric_within_noise"]
    assert tj.summarise("seq2seq", _job_runs([5.0, 5.0], [4.0, 4.0]), 0.8)["metric_within_noise"]
    # Overlapping seed spreads count as within the noise either way.
    assert tj.summarise("mlm", _job_runs([4.0, 5.0], [3.9, 4.1]), 0.8)["metric_within_noise"]


def test_table_aligns_and_lists_failures():
    rows = bench.rows_for("peft_memory", RESULTS["peft_memory"])
    text = bench.table(rows, {"generate": "exit code 1; last line: boom"})
    lines = text.splitlines()
    assert lines[0].split() == ["benchmark", "case", "lmforge", "reference", "ratio"]
    assert "0.56x (lower is better)" in text and lines[-1] == "generate: FAILED (exit code 1; last line: boom)"
    column = lines[0].index("reference")  # every row's reference cell starts under its header
    assert lines[2][column:].startswith("full fine-tuning") and lines[3][column:].startswith("fp32")


def test_bench_runs_every_script_and_prints_one_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "OPT_IN", {})  # the opt-in benchmark runs too, installed extra or not
    folder = _fake_benchmarks(tmp_path)
    assert main(["bench", "--dir", str(folder), "--quick"]) == 0
    out = capsys.readouterr().out
    for case in ("gpt eager", "greedy, batch 1", "prepare vs raw encode_batch", "LoRA training memory"):
        assert case in out
    assert "1.14x (higher is better)" in out
    assert all((folder / f"{n}.args").read_text() == "--quick" for n in RESULTS)


def test_bench_on_a_gpu_runs_the_gpu_tables_and_serves_there(tmp_path, capsys):
    folder = _fake_benchmarks(tmp_path)
    _script(folder, "gpu", """
        import sys
        from pathlib import Path
        Path(__file__).with_suffix(".args").write_text(" ".join(sys.argv[1:]))
        print('{"benchmark": "gpu", "rows": []}')
        """)
    main(["bench", "--dir", str(folder), "--device", "cuda", "--nanogpt", "/tmp/nano"])
    assert (folder / "gpu.args").read_text() == "--device cuda --nanogpt /tmp/nano"
    assert (folder / "serve_load.args").read_text() == "--device cuda --models gpt2-shape --modes fp32 bf16"
    assert not (folder / "train_step.args").exists()  # the CPU tables stay out


def test_opt_in_benchmark_runs_only_with_its_extra_and_else_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "OPT_IN", {"generate_engines": (("lmforge", "no_such_engine_xyz"), "pip install xyz")})
    folder = _fake_benchmarks(tmp_path)
    assert main(["bench", "--dir", str(folder), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("generate_engines: skipped (needs no_such_engine_xyz: pip install xyz)")
    assert not (folder / "generate_engines.args").exists() and (folder / "generate.args").exists()
    assert main(["bench", "--dir", str(folder), "--json", "--quiet"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["benchmarks"]["generate_engines"] == {"skipped": "needs no_such_engine_xyz: pip install xyz",
                                                        "rows": []}
    assert main(["bench", "--dir", str(folder), "--only", "generate_engines", "--quiet"]) == 0  # asked for: it runs
    assert "batch 1: lmforge fp32 eager" in capsys.readouterr().out
    monkeypatch.setattr(bench, "OPT_IN", {"generate_engines": (("lmforge",), "pip install xyz")})
    assert main(["bench", "--dir", str(folder), "--quiet"]) == 0  # installed: part of the plain run
    assert "skipped" not in capsys.readouterr().out


def test_serve_load_rows_per_mode_and_each_mode_against_the_first():
    rows = [{"mode": m, "concurrency": c, "tok_s": t, "ttft_p99": 0.5} for m, c, t in (
        ("fp32", 1, 50.0), ("fp32", 4, 150.0), ("fp32", 16, 250.0), ("int8", 1, 40.0), ("int8", 4, 100.0),
        ("int8", 16, 200.0))]
    got = bench.rows_for("serve_load", {"benchmark": "serve_load", "models": {"gpt-tiny": {"rows": rows}}})
    assert [(r.case, r.reference, r.ratio) for r in got] == [
        ("gpt-tiny fp32, 4 concurrent streams", "one at a time 50.0 tok/s", 3.0),
        ("gpt-tiny fp32, 16 concurrent streams", "one at a time 50.0 tok/s", 5.0),
        ("gpt-tiny int8, 4 concurrent streams", "one at a time 40.0 tok/s", 2.5),
        ("gpt-tiny int8, 16 concurrent streams", "one at a time 40.0 tok/s", 5.0),
        ("gpt-tiny int8 vs fp32, one stream", "fp32 50.0 tok/s", 0.8),
        ("gpt-tiny int8 vs fp32, 16 concurrent streams", "fp32 250.0 tok/s", 0.8)]


def test_bench_json_output(tmp_path, capsys):
    folder = _fake_benchmarks(tmp_path)
    assert main(["bench", "--dir", str(folder), "--json", "--only", "generate,peft_memory", "--quiet"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(data["benchmarks"]) == ["generate", "peft_memory"] and data["quick"] is False
    assert data["benchmarks"]["generate"]["result"] == RESULTS["generate"]
    assert data["benchmarks"]["peft_memory"]["rows"][0]["ratio"] == 0.56
    assert (folder / "generate.args").read_text() == ""


def test_a_failing_benchmark_is_reported_and_sets_the_exit_code(tmp_path, capsys):
    folder = _fake_benchmarks(tmp_path)
    _script(folder, "generate", """
        print("about to fail")
        raise SystemExit(3)
        """)
    _script(folder, "data_pipeline", """
        print("finished, but printed no result line")
        """)
    assert main(["bench", "--dir", str(folder), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "generate: FAILED (exit code 3; last line: about to fail)" in out
    assert "data_pipeline: FAILED (no JSON result line" in out
    assert "gpt eager" in out  # the others still make the table


def test_missing_benchmarks_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["bench", "--dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "lmforge bench: error: no benchmarks found" in err and "--dir" in err and "\n" == err[-1]
    folder = _fake_benchmarks(tmp_path)
    assert main(["bench", "--dir", str(folder), "--only", "nope"]) == 2
    assert "--only: no benchmark nope" in capsys.readouterr().err


def test_default_folder_is_the_checkout_benchmarks():
    assert bench.find_dir(None) == Path(__file__).resolve().parents[1] / "benchmarks"


def test_bench_help(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for flag in ("--quick", "--json", "--only", "--dir"):
        assert flag in out
