"""Render one ``lmforge bench --json`` record into docs/lab/performance.md and the README's performance table.

Both come from the same record, so no figure appears in two places with two values. The README's table is
the text between ``<!-- bench:start -->`` and ``<!-- bench:end -->``: the few rows of :data:`README_ROWS`, all
from the record's own run (one machine, one caption); everything else in the README is left alone. The record
itself stays beside the page (docs/lab/bench.json), so a reader can check every figure.

A figure that cannot be right stops the rendering, naming its row: an MFU above 100%, or a matmul peak (the MFU
denominator) more than 15% away from the one recorded for the run's machine. Re-measure that table.

Usage::

    lmforge bench --json > docs/lab/bench.json
    python -m benchmarks.performance_doc docs/lab/bench.json --note "what else ran on the machine"

(``make bench-docs`` does both.)

A later run of some of the benchmarks can be added to the record without re-measuring the others::

    lmforge bench --json --only attention_scaling > new.json
    python -m benchmarks.performance_doc docs/lab/bench.json --add new.json --note "what else ran"

Each added benchmark replaces its entry and keeps its own run (command, date, duration, machine, ``--note``) in
the entry's ``run``; the page names that run beside the record's own (the README shows only the record's own).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(ROOT))
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
RENDER = "python -m benchmarks.performance_doc docs/lab/bench.json"
PAGE = "docs/lab/performance.md"  # from the checkout root


# ------------------------------------------------------------------------------------------- small formatting
def table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table.

    >>> print(table(["a", "b"], [[1, "x"]]))
    | a | b |
    | --- | --- |
    | 1 | x |
    """
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def ratio(value: float | None, better: str = "higher") -> str:
    """A ratio cell, saying which way is good.

    >>> ratio(1.234), ratio(0.5, "lower"), ratio(None), ratio(0.000132, "lower")
    ('1.23× (higher is better)', '0.50× (lower is better)', '-', '0.00013× (lower is better)')
    """
    if value is None:
        return "-"
    digits = f"{value:.2f}" if value >= 0.01 else f"{value:.2g}"  # a share far below 1 keeps two figures
    return f"{digits}× ({better} is better)"


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _pct(value: float) -> str:
    return f"{value:.1%}"


# ------------------------------------------------------------------------------------------- the summary
# The README's rows, (benchmark, case): a few of the record's own run, none marked unsteady, so the README's table
# has one machine and one caption; the later runs (other machines, other days) are on the lab page only.
README_ROWS = [("generate", "greedy, batch 1"), ("generate", "greedy, batch 8"),
               ("data_pipeline", "prepare vs raw encode_batch"), ("peft_memory", "LoRA training memory (bert-base)"),
               ("verify_cost", "load gpt2 (124M), manifest checked")]


def _cells(r: dict) -> list:
    return [r["benchmark"], r["case"], r["lmforge"], r["reference"], ratio(r["ratio"], r["better"])]


def readme_rows(record: dict) -> list[list]:
    """The rows of :data:`README_ROWS`, each from the record's own run (not a later one, on another machine).

    >>> row = {"benchmark": "generate", "case": "greedy, batch 1", "lmforge": "2", "reference": "1", "ratio": 2.0,
    ...        "better": "higher"}
    >>> try:
    ...     readme_rows({"benchmarks": {"generate": {"rows": [row], "run": {"command": "later"}}}})
    ... except SystemExit as e:
    ...     print(e)
    README row generate / greedy, batch 1: measured by a later run, not the record's own: re-measure that table
    """
    out = []
    for name, case in README_ROWS:
        entry = record["benchmarks"].get(name, {})
        rows = [r for r in entry.get("rows", []) if r["case"] == case]
        if not rows or "run" in entry or "unsteady" in case:
            why = "not in the record" if not rows else "measured by a later run, not the record's own"
            raise SystemExit(f"README row {name} / {case}: {why}: re-measure that table")
        out.append(_cells(rows[0]))
    return out


def summary(record: dict) -> str:
    """The summary table: every row of every benchmark, lmforge against its reference.

    >>> rec = {"benchmarks": {"generate_engines": {"rows": [
    ...     {"benchmark": "generate_engines", "case": c, "lmforge": "1", "reference": "1", "ratio": 1.0,
    ...      "better": "higher"} for c in ("batch 1: int8", "batch 1: int8 vs CT2 int8")]}}}
    >>> summary(rec).count("generate_engines")
    2
    """
    rows = [_cells(r) for entry in record["benchmarks"].values() for r in entry.get("rows", [])]
    failed = [f"{name}: FAILED ({entry['error']})" for name, entry in record["benchmarks"].items()
              if entry.get("error")]
    failed += [f"{name}: not run ({entry['skipped']})" for name, entry in record["benchmarks"].items()
               if entry.get("skipped")]
    return "\n\n".join([table(["benchmark", "case", "lmforge", "reference", "ratio"], rows)] + failed)


def provenance(record: dict) -> str:
    """One sentence: which run, when, on what machine, and where every other row is."""
    m = record["machine"]
    mode = "`--quick` sizes, " if record.get("quick") else ""
    return (f"Measured by `{record['command']}` on {record['date'][:10]} ({mode}{record['seconds'] / 60:.0f} min) on "
            f"{m['cpu']}, {m.get('cores', m.get('cpu_count'))} cores, {m.get('torch_threads', '?')} torch threads. "
            f"Every benchmark (training steps, attention scaling, serving, other engines, the GPU runs), with its "
            f"method, machine and date: [{PAGE}]({PAGE}).")


# ------------------------------------------------------------------------------------------- added runs
def add_run(record: dict, added: dict, note: str | None = None) -> dict:
    """``record`` with the benchmarks of the later record ``added`` in place of its own entries, each keeping its
    run (command, date, seconds, quick, machine and ``note``) in ``run``.

    >>> old = {"benchmarks": {"a": {"result": 1}, "b": {"result": 2}}}
    >>> new = {"command": "lmforge bench --json --only b", "date": "D", "seconds": 5, "machine": {},
    ...        "benchmarks": {"b": {"result": 3}}}
    >>> merged = add_run(old, new)
    >>> merged["benchmarks"]["a"], merged["benchmarks"]["b"]["result"], merged["benchmarks"]["b"]["run"]["date"]
    ({'result': 1}, 3, 'D')
    """
    run = {key: added[key] for key in ("command", "date", "seconds", "quick", "machine") if key in added}
    if note:
        run["note"] = note
    benchmarks = dict(record["benchmarks"])
    for name, entry in added["benchmarks"].items():
        benchmarks[name] = {**entry, "run": entry.get("run", run)}
    return {**record, "benchmarks": benchmarks}


