"""Render one ``lmforge bench --json`` record into docs/performance.md and the README's performance table.

Both come from the same record, so no figure appears in two places with two values. The README's table is
the text between ``<!-- bench:start -->`` and ``<!-- bench:end -->``; everything else in the README is left
alone. The record itself stays beside the page (docs/bench.json), so a reader can check every figure.

Usage::

    lmforge bench --json > docs/bench.json
    python -m benchmarks.performance_doc docs/bench.json --note "what else ran on the machine"

(``make bench-docs`` does both.) One benchmark measured on its own (a new one, or a rerun) joins the record
with its own provenance, which its section and the README's line then name beside the record's::

    lmforge bench --json --only serve_load > serve.json
    python -m benchmarks.performance_doc docs/bench.json --merge serve.json --note "what else ran then"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
RENDER = "python -m benchmarks.performance_doc docs/bench.json"


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

    >>> ratio(1.234), ratio(0.5, "lower"), ratio(None)
    ('1.23× (higher is better)', '0.50× (lower is better)', '-')
    """
    return "-" if value is None else f"{value:.2f}× ({better} is better)"


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _pct(value: float) -> str:
    return f"{value:.1%}"


# ------------------------------------------------------------------------------------------- the summary
def summary(record: dict) -> str:
    """The summary table: every row of every benchmark, lmforge against its reference (the README shows it)."""
    rows = [[r["benchmark"], r["case"], r["lmforge"], r["reference"], ratio(r["ratio"], r["better"])]
            for entry in record["benchmarks"].values() for r in entry.get("rows", [])]
    failed = [f"{name}: FAILED ({entry['error']})" for name, entry in record["benchmarks"].items()
              if entry.get("error")]
    return "\n\n".join([table(["benchmark", "case", "lmforge", "reference", "ratio"], rows)] + failed)


def provenance(record: dict) -> str:
    """One sentence: which run, when, on what (and the benchmarks measured in runs of their own)."""
    m = record["machine"]
    mode = "`--quick` sizes, " if record.get("quick") else ""
    own = "".join(f"; {name} by `{run['command']}` on {run['date'][:10]}" for name, run in separate_runs(record))
    return (f"Measured by `{record['command']}` on {record['date'][:10]} ({mode}{record['seconds'] / 60:.0f} min) on "
            f"{m['cpu']}, {m.get('cores', m.get('cpu_count'))} cores, {m.get('torch_threads', '?')} torch threads"
            f"{own}; details in [docs/performance.md](docs/performance.md).")


def separate_runs(record: dict) -> list[tuple[str, dict]]:
    """(benchmark, its run) of the benchmarks merged into ``record`` from runs of their own (``--merge``)."""
    return [(name, entry["run"]) for name, entry in record["benchmarks"].items() if entry.get("run")]


def run_sentence(run: dict) -> str:
    """Where a separately measured benchmark's figures come from: command, date, machine, load, note.

    >>> print(run_sentence({"command": "lmforge bench --json --only x", "date": "2026-01-02T03:04:05+00:00",
    ...                     "seconds": 90, "machine": {"cpu": "CPU", "cores": 2, "torch_threads": 2,
    ...                     "load_average_start": 3.1, "load_average_end": 4.2}, "note": "Busy."}))
    Measured in a run of its own: `lmforge bench --json --only x` on 2026-01-02T03:04:05+00:00 (1.5 minutes) on CPU, 2 cores, 2 torch threads; 1-minute load average 3.1 at the start, 4.2 at the end. Busy.
    """
    m = run["machine"]
    load = (f"; 1-minute load average {m['load_average_start']} at the start, {m['load_average_end']} at the end"
            if "load_average_end" in m else "")
    note = f" {run['note']}" if run.get("note") else ""
    return (f"Measured in a run of its own: `{run['command']}` on {run['date']} ({run['seconds'] / 60:.1f} minutes) "
            f"on {m['cpu']}, {m.get('cores', m.get('cpu_count'))} cores, {m.get('torch_threads', '?')} torch "
            f"threads{load}.{note}")


