"""``lmforge bench``: run the speed and memory benchmarks of the checkout's ``benchmarks/`` folder and print one
table of lmforge against its reference, each ratio measured side by side in the same run.

    script            measures                                              reference
    train_step.py     tokens/s of forward + backward + AdamW (GPT, BERT, T5) Hugging Face transformers
    generate.py       greedy generation tokens/s (batch 1 and 8)             HF generate
    data_pipeline.py  data prepare MB/s; packed loader tokens/s              raw tokenizers encode_batch; a target
    peft_memory.py    peak training memory of LoRA; QLoRA's NF4 base bytes   full fine-tuning; fp32 weights
    attention_scaling.py  one layer's time vs length: Linformer (k=256)         full attention (SDPA; matmul)
    moe_vs_dense.py   training tokens/s of gpt-tiny-moe (8 experts, top-1)  dense gpt-tiny (equal active weights)
    training_jobs.py  whole jobs, process start to saved model: loop, wall,  HF Trainer, Trainer + peft,
                      peak RSS, final metric (fine-tune, LoRA, embeddings,   sentence-transformers,
                      MLM and CLM pre-training, seq2seq fine-tuning)         Seq2SeqTrainer
    price_tag_overhead.py  the price tag's per-step accounting time       the training loop's time
    cli_startup.py    a fresh process answering lmforge --help and          a fresh python -c "import torch"
                      lmforge finetune --help
    serve_load.py     lmforge serve's generated tokens/s at concurrency 4, 16   the same load one request at a time
                      (fp32 and --quantize int8 side by side)                 (and int8 against fp32)
    generate_engines.py  greedy tokens/s of lmforge fp32 eager/compiled, bf16,  HF generate; CTranslate2 and
                      int8, int4; fresh-process time to first token           llama.cpp at the same precision
                      (opt-in: runs when the engines extra is installed)

Each script runs in its own process (so one's memory and threads do not disturb the next), prints its own
lines (shown on stderr as they come) and ends with one JSON line, which this command reads. The quality
benchmarks (finetune_quality.py, embedding_quality.py, pretrain_curves.py) train for many minutes each and
are run directly. The benchmarks live in the source checkout, not in the installed package: without a
checkout, pass ``--dir``.

With ``--json`` it prints one record instead of the table: every script's result and rows, the date, the exact
command, its duration and the machine (CPU, cores, torch threads, library versions, and a bf16 matmul peak
measured by ``benchmarks/common.py`` before and after the benchmarks, so a host that got busy shows).
``python -m benchmarks.performance_doc RECORD`` renders that record into docs/lab/performance.md and the README's
table (``make bench-docs`` does both).

Example::

    $ lmforge bench --quick              # a few minutes: fewer repeats, smaller sizes, no torch.compile
    $ lmforge bench --only generate --json
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import lmforge
from lmforge.cli.main import UserError
from lmforge.utils.machine import machine_info

BENCHMARKS = ("train_step", "generate", "data_pipeline", "peft_memory", "verify_cost", "attention_scaling",
              "moe_vs_dense", "training_jobs", "price_tag_overhead", "cli_startup", "serve_load",
              "generate_engines")
# Benchmarks a plain ``lmforge bench`` runs only when their optional packages are installed (``--only`` runs them
# anyway, with whatever of those is there): name -> (modules, how to install them).
OPT_IN = {"generate_engines": (("ctranslate2", "llama_cpp", "gguf"),
                               "pip install 'lmforge[engines]', or make bench-engines")}
# On a GPU (``--device cuda``) one script measures every training, generation and memory table, in one process
# (see benchmarks/gpu.py), and serve_load serves a GPT-2-shaped model in fp32 and bf16 there.
GPU_BENCHMARKS = ("gpu", "serve_load")
GPU_FLAGS = {"serve_load": ["--models", "gpt2-shape", "--modes", "fp32", "bf16"]}
QUICK_FLAGS = {name: ["--quick"] for name in BENCHMARKS + GPU_BENCHMARKS}  # every speed benchmark has its own --quick
STEADY_TOLERANCE = 0.15  # the matmul peak may move this much between start and end (as train_step.py allows)


@dataclass
class Row:
    """One line of the table: a measured case of a benchmark, lmforge against its reference."""

    benchmark: str
    case: str
    lmforge: str
    reference: str
    ratio: float | None  # lmforge / reference in the direction of ``better`` (speedup, or memory share)
    better: str  # "higher" or "lower": which way a ratio is good


# ------------------------------------------------------------------------------------------- reading results
def last_json(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that parses as a JSON object (a benchmark's result line), or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _train_step(data: dict) -> list[Row]:
    # The script re-measures the matmul peak after its steps; a changed peak means a busy host skewed them.
    note = " (machine unsteady)" if data.get("steady") is False else ""
    return [Row("train_step", f"{r['family']} {r['mode']}{note}", f"{r['lmforge_tok_s']:,.0f} tok/s",
                f"HF {r.get('hf_mode', 'eager')} {r['hf_tok_s']:,.0f} tok/s", r["ratio"], "higher")
            for r in data.get("results", [])]


def _generate(data: dict) -> list[Row]:
    return [Row("generate", f"greedy, batch {r['batch']}" + ("" if r.get("identical", True) else " (tokens DIFFER)"),
                f"{r['lmforge_tok_s']:,.1f} tok/s", f"HF generate {r['hf_tok_s']:,.1f} tok/s", r["ratio"], "higher")
            for r in data.get("results", [])]


def _data_pipeline(data: dict) -> list[Row]:
    return [
        Row("data_pipeline", "prepare vs raw encode_batch", f"{data['prepare_mb_s']:.2f} MB/s",
            f"encode_batch {data['raw_mb_s']:.2f} MB/s", data["prepare_over_raw"], "higher"),
        Row("data_pipeline", "packed loader", f"{data['loader_tokens_s']:,.0f} tok/s",
            f"target {data['loader_target_tokens_s']:,.0f} tok/s",
            data["loader_tokens_s"] / data["loader_target_tokens_s"], "higher"),
    ]


def _peft_memory(data: dict) -> list[Row]:
    runs = data.get("runs", {})
    rows = []
    if "lora" in runs and "full" in runs:
        rows.append(Row("peft_memory", f"LoRA training memory ({data.get('preset')})",
                        f"{runs['lora']['train_mb']:,.0f} MB", f"full fine-tuning {runs['full']['train_mb']:,.0f} MB",
                        data["lora_over_full"], "lower"))
    if "qlora_nf4_bytes" in data:
        rows.append(Row("peft_memory", "QLoRA NF4 base weights", f"{data['qlora_nf4_bytes'] / 2**20:,.1f} MB",
                        f"fp32 {data['fp32_bytes'] / 2**20:,.1f} MB", data["qlora_over_fp32"], "lower"))
    return rows


def _verify_cost(data: dict) -> list[Row]:
    return [Row("verify_cost", f"load {data['preset']} ({data['parameters'] / 1e6:.0f}M), manifest checked",
                f"{data['load_verified_s']:.2f} s", f"--no-verify {data['load_unverified_s']:.2f} s", data["ratio"],
                "lower")]


def _attention_scaling(data: dict) -> list[Row]:
    # Forward + backward of one layer at the longest length both ran; slopes and crossover are in its own output.
    k = data["linformer_k"]
    return [Row("attention_scaling", f"Linformer k={k} vs full attention ({full.removeprefix('full-')}), "
                                     f"fwd+bwd, n={r['n']}",
                f"{r['linformer_s'] * 1e3:,.2f} ms", f"{full} {r['full_s'] * 1e3:,.2f} ms",
                r["full_s"] / r["linformer_s"], "higher")
            for full, r in data.get("at_longest", {}).items()]


def _moe_vs_dense(data: dict) -> list[Row]:
    # The MoE model against the dense one of equal active weights: the routing overhead, per precision.
    return [Row("moe_vs_dense", f"8 experts top-1 vs dense, equal active weights, train step {r['precision']}",
                f"{r['moe_tok_s']:,.0f} tok/s", f"dense {r['dense_tok_s']:,.0f} tok/s", r["ratio"], "higher")
            for r in data.get("results", [])]


JOB_REFERENCES = {"finetune": "HF Trainer", "lora": "Trainer + peft", "embedding": "sentence-transformers",
                  "mlm": "HF Trainer, MLM collator", "clm": "HF Trainer, GPT-2", "seq2seq": "HF Seq2SeqTrainer"}


def _training_jobs(data: dict) -> list[Row]:
    # Medians over the repeats; the ratios are speedups (reference / lmforge) and lmforge's share of the peak RSS.
    rows = []
    for job in data.get("jobs", []):
        lm, ref = job["lmforge"], job["reference"]
        name = ("lmforge " + data["against_src"] if data.get("against_src")
                else JOB_REFERENCES.get(job["job"], "reference"))
        for key, what, ratio, better, unit in (("loop_s", "training loop", job["loop_speedup"], "higher", "s"),
                                               ("loop_cpu_s", "training loop, CPU seconds", job["loop_cpu_speedup"],
                                                "higher", "s"),
                                               ("wall_s", "wall, process start to saved model", job["wall_speedup"],
                                                "higher", "s"),
                                               ("rss_mb", "peak RSS", job["rss_ratio"], "lower", "MB")):
            rows.append(Row("training_jobs", f"{job['job']}: {what}", f"{lm[key]['median']:,.1f} {unit}",
                            f"{name} {ref[key]['median']:,.1f} {unit}", ratio, better))
    return rows


# benchmarks/gpu.py: lmforge's implementation -> the references it is measured against, per table.
GPU_PAIRS = {"lmforge eager": ("HF eager", "HF generate"),
             "lmforge compiled": ("HF compiled", "nanoGPT compiled", "HF static+compile")}


def _gpu(data: dict) -> list[Row]:
    # Speed rows: lmforge's time against each reference's in the same table (and batch); memory rows: LoRA's and
    # QLoRA's peak against full fine-tuning's.
    rows: list[Row] = []
    tables: dict[tuple, dict[str, dict]] = {}
    for r in data.get("rows", []):
        tables.setdefault((r["table"], r.get("batch")), {})[r["impl"]] = r
    for (name, batch), impls in tables.items():
        where = f"{name}, batch {batch}" if batch else name
        if name.startswith("memory"):
            full = impls.get("full")
            for method in ("lora", "qlora"):
                if full and full["peak_gib"] > 0 and method in impls:  # (no GPU memory counter on a CPU)
                    r = impls[method]
                    rows.append(Row("gpu", f"{where}: {method} peak", f"{r['peak_gib']:.2f} GiB",
                                    f"full {full['peak_gib']:.2f} GiB", r["peak_gib"] / full["peak_gib"], "lower"))
            continue
        for ours, references in GPU_PAIRS.items():
            for ref in references:
                if ours in impls and ref in impls:
                    a, b = impls[ours], impls[ref]
                    rows.append(Row("gpu", f"{where}: {ours}", f"{a['tok_s']:,.0f} tok/s",
                                    f"{ref} {b['tok_s']:,.0f} tok/s", a["tok_s"] / b["tok_s"], "higher"))
    return rows


def _price_tag_overhead(data: dict) -> list[Row]:
    # The accounting's share of the loop it accounts for: lower is better, the target is under 1%.
    return [Row("price_tag_overhead", f"per-step accounting, {data['steps']} steps of gpt-tiny",
                f"{data['accounting_us_per_step']:,.0f} us/step", f"loop {data['median_step_s'] * 1e3:,.1f} ms/step",
                data["accounting_share"], "lower")]


def _cli_startup(data: dict) -> list[Row]:
    # Seconds from process start to a printed --help, against a fresh `import torch`: lower is better (target 0.3).
    torch_s = data["median_s"]["import torch"]
    return [Row("cli_startup", name, f"{data['median_s'][name]:.2f} s", f"import torch {torch_s:.2f} s",
                data["median_s"][name] / torch_s, "lower") for name in ("lmforge --help", "lmforge finetune --help")]


def _serve_load(data: dict) -> list[Row]:
    # Per mode, every concurrency above 1 against concurrency 1 (the same load served one request at a time);
    # then each later mode against the first (fp32) at the lowest and highest concurrency. Rows without a mode
    # (records from before the modes) read as one unnamed mode.
    rows = []
    compiled = ", compiled" if data.get("compile") else ""
    for model, entry in data.get("models", {}).items():
        modes: dict[str | None, list[dict]] = {}
        for r in entry["rows"]:
            modes.setdefault(r.get("mode"), []).append(r)
        for mode, mine in modes.items():
            one = mine[0]
            for r in mine[1:]:
                rows.append(Row("serve_load", f"{model}{f' {mode}' if mode else ''}, {r['concurrency']} concurrent "
                                f"streams{compiled}", f"{r['tok_s']:,.1f} tok/s, p99 TTFT {r['ttft_p99']:.2f} s",
                                f"one at a time {one['tok_s']:,.1f} tok/s", r["tok_s"] / one["tok_s"], "higher"))
        first, *others = list(modes.items())
        for mode, mine in others:
            base = {r["concurrency"]: r for r in first[1]}
            for r in (mine[0], mine[-1]) if len(mine) > 1 else mine:
                b = base[r["concurrency"]]
                streams = f"{r['concurrency']} concurrent streams" if r["concurrency"] > 1 else "one stream"
                rows.append(Row("serve_load", f"{model} {mode} vs {first[0]}, {streams}{compiled}",
                                f"{r['tok_s']:,.1f} tok/s", f"{first[0]} {b['tok_s']:,.1f} tok/s",
                                r["tok_s"] / b["tok_s"], "higher"))
    return rows


def _generate_engines(data: dict) -> list[Row]:
    # Every lmforge mode against HF generate fp32 at the same batch; every other engine against the lmforge row of
    # its precision (``partner``); the fresh-process first compiled token, warm cache against cold; then each
    # engine that did not run, with what to install.
    rows: list[Row] = []
    at = {(r["batch"], r["impl"]): r for r in data.get("results", [])}

    def tok_s(r: dict) -> float:
        return r["tok_s"]["median"]

    def flags(r: dict) -> str:
        differ = r.get("checked") and r["precision"] == "fp32" and not r["identical"]
        return (" (tokens DIFFER)" if differ else "") + ("" if r.get("quiet", True) else " (machine busy)")

    for r in data.get("results", []):
        hf = at.get((r["batch"], "HF generate fp32"))
        if r["engine"] == "lmforge" and hf is not None:
            rows.append(Row("generate_engines", f"batch {r['batch']}: {r['impl']}{flags(r)}", f"{tok_s(r):,.1f} tok/s",
                            f"HF generate fp32 {tok_s(hf):,.1f} tok/s", tok_s(r) / tok_s(hf), "higher"))
        elif r.get("partner") in {impl for _, impl in at}:
            ours = at[(r["batch"], r["partner"])]
            rows.append(Row("generate_engines", f"batch {r['batch']}: {r['partner']} vs {r['impl']}{flags(r)}",
                            f"{tok_s(ours):,.1f} tok/s", f"{r['impl']} {tok_s(r):,.1f} tok/s",
                            tok_s(ours) / tok_s(r), "higher"))
    ttft = data.get("ttft")
    if ttft:
        for mode, what in (("compiled", "fp32"), ("int8_compiled", "int8")):
            if f"{mode}_warm" in ttft:
                # The second token is the decode step's first: compiled with a warm cache; with a cold one, compiled
                # (fp32, and int8 with --compile now) or eager (bare --compile does not wait for an int8 compile)
                warm, cold = ttft[f"{mode}_warm"]["second_output_s"], ttft[f"{mode}_cold"]["second_output_s"]
                now = ttft.get(f"{mode}_now_cold")
                reference = f"cold cache {cold:.1f} s" + (f" (--compile now: {now['second_output_s']:.1f} s)"
                                                          if now else "")
                rows.append(Row("generate_engines", f"fresh process to its second {what} token, warm compile cache",
                                f"{warm:.1f} s", reference, warm / cold, "lower"))
    rows += [Row("generate_engines", f"{engine}: not run", "-", why, None, "higher")
             for engine, why in data.get("skipped", {}).items()]
    return rows


def _generic(name: str, data: dict) -> list[Row]:
    """A benchmark without an adapter: every top-level number named like a ratio."""
    return [Row(name, key, "-", "-", float(value), "higher") for key, value in data.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and ("ratio" in key or "_over_" in key)]


ADAPTERS: dict[str, Callable[[dict], list[Row]]] = {
    "train_step": _train_step, "generate": _generate, "data_pipeline": _data_pipeline, "peft_memory": _peft_memory,
    "verify_cost": _verify_cost, "attention_scaling": _attention_scaling, "moe_vs_dense": _moe_vs_dense,
    "training_jobs": _training_jobs, "gpu": _gpu, "price_tag_overhead": _price_tag_overhead,
    "cli_startup": _cli_startup,
    "serve_load": _serve_load, "generate_engines": _generate_engines,
}


def rows_for(name: str, data: dict) -> list[Row]:
    """Table rows of one benchmark's JSON result (by its ``benchmark`` field, else the script name)."""
    kind = data.get("benchmark", name)
    try:
        return ADAPTERS[kind](data) if kind in ADAPTERS else _generic(name, data)
    except (KeyError, TypeError, ZeroDivisionError) as exc:
        raise ValueError(f"{name}: unexpected result format ({type(exc).__name__}: {exc})") from None