def added_runs(record: dict) -> list[tuple[dict, list[str]]]:
    """The runs added after the record's own (by :func:`add_run`), each with the names of its benchmarks."""
    runs: list[tuple[dict, list[str]]] = []
    for name, entry in record["benchmarks"].items():
        run = entry.get("run")
        if run is None:
            continue
        for known, names in runs:
            if known == run:
                names.append(name)
                break
        else:
            runs.append((run, [name]))
    return runs


def run_line(run: dict) -> str:
    """Where an added run's figures come from: command, date, duration, machine, its note."""
    m = run.get("machine", {})
    peak = (f"; bf16 matmul peak {m['bf16_matmul_gflops_start']:.0f} GFLOP/s at the start, "
            f"{m['bf16_matmul_gflops_end']:.0f} at the end" if "bf16_matmul_gflops_end" in m else "")
    load = (f"; 1-minute load average {m['load_average_start']} at the start, {m['load_average_end']} at the end"
            if "load_average_end" in m else "")
    return (f"Measured by a later run, `{run['command']}` on {run['date']} ({run['seconds'] / 60:.1f} minutes"
            f"{', `--quick` sizes' if run.get('quick') else ''}) on {m.get('cpu', '?')}, "
            f"{m.get('cores', m.get('cpu_count', '?'))} cores, {m.get('torch_threads', '?')} torch threads, torch "
            f"{m.get('torch', '?')}{peak}{load}." + (f" {run['note']}" if run.get("note") else ""))


# ------------------------------------------------------------------------------------------- per benchmark
def _result(record: dict, name: str) -> dict | None:
    entry = record["benchmarks"].get(name)
    return entry.get("result") if entry and not entry.get("error") else None


def train_step_detail(data: dict) -> str:
    rows = []
    for r in data["results"]:
        nano = (f"{_n(r['nanogpt_tok_s'])} ({r['nanogpt_ratio']:.2f}× HF)" if "nanogpt_tok_s" in r else "")
        rows.append([r["family"], r["mode"], _n(r["lmforge_tok_s"]), f"{_n(r['hf_tok_s'])} ({r['hf_mode']})",
                     f"{r['ratio']:.2f}×", f"{_pct(r['lmforge_mfu'])} / {_pct(r['hf_mfu'])}",
                     f"{_n(r['lmforge_faults'])} / {_n(r['hf_faults'])}"] + ([nano] if nano else []))
    header = ["family", "mode", "lmforge tok/s", "HF tok/s", "ratio", "MFU lmforge / HF", "page faults/step lmforge / HF"]
    if any("nanogpt_tok_s" in r for r in data["results"]):
        header.append("nanoGPT tok/s")
    steady = "held" if data.get("steady", True) else "moved by more than 15%: treat this run's ratios as unreliable"
    precision = data.get("precision", "bf16")
    denominator = (f"; MFU is over the higher of the two, {_n(data['mfu_peak_gflops'])} GFLOP/s"
                   if "mfu_peak_gflops" in data else "")
    return (table(header, rows) + f"\n\nThe script's own {precision} matmul peak: "
            f"{_n(data['peak_gflops'])} GFLOP/s before its steps, {_n(data.get('peak_gflops_end', 0))} after ({steady})"
            f"{denominator}; allocator: glibc {data.get('malloc', 'default')}." +
            (f" {data['mfu_peak_note']}" if data.get("mfu_peak_note") else ""))


# ------------------------------------------------------------------------------------------- impossible figures
MOVED = 0.15  # a peak further than this from the machine's recorded one was measured on a different machine or day


def check(record: dict, gpu: dict | None = None) -> None:
    """Stop, naming the row, on a figure that cannot be right: an MFU above 100%, or a matmul peak (the MFU
    denominator) more than 15% away from the one recorded for its run's machine.

    >>> rec = {"machine": {"bf16_matmul_gflops_start": 400.0}, "benchmarks": {"train_step": {"result": {
    ...     "peak_gflops": 390.0, "results": [{"family": "gpt", "mode": "eager", "lmforge_mfu": 0.5, "hf_mfu": 0.4}]}}}}
    >>> check(rec)
    >>> rec["benchmarks"]["train_step"]["result"]["results"][0]["lmforge_mfu"] = 1.47
    >>> check(rec)
    Traceback (most recent call last):
    SystemExit: train_step row gpt eager: lmforge MFU 147.0% is above 100%: re-measure that table
    >>> rec["benchmarks"]["train_step"]["result"].update(peak_gflops=227.0, results=[])
    >>> check(rec)
    Traceback (most recent call last):
    SystemExit: train_step: matmul peak 227 GFLOP/s is 43% away from the run's recorded 400: re-measure that table
    """
    for name, entry in record["benchmarks"].items():
        data = entry.get("result") if not entry.get("error") else None
        if not data:
            continue
        machine = entry.get("run", {}).get("machine", record.get("machine", {}))
        recorded = machine.get("bf16_matmul_gflops_start")
        peak = data.get("mfu_peak_gflops", data.get("peak_gflops"))
        if peak and recorded and data.get("precision", "bf16") == "bf16" and abs(peak / recorded - 1) > MOVED:
            raise SystemExit(f"{name}: matmul peak {peak:.0f} GFLOP/s is {abs(peak / recorded - 1):.0%} away from "
                             f"the run's recorded {recorded:.0f}: re-measure that table")
        for r in data.get("results", []) if isinstance(data.get("results"), list) else []:
            for key in sorted(k for k in r if k.endswith("_mfu")):
                if r[key] > 1:
                    raise SystemExit(f"{name} row {r.get('family', '?')} {r.get('mode', '?')}: "
                                     f"{key.removesuffix('_mfu')} MFU {r[key]:.1%} is above 100%: "
                                     "re-measure that table")
    for section, run in (gpu or {}).get("runs", {}).items():
        result = run.get("result", {})
        measured, recorded = result.get("measured_tflops"), gpu.get("measured_tflops")
        if measured and recorded and abs(measured / recorded - 1) > MOVED:
            moved = abs(measured / recorded - 1)
            raise SystemExit(f"GPU {section}: measured peak {measured:.0f} TFLOP/s is {moved:.0%} away from the "
                             f"recorded {recorded:.0f}: re-measure that table")
        for r in result.get("rows", []):
            for key in ("mfu_datasheet", "mfu_measured"):
                if (r.get(key) or 0) > 1:
                    raise SystemExit(f"GPU {section} row {r.get('table')} / {r.get('impl')}: {key} {r[key]:.1%} is "
                                     "above 100%: re-measure that table")


