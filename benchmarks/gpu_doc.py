"""The GPU section of docs/lab/performance.md, rendered from docs/lab/bench-gpu.json (the records of
benchmarks/gpu.py runs on a lent GPU, with their commands and dates). ``python -m benchmarks.performance_doc``
calls :func:`gpu_section`.

    >>> rec = {"device": "GPU X", "software": "torch 2", "datasheet_tflops": 100.0, "measured_tflops": 80.0,
    ...        "runs": {"memory": {"command": "python benchmarks/gpu.py --sections memory", "date": "D", "result": {
    ...            "rows": [{"table": "memory m", "impl": "full", "trainable": 10, "loaded_gib": 1.0, "peak_gib": 4.0},
    ...                     {"table": "memory m", "impl": "lora", "trainable": 1, "loaded_gib": 1.0, "peak_gib": 2.0}]}}}}
    >>> print(gpu_section(rec).splitlines()[0])
    ## GPU: GPU X
"""

from __future__ import annotations

from benchmarks.performance_doc import table

TITLES = {"train": "Training step: GPT-2 124M, batch 16 × 1024, bf16 autocast, fused AdamW",
          "encoders": "Training steps: bert-base MLM (32 × 512) and t5-base span corruption (32 × 512 → 114)",
          "generate": "Greedy generation: GPT-2 124M, bf16 weights, 32-token prompt, 128 new tokens",
          "memory": "Peak GPU memory: llama-1b (random weights), batch 4 × 512, bf16 autocast, AdamW, 3 steps",
          "serve": "`lmforge serve` under load: a GPT-2-shaped model (random weights), 32-token prompts, 64 new tokens"}
TITLES["encoders compiled"] = TITLES["encoders"] + ", compiled"
SECTIONS = ("train", "encoders", "encoders compiled", "generate", "memory", "serve")


def _speed(rows: list[dict], reference: dict[str, str]) -> str:
    """Each implementation's tokens/s, time, MFU and its ratio to the reference named for its mode."""
    by_impl = {(r["table"], r.get("batch"), r["impl"]): r for r in rows}
    out = []
    for r in rows:
        ref = by_impl.get((r["table"], r.get("batch"), reference.get(r["impl"], "")))
        ratio = f"{r['tok_s'] / ref['tok_s']:.2f}× {ref['impl']}" if ref and ref is not r else ""
        if "ms_per_step" in r:
            mfu = (f"{r['mfu_datasheet']:.1%}" if r.get("mfu_datasheet") is not None else "-")
            out.append([r["table"].removeprefix("train "), r["impl"], f"{r['tok_s']:,.0f}", f"{r['ms_per_step']:.1f}",
                        mfu, f"{r['mfu_measured']:.1%}", ratio])
        else:
            out.append([r["batch"], r["impl"], f"{r['tok_s']:,.0f}", f"{r['ms_per_token']:.2f}",
                        f"{r['first_call_s']:.1f}", f"{r['same_as_hf']:.0%}", ratio])
    if rows and "ms_per_step" in rows[0]:
        return table(["model", "implementation", "tokens/s", "ms/step", "MFU (datasheet)", "MFU (measured peak)",
                       "ratio"], out)
    return table(["batch", "implementation", "new tokens/s", "ms/token", "first call s (compiles)",
                   "tokens equal to HF generate", "ratio"], out)


# Which reference each lmforge row is compared with in the tables' ratio column (the same mode).
REFERENCE = {"lmforge eager": "HF eager", "lmforge compiled": "HF compiled"}
GEN_REFERENCE = {"lmforge eager": "HF generate", "lmforge compiled": "HF static+compile"}


def _serve(result: dict) -> str:
    """One row per (model, mode, concurrency) of a benchmarks/serve_load.py record, and each mode's speed-up."""
    out, speedups = [], []
    for model, entry in result["models"].items():
        for r in entry["rows"]:
            out.append([model, r["mode"], r["concurrency"], f"{r['req_s']:.2f}", f"{r['tok_s']:,.0f}",
                        f"{r['ttft_p50']:.3f} / {r['ttft_p99']:.3f}",
                        f"{r['token_ms_p50']:.1f} / {r['token_ms_p99']:.1f}"])
        for mode, m in entry.get("modes", {}).items():
            speedups.append(f"{model} {mode} {m['speedup_vs_one_at_a_time']:.2f}×")
    text = table(["model", "mode", "concurrency", "requests/s", "new tokens/s", "TTFT p50 / p99 s",
                  "per token p50 / p99 ms"], out)
    if speedups:
        text += ("\n\nTokens/s at the highest concurrency over one request at a time: " + ", ".join(speedups) + ".")
    return text


def gpu_section(record: dict) -> str:
    peaks = sorted(run["result"]["measured_tflops"] for run in record["runs"].values()
                   if run["result"].get("measured_tflops"))
    measured = (f"{peaks[0]:.0f} to {peaks[-1]:.0f}" if len(peaks) > 1 and round(peaks[0]) != round(peaks[-1])
                else f"{peaks[0] if peaks else record['measured_tflops']:.0f}")
    parts = [f"## GPU: {record['device']}",
             f"{record['software']}. bf16 peak: {record['datasheet_tflops']} TFLOP/s dense from the datasheet, "
             f"{measured} TFLOP/s measured by each run of the script (8192³ matmul, median of 20); each row's "
             "measured MFU uses its own run's. MFU counts "
             "the model's training FLOPs (6 N + attention, PaLM's appendix B) per second over those peaks. Every table "
             "interleaves its implementations in one process (the median of `--repeats` steps, 10 unless its command "
             "says otherwise, after warm-up; the compiled ones warmed up through their compile). "
             "`lmforge bench --device cuda` reproduces all of them (`--nanogpt DIR` adds nanoGPT)."]
    for section in SECTIONS:
        run = record["runs"].get(section)
        if run is None:
            continue
        result = run["result"]
        parts.append(f"### {TITLES[section]}")
        parts.append(f"`{run['command']}`, {run['date']}" + (f"; {run['note']}" if run.get("note") else "") + ".")
        rows = result.get("rows", [])
        if section == "serve":
            parts.append(_serve(result))
        elif section == "memory":
            full = next((r for r in rows if r["impl"] == "full"), None)
            parts.append(table(["method", "trainable parameters", "model loaded GiB", "peak GiB", "peak / full"],
                                [[r["impl"], f"{r['trainable']:,}", f"{r['loaded_gib']:.2f}", f"{r['peak_gib']:.2f}",
                                  f"{r['peak_gib'] / full['peak_gib']:.2f}" if full else "-"] for r in rows]))
        elif rows:
            parts.append(_speed(rows, GEN_REFERENCE if section == "generate" else REFERENCE))
            impls = {r["impl"]: r for r in rows}
            if "nanoGPT compiled" in impls and "lmforge compiled" in impls:
                ratio = impls["lmforge compiled"]["tok_s"] / impls["nanoGPT compiled"]["tok_s"]
                parts.append(f"lmforge compiled / nanoGPT compiled: {ratio:.2f}×.")
        for name, error in result.get("errors", {}).items():
            parts.append(f"Not measured: {error}.")
    for key, label in (("tests", "The CUDA test run"), ("nanogpt", "nanoGPT"),
                       ("nccl_two_ranks_one_gpu", "NCCL with two ranks on one GPU"), ("notes", "Notes")):
        if record.get(key):
            parts.append(f"{label}: {record[key]}")
    return "\n\n".join(parts)