def table(rows: list[Row], failures: dict[str, str], skipped: dict[str, str] | None = None) -> str:
    """The aligned text table (failed and skipped benchmarks listed under it)."""
    header = ("benchmark", "case", "lmforge", "reference", "ratio")
    cells = [(r.benchmark, r.case, r.lmforge, r.reference,
              "-" if r.ratio is None else
              f"{r.ratio:.2f}x ({r.better} is better)" if r.ratio >= 0.01 else f"{r.ratio:.2g}x ({r.better} is better)")
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)).rstrip() for cell in cells]
    lines += [f"{name}: FAILED ({why})" for name, why in failures.items()]
    lines += [f"{name}: skipped ({why})" for name, why in (skipped or {}).items()]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- running
def find_dir(given: str | None) -> Path:
    """The benchmarks folder: ``given``, or ``benchmarks/`` of the source checkout lmforge was imported from."""
    folder = Path(given) if given else Path(lmforge.__file__).resolve().parents[2] / "benchmarks"
    if not folder.is_dir() or not any((folder / f"{n}.py").is_file() for n in BENCHMARKS):
        where = f"--dir {given}" if given else f"{folder} (beside the lmforge source tree)"
        raise UserError(f"no benchmarks found in {where}: they ship with the source checkout, not the installed "
                        "package; run from a checkout (pip install -e .) or pass --dir CHECKOUT/benchmarks")
    return folder