def generate_detail(data: dict) -> str:
    compiled = data.get("compile")
    header = ["batch", "new tokens", "HF tok/s (ms/step)", "lmforge eager tok/s (ms/step)", "ratio"]
    header += ["lmforge compiled tok/s (ms/step)", "ratio", "first compiled call"] if compiled else []
    rows = []
    for r in data["results"]:
        row = [r["batch"], r["new_tokens"], f"{_n(r['hf_tok_s'], 1)} ({r['hf_ms_per_step']:.2f})",
               f"{_n(r['lmforge_tok_s'], 1)} ({r['lmforge_ms_per_step']:.2f})", f"{r['ratio']:.2f}×"]
        if compiled:
            row += [f"{_n(r['compiled_tok_s'], 1)} ({r['compiled_ms_per_step']:.2f})", f"{r['compiled_ratio']:.2f}×",
                    f"{r['compile_s']:.1f} s"]
        rows.append(row)
    same = all(r["identical"] and r.get("compiled_identical", True) for r in data["results"])
    return (table(header, rows) + f"\n\n{data['prompt_len']}-token prompt, {data['dtype']}, {data['threads']} threads, "
            f"median of {data['repeats']}; {'no compiled path (`--quick`)' if not compiled else 'compiled path included'}; "
            f"the paths' tokens are {'identical' if same else 'NOT identical'}; load average "
            f"{data['load_before']} before, {data['load_after']} after.")


def data_pipeline_detail(data: dict) -> str:
    rows = [["raw `encode_batch`", f"{data['raw_mb_s']:.2f} MB/s", "1.00×"],
            ["raw `encode_batch_fast`", f"{data['raw_fast_mb_s']:.2f} MB/s", f"{data['raw_fast_mb_s'] / data['raw_mb_s']:.2f}×"],
            ["`lmforge data prepare`, end to end", f"{data['prepare_mb_s']:.2f} MB/s", f"{data['prepare_over_raw']:.2f}×"]]
    return (table(["path", "throughput", "vs raw encode_batch"], rows) +
            f"\n\n{data['mb']} MB of text, {_n(data['tokens'])} tokens, tokenizer: {data['tokenizer']}. Packed loader "
            f"(seq_len {data['loader_seq_len']}, batch {data['loader_batch_size']}): {_n(data['loader_tokens_s'])} "
            f"tokens/s of finished batches, against a target of {_n(data['loader_target_tokens_s'])}.")


def peft_memory_detail(data: dict) -> str:
    names = {"full": "full fine-tuning", "lora": "LoRA r=8 on q, v"}
    rows = [[names.get(k, k), _n(r["trainable"]), _n(r["rss_model_mb"]), _n(r["train_mb"]), f"{r['step_s']:.2f} s"]
            for k, r in data["runs"].items()]
    return (table(["configuration", "trainable parameters", "model RSS (MB)", "training memory (MB)", "step"], rows) +
            f"\n\n`{data['preset']}`, batch {data['batch']} × {data['seq']}, {data['steps']} steps, glibc "
            f"{data['malloc']}. LoRA / full: {data['lora_over_full']:.2f}×. QLoRA's NF4 base weights: "
            f"{data['qlora_nf4_bytes'] / 2**20:.1f} MB against {data['fp32_bytes'] / 2**20:.1f} MB in fp32 "
            f"({data['qlora_over_fp32']:.3f}×).")


def verify_cost_detail(data: dict) -> str:
    rows = [["`lmforge.load`, manifest checked (the default)", f"{data['load_verified_s']:.3f} s"],
            ["`lmforge.load`, `--no-verify`", f"{data['load_unverified_s']:.3f} s"],
            ["the manifest check alone", f"{data['verify_only_s']:.3f} s "
             f"({data['folder_bytes'] / 1e6 / data['verify_only_s']:.0f} MB/s)"]]
    return (table(["load", "median"], rows) +
            f"\n\n`{data['preset']}` ({data['parameters'] / 1e6:.0f}M parameters, {data['folder_bytes'] / 1e6:.0f} MB "
            f"folder), median of {data['repeats']}: checking costs {data['ratio']:.2f}× an unchecked load "
            f"(+{data['load_verified_s'] - data['load_unverified_s']:.2f} s).")


