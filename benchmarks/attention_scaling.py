"""How attention's time and memory grow with sequence length, measured: the lecture's complexity table.

    layer                          time per layer      memory (activations)
    full self-attention            O(n^2 d)            O(n^2) scores per head
    Linformer (k = 256)            O(n k d)            O(n k)
    LSTM (one layer)               O(n d^2), serial    O(n d)
    1-D convolution (kernel 3)     O(n d^2 k)          O(n d)

One layer of each at width d = 256 (4 heads), batch 1, fp32, one thread (``--threads``), for n = 128, 256, ...,
8192: full attention both through SDPA (fused kernels) and through the written-out softmax (``Attention._probs``,
the path bf16 training on a CPU takes), lmforge's Linformer attention (:mod:`lmforge.nn.linformer`), ``nn.LSTM``
and ``nn.Conv1d``. For each: the forward time (no gradients), the forward + backward time, and the peak memory
of the forward + backward above what was allocated before it (CUDA: ``max_memory_allocated``; CPU: peak RSS,
with glibc's mmap threshold pinned as in ``peft_memory.py`` so that freed tensors leave the RSS). The layers are
timed in turns at each length (``common.time_steps``), so a busy host slows them alike.

A layer stops at the length where it ran out of memory, or before one whose predicted peak (the last growth
factor applied again) passes ``--memory-gb``.

Output: one line per (layer, n); the fitted log-log slopes over the longest lengths (time: expect ~2 for full
attention, ~1 for the others; memory likewise); the crossover, the shortest length from which Linformer is
faster than full attention at every longer one (and a log-log interpolation between the neighbours); a log-log
plot (``--plot``, needs matplotlib); then one JSON line.

Usage:
    python benchmarks/attention_scaling.py             # n = 128 .. 8192, 3 repeats, 1 thread
    python benchmarks/attention_scaling.py --quick     # n = 128 .. 1024, 2 repeats
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import machine_info, peak_bytes, reset_peak, rss_bytes, sync, time_steps  # noqa: E402

LAYERS = ("full-sdpa", "full-matmul", "linformer", "lstm", "conv")
FULL = ("full-sdpa", "full-matmul")


def _pin_malloc() -> None:
    """Re-run this process with glibc's mmap threshold fixed, so freed large tensors leave the RSS (see
    ``peft_memory.py``): otherwise the RSS peak measures the allocator's history as much as the tensors."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and sys.platform.startswith("linux"):
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
        os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]])


def build_layers(d: int, heads: int, k: int, max_len: int, device: str) -> dict[str, tuple[Callable, Any]]:
    """name -> (``run(x)`` for x (1, n, d): the layer's forward, the attention paths forced as named; the module)."""
    import torch
    from torch import nn

    from lmforge.config import ModelConfig
    from lmforge.nn import attention as attention_module
    from lmforge.nn.attention import Attention, AttentionContext

    cfg = ModelConfig(arch="encoder", head="none", position="none", vocab_size=8, d_model=d, n_heads=heads,
                      d_ff=4 * d, n_layers=1, max_seq_len=max_len)
    full = Attention(cfg).to(device)
    linformer = Attention(cfg.replace(attention="linformer", linformer_k=min(k, max_len))).to(device)
    lstm = nn.LSTM(d, d, batch_first=True).to(device)
    conv = nn.Conv1d(d, d, kernel_size=3, padding=1).to(device)
    original = attention_module.use_matmul_attention

    def attend(layer, matmul: bool):
        def run(x):
            attention_module.use_matmul_attention = lambda q, k, mask: matmul
            try:
                return layer(x, AttentionContext())
            finally:
                attention_module.use_matmul_attention = original
        return run

    return {
        "full-sdpa": (attend(full, False), full),
        "full-matmul": (attend(full, True), full),
        "linformer": (attend(linformer, False), linformer),
        "lstm": (lambda x: lstm(x)[0], lstm),
        "conv": (lambda x: conv(x.transpose(1, 2)).transpose(1, 2), conv),
    }


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower() or "can't allocate" in str(exc)