def run_script(script: Path, args: list[str], echo: bool, timeout: float | None) -> tuple[int, str, float]:
    """Run one benchmark script; returns (exit code, its output, seconds). Its lines are echoed to stderr."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=script.parent.parent, env=env)
    timer = threading.Timer(timeout, proc.kill) if timeout else None  # a silent hang must end too
    if timer is not None:
        timer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if echo:
                print(f"  {script.stem} | {line.rstrip()}", file=sys.stderr, flush=True)
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        if timer is not None:
            timer.cancel()
    if timeout and time.perf_counter() - start >= timeout and code != 0:
        lines.append(f"stopped after {timeout:g} s (--timeout)\n")
    return code, "".join(lines), time.perf_counter() - start


def run(args) -> int:
    folder = find_dir(args.dir)
    default = GPU_BENCHMARKS if args.device == "cuda" else BENCHMARKS
    names = [n.strip().removesuffix(".py") for n in args.only.split(",")] if args.only else list(default)
    unknown = [n for n in names if not (folder / f"{n}.py").is_file()]
    if unknown:
        raise UserError(f"--only: no benchmark {', '.join(unknown)} in {folder} "
                        f"(speed benchmarks: {', '.join(BENCHMARKS)})")
    results: dict[str, dict[str, Any]] = {}
    rows: list[Row] = []
    failures: dict[str, str] = {}
    skipped = {} if args.only else {name: why for name in names if (why := opt_in_missing(name))}
    began, start = datetime.now(timezone.utc), time.perf_counter()
    probe_start = probe_machine(folder, args.timeout) if args.json else None  # the record describes the machine
    for name in names:
        if name in skipped:
            print(f"lmforge bench: {name}.py skipped ({skipped[name]})", file=sys.stderr, flush=True)
            results[name] = {"skipped": skipped[name], "rows": []}
            continue
        flags = QUICK_FLAGS.get(name, []) if args.quick else []
        if args.device == "cuda" and name in GPU_BENCHMARKS:
            flags = flags + ["--device", "cuda"] + GPU_FLAGS.get(name, [])
        elif name == "gpu":  # its default device is cuda
            flags = flags + ["--device", args.device]
        flags += ["--nanogpt", args.nanogpt] if args.nanogpt and name == "gpu" else []
        print(f"lmforge bench: {name}.py {' '.join(flags)}".rstrip(), file=sys.stderr, flush=True)
        code, output, seconds = run_script(folder / f"{name}.py", flags, echo=not args.quiet, timeout=args.timeout)
        data = last_json(output)
        entry: dict[str, Any] = {"returncode": code, "seconds": round(seconds, 1), "result": data}
        if code != 0 or data is None:
            tail = output.strip().splitlines()[-1] if output.strip() else "no output"
            failures[name] = f"exit code {code}" if code else "no JSON result line"
            failures[name] += f"; last line: {tail[:160]}"
            entry["error"] = failures[name]
        else:
            try:
                found = rows_for(name, data)
            except ValueError as exc:
                failures[name] = str(exc)
                entry["error"] = str(exc)
                found = []
            rows += found
            entry["rows"] = [asdict(r) for r in found]
        results[name] = entry
    if args.json:
        probe_end = probe_machine(folder, args.timeout)
        print(json.dumps({"quick": args.quick, "command": command_line(args),
                          "date": began.isoformat(timespec="seconds"), "seconds": round(time.perf_counter() - start, 1),
                          "machine": machine_record(probe_start, probe_end), "benchmarks": results}))
    else:
        print(f"lmforge vs reference, measured side by side ({'--quick, ' if args.quick else ''}{_machine_line()})")
        print(table(rows, failures, skipped))
    return 1 if failures else 0


def opt_in_missing(name: str) -> str | None:
    """Why a plain ``lmforge bench`` leaves out the opt-in benchmark ``name`` (its packages are missing), or None."""
    if name not in OPT_IN:
        return None
    modules, install = OPT_IN[name]
    lacking = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"needs {', '.join(lacking)}: {install}" if lacking else None


def command_line(args) -> str:
    """The command that reproduces this run, as a user would type it."""
    words = ["lmforge", "bench"] + (["--quick"] if args.quick else []) + (["--json"] if args.json else [])
    words += ["--device cuda"] if args.device == "cuda" else []
    words += [f"--nanogpt {args.nanogpt}"] if args.nanogpt else []
    words += [f"--only {args.only}"] if args.only else []
    return " ".join(words + ([f"--timeout {args.timeout:g}"] if args.timeout else []))


def probe_machine(folder: Path, timeout: float | None) -> dict[str, Any] | None:
    """The machine record of ``folder/common.py`` (torch threads, versions, a bf16 matmul peak measured now),
    run in its own process like the benchmarks; None when the folder has no such script or it fails."""
    script = folder / "common.py"
    if not script.is_file():
        return None
    code, output, _ = run_script(script, [], echo=False, timeout=timeout)
    return last_json(output) if code == 0 else None


def machine_record(start: dict[str, Any] | None, end: dict[str, Any] | None) -> dict[str, Any]:
    """What the run's JSON says of the machine: the probe taken before the benchmarks (else the basic record),
    with the matmul peak and load average before and after, and whether the peak held (a busy host moves it)."""
    info = {**_machine(), **(start or {})}
    for key in ("bf16_matmul_gflops", "load_average"):
        info.pop(key, None)
        for when, probe in (("start", start), ("end", end)):
            if probe and probe.get(key) is not None:
                info[f"{key}_{when}"] = probe[key]
    peaks = info.get("bf16_matmul_gflops_start"), info.get("bf16_matmul_gflops_end")
    if None not in peaks:
        info["steady"] = abs(peaks[1] / peaks[0] - 1.0) <= STEADY_TOLERANCE
    return info


def _machine() -> dict[str, Any]:
    return machine_info()


def _machine_line() -> str:
    m = _machine()
    load = f", load average {m['load_average']}" if "load_average" in m else ""
    return f"{m['cpu']}, {m['cpu_count']} cores{load}"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="run the speed/memory benchmarks and print lmforge vs reference ratios",
        description="Run every speed and memory benchmark in the checkout's benchmarks/ folder (" +
                    ", ".join(BENCHMARKS) + "), each in its own process, read the JSON line each one ends with, "
                    "and print one table of lmforge against its reference (Hugging Face, raw tokenizers, full "
                    "fine-tuning). Exit code 1 when a benchmark fails.")
    parser.add_argument("--quick", action="store_true",
                        help="pass each benchmark its --quick option (fewer repeats, smaller sizes, no compile)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON record instead of the table: every result, the date, the command and "
                             "the machine (what benchmarks/performance_doc.py renders into docs/lab/performance.md)")
    parser.add_argument("--only", metavar="NAMES", default=None,
                        help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    parser.add_argument("--dir", metavar="DIR", default=None,
                        help="the benchmarks folder (default: benchmarks/ of the source checkout)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S", help="stop a benchmark after S seconds")
    parser.add_argument("--quiet", action="store_true", help="do not echo the benchmarks' own output")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: run the GPU tables instead (benchmarks/gpu.py: GPT-2 124M training against HF "
                             "and nanoGPT, bert-base and t5-base steps, generation, LoRA/QLoRA memory on llama-1b; "
                             "benchmarks/serve_load.py: lmforge serve of a GPT-2-shaped model in fp32 and bf16)")
    parser.add_argument("--nanogpt", metavar="DIR", default=None,
                        help="with --device cuda: a karpathy/nanoGPT checkout whose compiled GPT joins the training "
                             "table")
    parser.set_defaults(func=run)