def attention_scaling_detail(data: dict) -> str:
    def fmt(value) -> str:
        return "-" if value is None else f"{value:.2f}"

    slopes = [[name, fmt(s["forward_s"]), fmt(s["forward_backward_s"]), fmt(s["peak_mb"])]
              for name, s in data["slopes"].items()]
    cross = []
    for full, modes in data["crossover"].items():
        for mode, c in modes.items():
            where = ("not within the lengths run" if c is None
                     else f"n = {c['n']} (interpolated {c['interpolated_n']:.0f})")
            cross.append([full, mode.removesuffix("_s").replace("_", " + "), where])
    by_n: dict[int, dict[str, dict]] = {}
    for r in data["results"]:
        by_n.setdefault(r["n"], {})[r["layer"]] = r
    layers = list(data["slopes"])

    def cell(r: dict | None) -> str:
        return "-" if r is None else f"{r['forward_s'] * 1e3:,.1f} / {r['forward_backward_s'] * 1e3:,.1f} / " \
                                     f"{r['peak_mb']:,.0f}"

    measured = table(["n"] + layers, [[n] + [cell(row.get(name)) for name in layers] for n, row in by_n.items()])
    return ("Each cell: forward ms / forward + backward ms / peak MB of forward + backward.\n\n" + measured +
            f"\n\n![time and memory against length, log-log]({ATTENTION_PLOT})\n\n" +
            table(["layer", "time slope, forward", "time slope, fwd + bwd", "memory slope"], slopes) +
            f"\n\nLinformer (k = {data['linformer_k']}) is faster than full attention from:\n\n" +
            table(["full attention", "pass", "from"], cross) +
            f"\n\nLengths {data['lengths'][0]} to {data['lengths'][-1]}, d = {data['d_model']}, "
            f"{data.get('threads', '?')} thread(s), median of {data['repeats']}." +
            "".join(f" {k} stopped: {v}." for k, v in data.get("stopped", {}).items()))


def moe_vs_dense_detail(data: dict) -> str:
    rows = [[r["precision"], _n(r["dense_tok_s"]), _n(r["moe_tok_s"]), f"{r['ratio']:.2f}×",
             "met" if r["ratio"] >= data["budget"] else "NOT met"] for r in data["results"]]
    first = data["results"][0]
    return (table(["precision", "dense gpt-tiny tok/s", "gpt-tiny-moe tok/s", "MoE / dense",
                   f"budget ≥ {data['budget']:.1f}×"], rows) +
            f"\n\nBatch {data['batch_size']} × {data['seq_len']}, {data['threads']} thread(s), median of "
            f"{data['repeats']}. Parameters: dense "
            f"{first['dense_parameters'] / 1e6:.1f}M, MoE {first['moe_parameters'] / 1e6:.1f}M; training FLOPs per "
            f"token {first['dense_flops_per_token'] / 1e6:.1f}M and {first['moe_flops_per_token'] / 1e6:.1f}M.")


def training_jobs_detail(data: dict) -> str:
    def cell(spread: dict, digits: int = 1) -> str:
        return f"{_n(spread['median'], digits)} ({_n(spread['min'], digits)}–{_n(spread['max'], digits)})"

    rows = []
    for job in data["jobs"]:
        for tool in ("lmforge", "reference"):
            r = job[tool]
            rows.append([job["job"], tool, cell(r["loop_s"]), cell(r["loop_cpu_s"]), cell(r["wall_s"]),
                         cell(r["cpu_s"]), cell(r["rss_mb"], 0),
                         f"{job['metric_name']} {r['metric_mean']:.3f} ± {r['metric_std']:.3f}",
                         f"{r['disturbed']} of {r['runs']}"])
    ratios = [[job["job"], f"{job['loop_speedup']:.2f}×", f"{job['loop_cpu_speedup']:.2f}×",
               f"{job['wall_speedup']:.2f}×", f"{job['cpu_speedup']:.2f}×",
               f"{job['rss_ratio']:.2f}×", "yes" if job["metric_within_noise"] else "no"] for job in data["jobs"]]
    # Pre-training jobs read blocks of a fixed length and train their own tokenizer (of s["vocab"] tokens).
    sizes = "; ".join(f"{job['job']}: {s['steps']} steps × {s['batch']}, "
                      f"{'sequence length' if job['job'] in ('mlm', 'clm') else 'max length'} {s['length']}, "
                      f"lr {s['lr']:g}, warmup {s['warmup']}" + (f", vocabulary {s['vocab']:,}" if "vocab" in s else "")
                      for job in data["jobs"] for s in [job["settings"]])
    header = ["job", "tool", "loop s", "loop CPU s", "wall s", "CPU s", "peak RSS MB",
              "metric (mean ± std over seeds)", "disturbed runs"]
    return (table(header, rows) +
            "\n\nMedian (min–max) over the runs of each tool; disturbed runs (their training loop's CPU share below "
            f"{data['min_share']:.0%}) are left out of the medians when two quiet ones remain.\n\n" +
            table(["job", "loop speedup", "loop CPU speedup", "wall speedup", "CPU speedup",
                   "peak RSS lmforge / reference", "metric within the reference's seed noise"], ratios) +
            f"\n\n{sizes}; {data['threads']} torch thread(s), {data['repeats']} runs of each tool "
            f"(seeds 1..{data['repeats']}), "
            f"metric on {data['eval_limit']} held-out rows; load average {data['load_start'][0]:.1f} at the start, "
            f"{data['load_end'][0]:.1f} at the end.")


def serve_load_detail(data: dict) -> str:
    # Records from before the precision modes have rows without a "mode": one unnamed mode, no mode column.
    moded = any("mode" in r for entry in data["models"].values() for r in entry["rows"])
    rows, verdicts = [], []
    for model, entry in data["models"].items():
        ones = {}
        for r in entry["rows"]:
            one = ones.setdefault(r.get("mode"), r["tok_s"])
            rows.append([model] + ([r["mode"]] if moded else []) + [
                r["concurrency"], f"{r['req_s']:.2f}", _n(r["tok_s"], 1),
                f"{r['ttft_p50']:.3f} / {r['ttft_p99']:.3f}", f"{r['token_ms_p50']:.1f} / {r['token_ms_p99']:.1f}",
                "(one at a time)" if r["concurrency"] == 1 else f"{r['tok_s'] / one:.2f}×",
                f"{r['load_before']} → {r['load_after']}"])
        for mode, verdict in (entry.get("modes") or {None: entry}).items():
            top = [r for r in entry["rows"] if r.get("mode") == mode][-1]
            verdicts.append(f"{model}{f' {mode}' if mode else ''}: {verdict['speedup_vs_one_at_a_time']:.2f}× and p99 "
                            f"TTFT {top['ttft_p99']:.2f} s at concurrency {top['concurrency']} "
                            f"({'met' if verdict['target_met'] else 'missed'})")
    header = ["model"] + (["mode"] if moded else []) + [
        "concurrency", "requests/s", "generated tok/s", "TTFT p50 / p99 (s)", "per token p50 / p99 (ms)",
        "tok/s vs one at a time", "load average"]
    modes = (f" Each mode ({', '.join(data['modes'])}) had its own server, all running at once, the modes taking "
             "turns with the concurrencies." if moded and data.get("modes") else "")
    return (table(header, rows) +
            f"\n\n{data['requests']} requests of {data['prompt_tokens']}-token prompts and {data['new_tokens']} new "
            f"tokens per load, {data['threads']} server threads, "
            f"{'compiled' if data.get('compile') else 'eager'} decode steps.{modes} Target: at concurrency 16, "
            f"generated tokens/s at least {data['target_speedup']:g}× concurrency 1, with p99 TTFT under "
            f"{data['target_ttft_p99_s']:g} s: " + "; ".join(verdicts) + ".")


