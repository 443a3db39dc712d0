"""What every benchmark script shares: the interleaved timer, device sync, memory readings, other processes'
CPU use during a run, the bf16 matmul peak and the machine record.

Nothing here imports torch at module level: scripts that cap the BLAS/OpenMP thread pools must be able to set
their environment variables after importing this module and before torch starts those pools.

Run as a script, it prints the machine record (with a freshly measured matmul peak) as one JSON line;
``lmforge bench`` runs it before and after the benchmarks, so a busy host shows as a peak that moved::

    $ python benchmarks/common.py
    {"cpu": "...", "cores": 2, "torch_threads": 2, "torch": "2.13.0", ..., "bf16_matmul_gflops": 381.2}
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from importlib import metadata
from typing import Any, Callable

Step = Callable[[], object]

# A process that compiled a decode step packages its layer in a child process as it exits
# (lmforge.generation.packaged_region): that build would share the cores with the next benchmark's timed runs.
# Benchmarks turn it off, unless a run asks for it (generate_engines.py's fresh processes, whose warm rows need it).
os.environ.setdefault("LMFORGE_COMPILE_PACKAGE", "off")


def src_env(src=None, **extra: str) -> dict[str, str]:
    """This process's environment for a child process the benchmark starts: ``src`` (default: this checkout's
    ``src``) first on PYTHONPATH, without an empty entry when PYTHONPATH is unset (one would put the working
    folder on the path), and ``extra`` variables over it."""
    from pathlib import Path

    src = src or Path(__file__).resolve().parents[1] / "src"
    path = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, **extra}


def quiet_transformers() -> None:
    """Keep transformers offline and silent: a benchmark measures code, not downloads or a log flood."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # from_pretrained's weight-loading bar


def single_thread_pools() -> None:
    """Cap numpy's and torch's OpenMP/BLAS pools at one thread unless the caller set them. Call before
    importing numpy or torch: on a shared CPU, idle pool threads spin-wait at every barrier, and a second
    thread can make a step many times slower than one."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def sync(device: str) -> None:
    """Wait for the device's queued work, so a timer around a step measures the step (a no-op on the CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def run_interleaved(steps: list[Step], device: str = "cpu", warmup: int = 0, repeats: int = 5,
                    rotate: bool = False) -> tuple[list[list[float]], list[list[int]]]:
    """Run every step ``warmup`` times, then ``repeats`` times each, taking turns (a, b, a, b, ...), so the
    slow drifts of a shared machine hit all of them alike. With ``rotate`` each round starts one step later
    (a, b; b, a; ...), so no step always runs right after the same neighbour. Returns, per step, the seconds
    and the minor page faults of every timed run.

    >>> calls = []
    >>> seconds, faults = run_interleaved([lambda: calls.append("a"), lambda: calls.append("b")], repeats=2,
    ...                                   rotate=True)
    >>> "".join(calls), len(seconds[0]), len(faults[1])
    ('abba', 2, 2)
    """
    for _ in range(warmup):
        for step in steps:
            step()
    times: list[list[float]] = [[] for _ in steps]
    faults: list[list[int]] = [[] for _ in steps]
    for i in turns(len(steps), repeats, rotate):
        sync(device)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        steps[i]()
        sync(device)
        times[i].append(time.perf_counter() - t0)
        faults[i].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return times, faults


def turns(n: int, repeats: int, rotate: bool = False) -> list[int]:
    """The order :func:`run_interleaved` runs ``n`` steps in, ``repeats`` rounds (each one step later with ``rotate``).

    >>> turns(3, 2), turns(3, 2, rotate=True)
    ([0, 1, 2, 0, 1, 2], [0, 1, 2, 1, 2, 0])
    """
    order = list(range(n))
    return [i for r in range(repeats) for i in (order[r % n:] + order[:r % n] if rotate else order)]