def measure(run: Callable, module, n: int, d: int, device: str) -> dict[str, float]:
    """Peak memory (MB) of one forward + backward at length n, above what was allocated before it."""
    import torch

    x = torch.randn(1, n, d, device=device)
    run(x).sum().backward()  # a first run allocates the kernels' workspaces; the peak is measured on the second
    module.zero_grad(set_to_none=True)
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = rss_bytes()
        reset_peak()
    run(x).sum().backward()
    sync(device)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else peak_bytes()
    module.zero_grad(set_to_none=True)
    return {"peak_mb": max(peak - before, 0) / 2**20}


def fit_slope(ns: list[int], values: list[float]) -> float | None:
    """Least-squares slope of log(value) against log(n); None with fewer than two points.

    >>> round(fit_slope([128, 256, 512], [1.0, 4.0, 16.0]), 6)
    2.0
    """
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, values) if v > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var if var else None


def crossover(ns: list[int], fast: list[float | None], slow: list[float | None]) -> dict[str, float] | None:
    """The first measured length from which ``fast`` < ``slow`` at every longer one, and a log-log interpolation of
    where the two curves cross between it and the length before; None if it never holds.

    >>> crossover([128, 256, 512], [2.0, 2.0, 2.0], [1.0, 2.5, 5.0])
    {'n': 256, 'interpolated_n': 216.0}
    """
    pairs = [(n, f, s) for n, f, s in zip(ns, fast, slow) if f is not None and s is not None]
    first = None
    for i in range(len(pairs) - 1, -1, -1):
        if pairs[i][1] < pairs[i][2]:
            first = i
        else:
            break
    if first is None:
        return None
    n = pairs[first][0]
    if first == 0:
        return {"n": n, "interpolated_n": float(n)}
    (n0, f0, s0), (n1, f1, s1) = pairs[first - 1], pairs[first]
    g0, g1 = math.log(f0 / s0), math.log(f1 / s1)  # log ratio goes from >= 0 to < 0
    t = g0 / (g0 - g1) if g0 != g1 else 1.0
    return {"n": n, "interpolated_n": round(math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0))), 0)}