def generate_engines_detail(data: dict) -> str:
    def cell(r: dict) -> str:
        t = r["tok_s"]
        return f"{_n(t['median'], 1)} ({_n(t['min'], 1)}–{_n(t['max'], 1)})"

    def tokens(r: dict) -> str:
        if not r.get("checked"):
            return "-"
        return "identical" if r["identical"] else f"{r['agree']:.0%} equal, equal prefix {r['prefix']:.0f}"

    rows = [[r["batch"], r["impl"], cell(r), f"{r['ms_per_token']:.2f}", f"{r['first_call_s']:.1f} s",
             f"{r['runs'] - r['disturbed']} of {r['runs']}" + ("" if r["quiet"] else " (all used)"), tokens(r)]
            for r in data["results"]]
    text = table(["batch", "engine and precision", "tok/s median (min–max)", "ms per token", "first call",
                  "quiet runs", "tokens vs HF fp32"], rows)
    if data.get("ttft"):
        names = {"eager": "eager", "compiled_cold": "compiled, empty compile cache",
                 "compiled_warm": "compiled, the cache the cold run left",
                 "int8_compiled_cold": "compiled `--quantize int8`, empty compile cache (decodes eagerly)",
                 "int8_compiled_warm": "compiled `--quantize int8`, the cache the cold run left",
                 "int8_compiled_now_cold": "`--quantize int8 --compile now`, empty compile cache",
                 "int8_compiled_now_warm": "`--quantize int8 --compile now`, the step the cold run saved"}
        def seconds(t: dict, key: str) -> str:  # a median with its range over rounds, or one run's figure
            lo_hi = t.get(key.removesuffix("_s") + "_range")
            return f"{t[key]:.1f} s" + (f" ({lo_hi[0]:.1f}–{lo_hi[1]:.1f})" if lo_hi and t.get("runs", 1) > 1 else "")

        runs = max(t.get("runs", 1) for t in data["ttft"].values())
        text += "\n\n" + table([f"`lmforge generate` in a fresh process (median of {runs}, min–max)"
                                 if runs > 1 else "`lmforge generate` in a fresh process", "first text",
                                 "second text", f"all {data['new_tokens']} tokens", "exit"],
                                [[names.get(k, k), seconds(t, "first_output_s"), seconds(t, "second_output_s"),
                                  seconds(t, "last_output_s") if "last_output_s" in t else "-",
                                  seconds(t, "total_s")] for k, t in data["ttft"].items()])
    quality = data.get("quality")
    if quality:  # benchmarks/quantize_quality.py's record, kept with these rows
        text += "\n\n" + table(
            ["quality, `lmforge quantize`", "kernel", "perplexity fp32", "quantised", "change", "greedy agreement"],
            [[r["mode"], r["kernel"], f"{r['ppl_fp32']:.3f}", f"{r['ppl_quantized']:.3f}",
              f"{100 * r['ppl_change']:+.2f}%", f"{100 * r['agreement']:.1f}%"] for r in quality["results"]])
        text += (f"\n\nQuality: `{quality['model']}` pre-trained for {quality['steps']} steps on the bundled Austen "
                 f"corpus less its last {quality['held_out_chars']:,} characters, which give the perplexity "
                 f"({quality['results'][0]['tokens']:,} tokens); agreement is the common prefix of 16 greedy tokens "
                 f"over 6 prompts (`{quality['command']}`, {quality['date']}).")
    shape = data["shape"]
    skipped = "".join(f" {engine} did not run: {why}." for engine, why in data.get("skipped", {}).items())
    return (text + f"\n\n{shape['n_layer']} layers × {shape['n_embd']}, vocabulary {shape['vocab_size']:,}; "
            f"{data['prompt_len']}-token prompts, {data['new_tokens']} new tokens, {data['threads']} threads, median "
            f"of {data['repeats']}, runs with other processes above {data['max_others']:.0%} of the cores left out; "
            + (f"int8 and int4 rows in {data['quantized_activations']} activations; " if "quantized_activations" in data
               else "")
            + f"load average {data['load_before']} before, {data['load_after']} after.{skipped}")


DETAILS = {"train_step": train_step_detail, "generate": generate_detail, "data_pipeline": data_pipeline_detail,
           "peft_memory": peft_memory_detail, "verify_cost": verify_cost_detail,
           "attention_scaling": attention_scaling_detail, "moe_vs_dense": moe_vs_dense_detail,
           "training_jobs": training_jobs_detail, "serve_load": serve_load_detail,
           "generate_engines": generate_engines_detail}
ATTENTION_PLOT = "img/attention_scaling.png"  # beside the page; drawn from the record's rows by main()