# ------------------------------------------------------------------------------------------- other processes
def cpu_snapshot() -> tuple[float, float, float]:
    """(wall clock, busy CPU seconds of the whole machine since boot, this process's CPU seconds) now: two of
    them bracket a run for :func:`others_share`. The machine's figure is /proc/stat's (all but idle and iowait;
    Linux), in clock ticks, so runs much shorter than a tick or two read noisily."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    usage = resource.getrusage(resource.RUSAGE_SELF)
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    return time.perf_counter(), busy, usage.ru_utime + usage.ru_stime + sum(map(_cpu_seconds, OWN_PIDS))


# Worker processes whose CPU time counts as this process's own in cpu_snapshot (an engine run in its own process).
OWN_PIDS: set[int] = set()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def others_share(start: tuple[float, float, float], end: tuple[float, float, float], cores: int | None = None) -> float:
    """The share of the machine's cores that other processes kept busy between two :func:`cpu_snapshot` s:
    0.0 when this process had the machine to itself, 0.5 when others used half of its cores.

    >>> round(others_share((0.0, 10.0, 1.0), (2.0, 13.0, 2.5), cores=2), 3)  # 3 s busy, 1.5 s of it ours
    0.375
    """
    wall = max(end[0] - start[0], 1e-9)
    others = (end[1] - start[1]) - (end[2] - start[2])
    # /proc/stat counts in clock ticks: a run shorter than a tick can see one pass, so clamp to the whole machine.
    return min(1.0, max(0.0, others) / (wall * (cores or os.cpu_count() or 1)))


def run_watched(steps: list[Step], repeats: int = 5, rotate: bool = True) -> list[list[tuple[float, float]]]:
    """Like :func:`run_interleaved` (CPU steps, no warm-up): per step, ``(seconds, others)`` of every timed run,
    ``others`` being :func:`others_share` during it, so runs that other processes slowed can be left out.

    >>> [[(s >= 0, 0 <= o <= 1) for s, o in runs] for runs in run_watched([lambda: None], repeats=2)]
    [[(True, True), (True, True)]]
    """
    runs: list[list[tuple[float, float]]] = [[] for _ in steps]
    for i in turns(len(steps), repeats, rotate):
        start = cpu_snapshot()
        steps[i]()
        end = cpu_snapshot()
        runs[i].append((end[0] - start[0], others_share(start, end)))
    return runs


def quiet_spread(runs: list[tuple[float, float]], max_others: float = 0.1) -> dict[str, Any]:
    """Median, min and max seconds over the runs during which other processes used at most ``max_others`` of the
    machine (all runs when fewer than two were that quiet, with ``quiet`` False); ``disturbed`` counts the others.

    >>> quiet_spread([(1.0, 0.0), (3.0, 0.5), (2.0, 0.05)])
    {'median': 1.5, 'min': 1.0, 'max': 2.0, 'runs': 3, 'disturbed': 1, 'quiet': True}
    """
    calm = [s for s, o in runs if o <= max_others]
    used = calm if len(calm) >= 2 else [s for s, _ in runs]
    return {"median": statistics.median(used), "min": min(used), "max": max(used), "runs": len(runs),
            "disturbed": len(runs) - len(calm), "quiet": len(calm) >= 2}


def time_steps(steps: list[Step], device: str = "cpu", warmup: int = 0, repeats: int = 5,
               rotate: bool = False) -> list[tuple[float, float]]:
    """For each step, its median seconds and median minor page faults per run, timed by :func:`run_interleaved`.

    >>> [(round(s), f >= 0) for s, f in time_steps([lambda: None], warmup=1, repeats=3)]
    [(0, True)]
    """
    times, faults = run_interleaved(steps, device, warmup, repeats, rotate)
    return [(statistics.median(t), statistics.median(f)) for t, f in zip(times, faults)]


# ------------------------------------------------------------------------------------------- memory readings
def rss_bytes() -> int:
    """The process's resident memory now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> bool:
    """Reset VmHWM (peak RSS) to the current RSS; False if the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    """The process's peak resident memory since start (or since :func:`reset_peak`)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ------------------------------------------------------------------------------------------- data
def corpus_text(chars: int | None = None) -> str:
    """The bundled corpus (Austen), or its first ``chars`` characters."""
    import gzip

    from lmforge import datasets

    return gzip.decompress(datasets.path("corpus").read_bytes()).decode("utf-8")[:chars]