def merge(record: dict, new: dict, note: str | None = None) -> dict:
    """``record`` with the benchmarks of ``new`` (another ``lmforge bench --json`` record) in place of its own
    entries of the same names, each carrying ``new``'s command, date, duration, machine and ``note``."""
    run = {key: new[key] for key in ("command", "date", "seconds", "machine")}
    if note:
        run["note"] = note
    benchmarks = dict(record["benchmarks"])
    for name, entry in new["benchmarks"].items():
        benchmarks[name] = {**entry, "run": run}
    return {**record, "benchmarks": benchmarks}


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
    return (table(header, rows) + f"\n\nThe script's own bf16 matmul peak (the MFU denominator): "
            f"{_n(data['peak_gflops'])} GFLOP/s before its steps, {_n(data.get('peak_gflops_end', 0))} after ({steady}); "
            f"allocator: glibc {data.get('malloc', 'default')}.")


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
    return (table(["layer", "time slope, forward", "time slope, fwd + bwd", "memory slope"], slopes) +
            f"\n\nLinformer (k = {data['linformer_k']}) is faster than full attention from:\n\n" +
            table(["full attention", "pass", "from"], cross) +
            f"\n\nLengths {data['lengths'][0]} to {data['lengths'][-1]}, d = {data['d_model']}, median of "
            f"{data['repeats']}." + ("".join(f" {k} stopped: {v}." for k, v in data.get("stopped", {}).items())))


def serve_load_detail(data: dict) -> str:
    rows = []
    for model, entry in data["models"].items():
        one = entry["rows"][0]["tok_s"]
        for r in entry["rows"]:
            rows.append([model, r["concurrency"], f"{r['req_s']:.2f}", _n(r["tok_s"], 1),
                         f"{r['ttft_p50']:.3f} / {r['ttft_p99']:.3f}",
                         f"{r['token_ms_p50']:.1f} / {r['token_ms_p99']:.1f}",
                         "(one at a time)" if r["concurrency"] == 1 else f"{r['tok_s'] / one:.2f}×",
                         f"{r['load_before']} → {r['load_after']}"])
    header = ["model", "concurrency", "requests/s", "generated tok/s", "TTFT p50 / p99 (s)",
              "per token p50 / p99 (ms)", "tok/s vs one at a time", "load average"]
    verdicts = []
    for model, entry in data["models"].items():
        top = entry["rows"][-1]
        verdicts.append(f"{model}: {entry['speedup_vs_one_at_a_time']:.2f}× and p99 TTFT {top['ttft_p99']:.2f} s at "
                        f"concurrency {top['concurrency']} ({'met' if entry['target_met'] else 'missed'})")
    return (table(header, rows) +
            f"\n\n{data['requests']} requests of {data['prompt_tokens']}-token prompts and {data['new_tokens']} new "
            f"tokens per load, {data['threads']} server threads, "
            f"{'compiled' if data.get('compile') else 'eager'} decode steps. Target: at concurrency 16, generated "
            f"tokens/s at least {data['target_speedup']:g}× concurrency 1, with p99 TTFT under "
            f"{data['target_ttft_p99_s']:g} s: " + "; ".join(verdicts) + ".")


DETAILS = {"train_step": train_step_detail, "generate": generate_detail, "data_pipeline": data_pipeline_detail,
           "peft_memory": peft_memory_detail, "verify_cost": verify_cost_detail,
           "attention_scaling": attention_scaling_detail, "serve_load": serve_load_detail}