# What each benchmark runs and against what: the method, which the figures above do not carry.
METHODS = {
    "train_step": """\
`benchmarks/train_step.py`: one training step (forward, loss, backward, fused AdamW) under bf16 autocast (fp32 on
hardware without native bf16), batch
8 × 256, vocab 8192, on the tiny GPT, BERT (masked LM, 15% of positions) and T5 (span-corruption target lengths)
shapes. **Reference**: the same shapes built from Hugging Face transformers (`GPT2LMHeadModel`,
`BertForMaskedLM`, `T5ForConditionalGeneration`), eager. The compiled rows compile lmforge with
`mode="max-autotune-no-cudagraphs"`; HF stays eager unless `--compile-hf`. `--nanogpt DIR` adds karpathy/nanoGPT's
`model.py` from a checkout as a second reference on the GPT shape. MFU is against the matmul peak (same precision) the
script measures before its steps; it measures it again after them and marks the run unsteady when it moved by more than
15% (a neighbour taking the FMA units slows matmul-bound steps most, so such a run's ratios are too low).""",
    "generate": """\
`benchmarks/generate.py`: greedy decoding of the tiny GPT shape (6 layers × 384, vocab 8192, random weights)
after a 32-token prompt, fp32, batch 1 and 8; exactly `new tokens` tokens (no EOS). **Reference**: Hugging Face
`GPT2LMHeadModel.generate` on the same weights (lmforge's model is `lmforge.from_hf` of it). The outputs are
checked to be token-identical before timing. `compile=True` decodes every token through one `torch.compile`d
step over a static KV cache; its first call, which compiles, is timed on its own.""",
    "data_pipeline": """\
`benchmarks/data_pipeline.py`: `lmforge data prepare` end to end (read, split documents, tokenise, convert to
uint16, checksum, write shards atomically) on the shipped corpus repeated to the size shown. **Reference**: the
raw `tokenizers` `encode_batch` of the same documents, already in memory, in the same batches: the ceiling, as it
does nothing but tokenise. The figure of each is the best of its interleaved repeats (the fastest run is the one
least disturbed). The packed loader is timed for a few seconds against a fixed target.""",
    "peft_memory": """\
`benchmarks/peft_memory.py`: peak resident memory of training steps (bf16 autocast, AdamW, masked LM) above the
memory of the ready model, each configuration in a fresh process. **Reference**: full fine-tuning of the same
model. The workers fix glibc's mmap threshold so that RSS follows live memory rather than the allocator's history.
QLoRA is compared by the bytes of its NF4 base weights (double-quantised scales included) against fp32.""",
}

METHODS["attention_scaling"] = """\
`benchmarks/attention_scaling.py`: the lecture's complexity table, measured. One layer at d = 256 (4 heads), batch
1, fp32, one thread, for n = 128 … 8192 doubling: full self-attention through SDPA and through the written-out
softmax, Linformer (k = 256), a one-layer LSTM and a kernel-3 1-D convolution; forward and forward + backward
time, and the peak memory of forward + backward. **Reference**: full attention; the ratio is its time over
Linformer's at the longest length both ran. Slopes are log-log fits over each layer's three longest lengths."""

METHODS["moe_vs_dense"] = """\
`benchmarks/moe_vs_dense.py`: training steps (forward, loss with the router losses, backward, fused AdamW) of
`gpt-tiny-moe` (8 Switch experts, top-1, capacity factor 1.25, in every other layer; ~2.8× the parameters) on
a random batch, eager, one thread, in fp32 and under bf16 autocast. **Reference**: the dense `gpt-tiny`, whose
weights are what each token multiplies in the MoE model (equal active parameters, equal FLOPs per token but for
the 384 × 8 routers). The ratio is MoE tokens/s over dense: the routing overhead budget is 0.6×. The quality
side (validation loss at equal training FLOPs) is `moe_vs_dense.py --work DIR`, in [quality.md](quality.md).

Where the MoE step's extra time goes (torch profiler, one thread): hardly the routing (the router, sorting the
slots by expert, the gathers and the scatter back are a few percent of the step). On a CPU the bf16 GEMMs are
oneDNN's, which build (compile) a kernel for every new shape, and an expert's share of the rows changes with every
step's routing: with each expert's rows as a GEMM of their own size, a step built 36 to 162 new kernels for 0.2 to
0.8 s (`ONEDNN_VERBOSE=all`, on the Xeon host), more than the expert GEMMs themselves and the bulk of the gap.
`lmforge.nn.moe` therefore rounds each expert's rows up to whole blocks of 32 zero-padded rows within a fixed
total (`block_groups`), so a few shapes recur and are built once (0 to 12 builds a step after the first). What
remains is mostly work that grows with the total parameters, not the active ones: under autocast every step casts
all 8 experts' weights to bf16 and their gradients back (fresh 9 to 19 MB tensors, whose first-touch page faults
can cost more than the conversion), AdamW updates ~2.8× the parameters, and the padding rows are computed. In fp32 the GEMMs
build nothing per shape and the dense model gets no bf16 matrix units, and the MoE step keeps pace. On a shared
host the bf16 ratio moves mostly with the dense step's speed."""

METHODS["serve_load"] = """\
`benchmarks/serve_load.py`: `lmforge serve` under load. Two random models, the tiny GPT (6 layers × 384) and a
GPT-2-shaped one (12 layers × 768, an HF `GPT2LMHeadModel` converted by `lmforge.from_hf`), vocab 8192, fp32,
each served by its own `lmforge serve` subprocess on loopback (`--max-batch 16`). A bounded asyncio client
(raw HTTP/1.1, server-sent events) sends 64 streamed greedy completions of 32-token prompts and exactly 64 new
tokens each, with 1, 4 and 16 requests in flight. **Reference**: concurrency 1, the same load served one request
at a time; the ratio is generated tokens/s against it. TTFT is from sending a request to its first streamed
text; per-token latency is the rest of the request over its remaining tokens. The concurrencies take turns
against the same server: the 64 requests are split into 4 rounds of 16, and each round runs every concurrency
on its 16 (rotating which goes first), so a shared host's drift reaches them alike; each row's load average
is the host's at its first and last round. Prompts of one length are prefilled in one forward, so a wave of
16 new requests gets its first tokens together: p99 TTFT at 16 streams is one (16, 32) prefill plus waiting."""