def plot(rows: list[dict], path: Path) -> str | None:
    """Log-log plot of forward, forward + backward time and peak memory against n; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, key, label in zip(axes, ("forward_s", "forward_backward_s", "peak_mb"),
                              ("forward (s)", "forward + backward (s)", "peak memory (MB)")):
        for layer in LAYERS:
            pts = [(r["n"], r[key]) for r in rows if r["layer"] == layer and r.get(key)]
            if pts:
                ax.loglog(*zip(*pts), marker="o", label=layer, base=2)
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("one layer, d = 256: time and memory against length")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-len", type=int, default=128, help="shortest sequence length (default 128)")
    parser.add_argument("--max-len", type=int, default=8192, help="longest sequence length; doubling (default 8192)")
    parser.add_argument("--d-model", type=int, default=256, help="layer width d (default 256)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--linformer-k", type=int, default=256, help="Linformer's projected length k (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per layer and length (median reported)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared CPU a second thread spin-waits at every "
                             "barrier, and the LSTM's thousands of small steps slow down many times)")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="stop a layer before a length whose predicted peak passes this (default: 3/4 of the "
                             "device's memory)")
    parser.add_argument("--fit-points", type=int, default=3,
                        help="how many of each layer's longest lengths the slopes fit (default 3)")
    parser.add_argument("--plot", default=None, help="where to write the log-log plot (default: the temp folder)")
    parser.add_argument("--quick", action="store_true", help="n = 128 .. 1024, 2 repeats")
    args = parser.parse_args()
    if args.quick:
        args.max_len, args.repeats = min(args.max_len, 1024), min(args.repeats, 2)
    _pin_malloc()

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.memory_gb is None:
        total = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else \
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        args.memory_gb = 0.75 * total / 2**30
    lengths = []
    n = args.min_len
    while n <= args.max_len:
        lengths.append(n)
        n *= 2
    layers = build_layers(args.d_model, args.heads, args.linformer_k, lengths[-1], device)
    runs = {name: run for name, (run, _) in layers.items()}

    rows: list[dict[str, Any]] = []
    alive = list(LAYERS)
    stopped: dict[str, str] = {}
    last_peak: dict[str, list[float]] = {name: [] for name in LAYERS}
    print(f"one layer, d={args.d_model}, {args.heads} heads, Linformer k={args.linformer_k}, batch 1, fp32, {device}, "
          f"{torch.get_num_threads()} threads; median of {args.repeats}")
    for n in lengths:
        x = torch.randn(1, n, args.d_model, device=device)
        measured: dict[str, dict[str, float]] = {}
        for name in list(alive):
            peaks = last_peak[name]
            if peaks:
                growth = peaks[-1] / peaks[-2] if len(peaks) > 1 and peaks[-2] > 0 else 4.0
                if peaks[-1] * growth > args.memory_gb * 1024:
                    alive.remove(name)
                    stopped[name] = f"predicted peak at n={n} passes {args.memory_gb:.1f} GB"
                    continue
            try:
                measured[name] = measure(*layers[name], n, args.d_model, device)
                peaks.append(measured[name]["peak_mb"])
            except (RuntimeError, MemoryError) as exc:
                if not _is_oom(exc):
                    raise
                alive.remove(name)
                stopped[name] = f"out of memory at n={n}"
        names = list(measured)

        def forward(name):
            def step():
                with torch.no_grad():
                    runs[name](x)
            return step

        def forward_backward(name):
            def step():
                runs[name](x).sum().backward()
            return step

        fwd = time_steps([forward(nm) for nm in names], device, warmup=1, repeats=args.repeats, rotate=True)
        fwd_bwd = time_steps([forward_backward(nm) for nm in names], device, warmup=1, repeats=args.repeats,
                             rotate=True)
        for name, (f, _), (fb, _) in zip(names, fwd, fwd_bwd):
            row = {"layer": name, "n": n, "forward_s": round(f, 6), "forward_backward_s": round(fb, 6),
                   "peak_mb": round(measured[name]["peak_mb"], 2)}
            rows.append(row)
            print(f"  {name:12s} n={n:5d}  forward {f * 1e3:9.3f} ms  fwd+bwd {fb * 1e3:9.3f} ms  "
                  f"peak {row['peak_mb']:9.1f} MB")
        del x
        gc.collect()

    slopes: dict[str, dict[str, float | None]] = {}
    for name in LAYERS:
        mine = [r for r in rows if r["layer"] == name][-args.fit_points:]
        ns = [r["n"] for r in mine]
        slopes[name] = {key: (None if (s := fit_slope(ns, [r[key] for r in mine])) is None else round(s, 3))
                        for key in ("forward_s", "forward_backward_s", "peak_mb")}
    print(f"fitted log-log slopes over each layer's {args.fit_points} longest lengths (time ~ n^slope):")
    for name, s in slopes.items():
        print(f"  {name:12s} forward {s['forward_s']}  fwd+bwd {s['forward_backward_s']}  memory {s['peak_mb']}")

    def series(layer: str, key: str) -> list[float | None]:
        by_n = {r["n"]: r[key] for r in rows if r["layer"] == layer}
        return [by_n.get(n) for n in lengths]

    crossovers, at_longest = {}, {}
    for full in FULL:
        crossovers[full] = {key: crossover(lengths, series("linformer", key), series(full, key))
                            for key in ("forward_s", "forward_backward_s")}
        both = [n for n in lengths if series("linformer", "forward_backward_s")[lengths.index(n)] is not None
                and series(full, "forward_backward_s")[lengths.index(n)] is not None]
        if both:
            n = both[-1]
            at_longest[full] = {"n": n, "linformer_s": series("linformer", "forward_backward_s")[lengths.index(n)],
                                "full_s": series(full, "forward_backward_s")[lengths.index(n)]}
        print(f"Linformer faster than {full} from n = {crossovers[full]}")
    for name, why in stopped.items():
        print(f"  {name} stopped: {why}")
    out = Path(args.plot) if args.plot else Path(tempfile.gettempdir()) / "attention_scaling.png"
    plotted = plot(rows, out)
    print(f"plot: {plotted}" if plotted else "plot: skipped (matplotlib is not installed)")
    print(json.dumps({"benchmark": "attention_scaling", "device": device, "d_model": args.d_model,
                      "heads": args.heads, "linformer_k": args.linformer_k, "lengths": lengths,
                      "repeats": args.repeats, "threads": torch.get_num_threads(), "results": rows,
                      "slopes": slopes, "crossover": crossovers,
                      "at_longest": at_longest, "stopped": stopped, "plot": plotted,
                      "machine": machine_info(peak=False)}))


if __name__ == "__main__":
    main()