# What each benchmark runs and against what: the method, which the figures above do not carry.
METHODS = {
    "train_step": """\
`benchmarks/train_step.py`: one training step (forward, loss, backward, fused AdamW) under bf16 autocast, batch
8 × 256, vocab 8192, on the tiny GPT, BERT (masked LM, 15% of positions) and T5 (span-corruption target lengths)
shapes. **Reference**: the same shapes built from Hugging Face transformers (`GPT2LMHeadModel`,
`BertForMaskedLM`, `T5ForConditionalGeneration`), eager. The compiled rows compile lmforge with
`mode="max-autotune-no-cudagraphs"`; HF stays eager unless `--compile-hf`. `--nanogpt DIR` adds karpathy/nanoGPT's
`model.py` from a checkout as a second reference on the GPT shape. MFU is against the bf16 matmul peak the script
measures before its steps; it measures it again after them and marks the run unsteady when it moved by more than
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
1, fp32, for n = 128 … 8192 doubling: full self-attention through SDPA and through the written-out softmax,
Linformer (k = 256), a one-layer LSTM and a kernel-3 1-D convolution; forward and forward + backward time, and the
peak memory of forward + backward. **Reference**: full attention; the ratio is its time over Linformer's at the
longest length both ran. Slopes are log-log fits over each layer's three longest lengths."""

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

METHODS["verify_cost"] = """\
`benchmarks/verify_cost.py`: what integrity checking adds to loading a model folder. A randomly initialised
`gpt2` (124M parameters, fp32) is saved, then `lmforge.load(path)` (sizes and sha256 of every file checked
against `manifest.json`) is timed against `lmforge.load(path, verify=False)` (`--no-verify`), interleaved and
rotated after a warm-up, so both read from the page cache. Both include what every load does: reading the
tensors and checking their shapes and that they are finite. **Reference**: the unchecked load."""

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
            ["platform", m.get("platform")], ["bf16 matmul peak (2048³)", peak],
            ["1-minute load average", load]]
    text = table(["", ""], rows)
    if m.get("steady") is False:
        text += "\n\nThe matmul peak moved by more than 15% during the run: another process took CPU time."
    if note:
        text += f"\n\n{note}"
    return text


def page(record: dict, note: str | None = None) -> str:
    """docs/performance.md for one ``lmforge bench --json`` record."""
    parts = [
        "# Performance",
        "<!-- Generated by benchmarks/performance_doc.py from docs/bench.json: edit those, not this page. -->",
        f"Every figure on this page comes from one run of `{record['command']}` on {record['date']} "
        f"({record['seconds'] / 60:.1f} minutes{', `--quick` sizes' if record.get('quick') else ''})"
        + (f", except those of {', '.join(name for name, _ in separate_runs(record))}, whose sections name their "
           f"own run" if separate_runs(record) else "") +
        f"; the machine is described [at the end](#machine). The README's table is the summary below, generated "
        f"from the same record ([bench.json](bench.json)).",
        "## Reproduce",
        f"```bash\n{record['command']} > docs/bench.json   # or: make bench-docs\n{RENDER}\n```",
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
        if entry.get("run"):
            parts.append(run_sentence(entry["run"]))
        data = _result(record, name)
        if data is None:
            parts.append(f"This benchmark failed in this run: {entry.get('error', 'no result')}.")
        elif name in DETAILS:
            parts.append(DETAILS[name](data))
        parts.append(f"Took {entry['seconds']:.0f} s.")
    parts += [WHY, "## Machine", machine_section(record, note),
              "Quality benchmarks (accuracy, BLEU, loss curves: minutes to hours of training each) are not part of "
              "`lmforge bench`; their scripts and latest results are in [quality.md](quality.md)."]
    return "\n\n".join(parts) + "\n"


def readme_block(record: dict) -> str:
    """The README's performance table and its one line of provenance."""
    return f"{START}\n{summary(record)}\n\n{provenance(record)}\n{END}"


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the bench markers (markers included) replaced by ``block``.

    >>> replace_block("a\\n<!-- bench:start -->\\nold\\n<!-- bench:end -->\\nb", "NEW")
    'a\\nNEW\\nb'
    """
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"the README has no {START} ... {END} block to fill")
    return text[:start] + block + text[end + len(END):]


def _read(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except ValueError:  # lmforge bench's output with something before it: the record is the last line
        return json.loads(text.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="the output of `lmforge bench --json` (e.g. docs/bench.json)")
    parser.add_argument("--note", default=None, help="a sentence on the machine's state (what else was running)")
    parser.add_argument("--merge", type=Path, default=None, metavar="RECORD",
                        help="another lmforge bench --json record (e.g. --only one benchmark): its benchmarks replace "
                             "the record's own, with their run's provenance; --note then describes that run")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args(argv)
    record = _read(args.record)
    if args.merge is not None:
        record = merge(record, _read(args.merge), args.note)
    elif args.note:
        record["note"] = args.note
    args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")  # indented, for readers
    args.doc.write_text(page(record, record.get("note")), encoding="utf-8")
    args.readme.write_text(replace_block(args.readme.read_text(encoding="utf-8"), readme_block(record)),
                           encoding="utf-8")
    print(f"wrote {args.doc} and the performance table of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