METHODS["generate_engines"] = """\
`benchmarks/generate_engines.py` (opt-in: `make bench-engines`): greedy decoding of one random GPT-2-shaped model
(12 layers × 768, GPT-2's byte-level BPE and vocabulary) by lmforge in each mode (fp32 eager, where lmforge's AVX2
kernel multiplies decoding's rows; fp32 compiled, inductor's packed GEMMs; bf16, through lmforge's bf16 kernel on a
CPU without native bf16 (weights widened to fp32 in registers); int8 per row (on x86 the activations are rounded to integers per call too, as CTranslate2's int8 and llama.cpp's
Q8_0 do: to 8 bits per row by lmforge's AVX2 kernel at one or two rows, to 7 bits by fbgemm's int8 GEMM above)
and weight-only int4, these two with bf16 activations where the CPU has native bf16, else fp32; each eager and
compiled) and by other engines on the same weights: HF `generate` (fp32), CTranslate2 (its own
`TransformersConverter`, fp32 and int8) and llama.cpp through llama-cpp-python (GGUF from llama.cpp's
`convert_hf_to_gguf.py`: f32, q8_0, and q4_0 by `llama_model_quantize`; batch 1 only). 32-token prompts from the
bundled corpus, exactly 128 new tokens, batch 1 and 8, every engine on the same threads, each row in a worker
process of its own, the rows taking turns.
**Reference**: HF `generate` fp32 for every lmforge mode; for CTranslate2 and llama.cpp, the ratio is lmforge's
fastest row (eager or compiled) of the same precision over theirs. Runs during which other processes used the CPU are left out. The
fresh-process rows time `lmforge generate --compile` (fp32, and `--quantize int8`) from process start to its
first, second and last streamed text and to its exit, with an empty and then a warm compile cache, in rounds (each
figure the median over them, with its range; single processes, not filtered for a busy host). The second text is
the decode step's first token. The fp32 step is compiled whole before it, and its warm row traces it again and
reuses inductor's built kernels. The int8 step runs one layer for all twelve (regional compilation,
`lmforge.generation.compiled`), packaged by AOTInductor (`lmforge.generation.packaged_region`): the warm row opens
the package without importing Dynamo or inductor. With an empty cache, bare `--compile` does not wait for that
layer: it decodes eagerly, and as it exits exports the layer and starts a child process that packages it; `--compile
now` compiles the whole step with Dynamo before its second token and saves it precompiled
(`lmforge.generation.step_artifact`), which its warm row loads. Each warm row starts once the package is written.
The in-process rows above do not package (the build would share the cores with the next rows' timed runs)."""

METHODS["verify_cost"] = """\
`benchmarks/verify_cost.py`: what integrity checking adds to loading a model folder. A randomly initialised
`gpt2` (124M parameters, fp32) is saved, then `lmforge.load(path)` (sizes and sha256 of every file checked
against `manifest.json`) is timed against `lmforge.load(path, verify=False)` (`--no-verify`), interleaved and
rotated after a warm-up, so both read from the page cache. Both include what every load does: reading the
tensors and checking their shapes and that they are finite. **Reference**: the unchecked load."""

METHODS["training_jobs"] = """\
`benchmarks/training_jobs.py`: whole training jobs, each in a fresh process, as a user runs them: lmforge's
command line (`lmforge finetune`) against `transformers.Trainer` (full fine-tuning of all-MiniLM-L6-v2 on
rt-sentiment), `Trainer` + `peft` (LoRA r=8 on q, v) and sentence-transformers' `SentenceTransformerTrainer` with
`MultipleNegativesRankingLoss` (the bundled bible triplets); and, from scratch, `lmforge pretrain` of bert-tiny (MLM)
and gpt-tiny (CLM) on the bundled corpus against `Trainer` with `BertForMaskedLM` + `DataCollatorForLanguageModeling`
and `GPT2LMHeadModel` on the same token sequences, and `lmforge finetune --task seq2seq` of t5-tiny on kjv-rv1909
against `Seq2SeqTrainer` (metrics: held-out loss, BLEU), with the same steps, batch, length, learning rate,
schedule, weight decay, clipping, bf16 autocast, seed and threads; the differences that remain are listed in the
script's docstring. Wall time runs from the process's start to its saved model; the loop is each tool's own
training-loop time; CPU seconds are the process's user + system time, which a busy neighbour moves less than wall
time. The tools take turns (A B, B A, ...), one seed per turn. What the job profile found, with before/after
numbers, is in [training-jobs.md](training-jobs.md)."""

COMMON_METHOD = """\
Every benchmark measures lmforge and its reference **side by side in one process**, on the same inputs and
weights, **interleaved** (a, b, a, b, ...; generation also rotates who goes first), after warm-up, and reports the
**median over the repeats** (data prepare: the best run). A slow drift of a shared machine then hits both sides
alike, so compare the ratios within one run, not tokens per second across runs or machines. `lmforge bench` runs
each script in its own process and reads the JSON line it ends with; the whole record is
[bench.json](bench.json)."""

# Why the numbers look as they do: the reasoning behind the lmforge side of each ratio (no figures: they are above).
WHY = """\
## Where lmforge's training step saves time

Matmuls are most of a training step, and both implementations run them through the same kernels, so the margin
over HF is in everything else:

- **Less work.** The MLM head runs only at the masked positions; the q/k/v projections are one GEMM.
- **The loss** (`lmforge/nn/loss.py`) writes the gradient `softmax − onehot` in bf16 during the forward pass, one
  softmax pass per cache-sized chunk, instead of keeping fp32 logits, log-softmax and their gradients; compiled,
  it is one inductor kernel.
- **Attention on a CPU.** bf16 training steps compute attention as one `baddbmm` (scale and mask folded in), a
  softmax and a `bmm`, because the flash kernel's backward is slow on a CPU; fp32, inference and long sequences
  keep SDPA (`lmforge.nn.attention.use_matmul_attention`).
- **Only under `torch.compile`**: GPT-2's GELU as `x·sigmoid(2u)` (a CPU's vectorised tanh is much slower than
  its exp), causal attention in two query halves (the masked quarter of the scores is never computed).

**The allocator.** glibc as it comes serves large blocks with mmap and unmaps them on free, so a step that
allocates big temporaries faults them back in every step, and the kernel zeroes each page: HF's fp32 logits and
their gradients make it fault far more than lmforge (the page-fault column). `train_step.py --malloc heap` keeps
freed memory for reuse in both implementations (what jemalloc or tcmalloc would also do); HF gains more from it
than lmforge, and the ratios shrink. The default is what an untuned process gets; run both to separate the
allocator from the compute.

**A busy host.** On a shared machine, two-thread kernels spin at their barriers when another process holds a
core, and matmul-bound steps slow more than memory-bound ones. The matmul peak measured at the start and the end
of the run (below) says whether the machine stayed the same throughout."""