def prepared_corpus(root, chars: int, vocab_size: int):
    """The first ``chars`` characters of the bundled corpus, with a byte-BPE tokenizer of ``vocab_size`` trained on
    them and prepared as ``root/data`` (5% validation): a training run's data, made in a few seconds."""
    from pathlib import Path

    from lmforge.data.prepare import prepare
    from lmforge.tokenization import train_tokenizer

    root = Path(root)
    text = root / "corpus.txt"
    text.write_text(corpus_text(chars), encoding="utf-8")
    tok = train_tokenizer([text], kind="byte-bpe", family="gpt", vocab_size=vocab_size, show_progress=False)
    prepare([text], tok, root / "data", val_fraction=0.05, progress=False)
    return root / "data"


# ------------------------------------------------------------------------------------------- the machine
def train_precision(device: str = "cpu") -> str:
    """``bf16`` where ``device`` computes it natively (a CPU with AVX512-BF16 or AMX, most GPUs), else ``fp32``: the
    precision the training benchmarks run both sides in. Emulated bf16 would time oneDNN's fallback, many times
    slower than fp32."""
    from lmforge.utils.machine import native_bf16

    return "bf16" if native_bf16(device) else "fp32"


def matmul_peak(device: str = "cpu", n: int = 2048, repeats: int = 10, dtype: str = "bf16",
                max_seconds: float = 0.25) -> float:
    """Median GFLOP/s of an n x n x n matmul in ``dtype`` (bf16 | fp32): the MFU denominator, and a probe of how
    busy the host is. The size starts at 256 and doubles up to ``n`` while one matmul of the next size would stay
    under ``max_seconds``: where ``dtype`` is emulated (bf16 on a CPU without AVX512-BF16 or AMX) a 2048-cube
    matmul takes seconds, and the probe must not cost minutes. A smaller cube reads a little under the peak."""
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]

    def one(size: int) -> tuple[float, Step]:
        a = torch.randn(size, size, device=device, dtype=torch_dtype)
        b = torch.randn(size, size, device=device, dtype=torch_dtype)
        seconds, _ = run_interleaved([lambda: a @ b], device, warmup=1, repeats=1)
        return seconds[0][0], lambda: a @ b

    size = min(256, n)
    seconds, step = one(size)
    while size * 2 <= n and seconds * 8 <= max_seconds:  # the next size costs ~8x this one
        size *= 2
        seconds, step = one(size)
    times, _ = run_interleaved([step], device, warmup=2, repeats=repeats)
    return 2 * size**3 / statistics.median(times[0]) / 1e9


def steady(peak_start: float, peak_end: float, tolerance: float = 0.15) -> bool:
    """Whether the matmul peak measured after a run is within ``tolerance`` of the one before it. On a
    shared host the FMA units' throughput can drop mid-run (a busy neighbour); matmul-bound steps slow
    more than memory-bound ones, so the ratios of such a run understate lmforge's and MFU is off.

    >>> steady(400.0, 380.0), steady(400.0, 300.0)
    (True, False)
    """
    return abs(peak_end / peak_start - 1.0) <= tolerance


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info(peak: bool = True) -> dict[str, Any]:
    """The machine a benchmark ran on: lmforge's machine record (CPU model, cores, torch threads, load
    average) plus library versions and, with ``peak``, the bf16 matmul peak measured now."""
    import torch

    from lmforge.utils.machine import machine_info as lmforge_machine

    base = lmforge_machine(torch_details=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    info: dict[str, Any] = {
        "cpu": base["cpu"], "cores": base["cpu_count"], "torch_threads": base["torch_threads"], "device": device,
        "gpu": base.get("gpu"), "python": base["python"], "torch": torch.__version__,
        "transformers": _version("transformers"), "tokenizers": _version("tokenizers"), "platform": base["platform"],
        "load_average": base.get("load_average"),
    }
    if peak:
        info["bf16_matmul_gflops"] = round(matmul_peak(device), 1)
    return info

if __name__ == "__main__":
    print(json.dumps(machine_info(peak="--no-peak" not in sys.argv[1:])))