# ------------------------------------------------------------------------------------------- the page
def machine_section(record: dict, note: str | None) -> str:
    m = record["machine"]
    peak = (f"{m['bf16_matmul_gflops_start']:.0f} GFLOP/s at the start, {m['bf16_matmul_gflops_end']:.0f} at the end"
            if "bf16_matmul_gflops_end" in m else "not measured")
    load = (f"{m['load_average_start']} at the start, {m['load_average_end']} at the end"
            if "load_average_end" in m else str(m.get("load_average", "unknown")))
    rows = [["CPU", m["cpu"]], ["cores", m.get("cores", m.get("cpu_count"))],
            ["torch threads", m.get("torch_threads", "?")], ["device", m.get("gpu") or m.get("device", "cpu")],
            ["Python", m.get("python")], ["torch", m.get("torch", "?")],
            ["transformers", m.get("transformers", "?")], ["tokenizers", m.get("tokenizers", "?")],
            ["platform", m.get("platform")], ["bf16 matmul peak (cube of up to 2048)", peak],
            ["1-minute load average", load]]
    text = table(["", ""], rows)
    if m.get("steady") is False:
        text += "\n\nThe matmul peak moved by more than 15% during the run: another process took CPU time."
    if note:
        text += f"\n\n{note}"
    return text


def page(record: dict, note: str | None = None, gpu: dict | None = None) -> str:
    """docs/lab/performance.md for one ``lmforge bench --json`` record (and the GPU records, when given)."""
    check(record, gpu)
    parts = [
        "# Performance",
        "<!-- Generated by benchmarks/performance_doc.py from docs/lab/bench.json: edit those, not this page. -->",
        f"Every figure on this page comes from one run of `{record['command']}` on {record['date']} "
        f"({record['seconds'] / 60:.1f} minutes{', `--quick` sizes' if record.get('quick') else ''}); the machine "
        f"is described [at the end](#machine)" +
        "".join(f", except {', '.join(names)}, measured by a later run (`{run['command']}` on {run['date']}, "
                f"described in {'its section' if len(names) == 1 else 'their sections'})"
                for run, names in added_runs(record)) +
        ". The README's table is a few rows of the summary below, generated from the same record "
        "([bench.json](bench.json)).",
        "## Reproduce",
        f"```bash\n{record['command']} > docs/lab/bench.json   # or: make bench-docs\n{RENDER}\n```",
        "## Summary",
        "lmforge against its reference, measured side by side in the same run. For speed a ratio above 1 is "
        "lmforge faster; for memory a ratio below 1 is lmforge smaller.",
        summary(record),
        "## Method",
        COMMON_METHOD,
    ]
    for name, entry in record["benchmarks"].items():
        parts.append(f"## {name}")
        if name in METHODS:
            parts.append(METHODS[name])
        data = _result(record, name)
        if entry.get("skipped"):
            parts.append(f"Not run in this run: {entry['skipped']}.")
            continue
        if data is None:
            parts.append(f"This benchmark failed in this run: {entry.get('error', 'no result')}.")
        elif name in DETAILS:
            parts.append(DETAILS[name](data))
        parts.append(f"Took {entry['seconds']:.0f} s.")
        if "run" in entry:
            parts.append(run_line(entry["run"]))
    parts += [WHY, "## Machine", machine_section(record, note),
              "Quality benchmarks (accuracy, BLEU, loss curves: minutes to hours of training each) are not part of "
              "`lmforge bench`; their scripts and latest results are in [quality.md](quality.md)."]
    if gpu is not None:
        from benchmarks.gpu_doc import gpu_section  # it formats its tables with this module's table()

        parts.append(gpu_section(gpu))
    return "\n\n".join(parts) + "\n"


def readme_block(record: dict) -> str:
    """The README's performance table and its one line of provenance."""
    check(record)
    header = ["benchmark", "case", "lmforge", "reference", "ratio"]
    return f"{START}\n{table(header, readme_rows(record))}\n\n{provenance(record)}\n{END}"


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the bench markers (markers included) replaced by ``block``.

    >>> replace_block("a\\n<!-- bench:start -->\\nold\\n<!-- bench:end -->\\nb", "NEW")
    'a\\nNEW\\nb'
    """
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"the README has no {START} ... {END} block to fill")
    return text[:start] + block + text[end + len(END):]


def read_record(path: Path) -> dict:
    """A ``lmforge bench --json`` record from a file (the output with something before it: the last line)."""
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(text.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="the output of `lmforge bench --json` (e.g. docs/lab/bench.json)")
    parser.add_argument("--note", default=None, help="a sentence on the machine's state (what else was running); "
                                                      "with --add, of the added run")
    parser.add_argument("--add", type=Path, default=None, metavar="RECORD",
                        help="a later `lmforge bench --json` record of some benchmarks: its entries replace the "
                             "record's own, each keeping its run's date, command and machine")
    parser.add_argument("--doc", type=Path, default=ROOT / PAGE)
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--gpu", type=Path, default=ROOT / "docs" / "lab" / "bench-gpu.json",
                        help="the GPU records (benchmarks/gpu.py runs) for the page's GPU section, if the file exists")
    args = parser.parse_args(argv)
    record = read_record(args.record)
    if args.add is not None:
        record = add_run(record, read_record(args.add), args.note)
    elif args.note:
        record["note"] = args.note
    args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")  # indented, for readers
    gpu = json.loads(args.gpu.read_text(encoding="utf-8")) if args.gpu.is_file() else None
    args.doc.write_text(page(record, record.get("note"), gpu), encoding="utf-8")
    scaling = _result(record, "attention_scaling")
    if scaling is not None:  # the page's plot, drawn from the rows in the record
        from benchmarks.attention_scaling import plot

        plot(scaling["results"], args.doc.parent / ATTENTION_PLOT)
    args.readme.write_text(replace_block(args.readme.read_text(encoding="utf-8"), readme_block(record)),
                           encoding="utf-8")
    print(f"wrote {args.doc} and the performance table of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
