"""What a run reports: ``metrics.jsonl``, TensorBoard events, ``loss.png`` and a progress bar.

    OUT/metrics.jsonl     one JSON object per optimizer step: step, loss (token mean), lr, grad_norm (before
                          clipping), tokens (input ids of the step), targets (labelled tokens), tokens_per_s,
                          wall_s (the training loop's seconds so far, over resumes: the price tag's), total_s
                          (seconds since this process started: imports, data and model loading included),
                          plus eval_loss / eval_ppl / eval_accuracy on evaluation steps
    OUT/tensorboard/      the same scalars as TensorBoard events (train/*, eval/*)
    OUT/loss.png          training loss per step and evaluation loss, redrawn at every evaluation,
                          checkpoint and at the end

``metrics.jsonl`` is the source of truth. On resume from step ``N`` its lines for steps after ``N`` (logged
before a crash, then lost with the unsaved steps) are dropped, and TensorBoard is told to purge them, so the
files read as if the run had never stopped. TensorBoard and matplotlib are optional: without them the run
goes on, with one warning.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> log = RunLogger(out, start_step=0, max_steps=2, progress=False, tensorboard=False)
    >>> log.log({"step": 1, "loss": 2.5, "tokens": 64}); log.log({"step": 2, "loss": 2.0, "tokens": 64})
    >>> log.close()
    >>> [r["loss"] for r in read_metrics(out / "metrics.jsonl")]
    [2.5, 2.0]
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from lmforge.utils.faults import environment_errors
from lmforge.utils.figures import figure, png
from lmforge.utils.io import atomic_write_bytes, atomic_write_text, make_folder

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
PLOT_FILE = "loss.png"


_IMPORTED = time.time()


def process_seconds() -> float:
    """Seconds since this process started (Linux: from /proc; elsewhere: since this module was imported).

    >>> 0 < process_seconds() < 1e6
    True
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time after boot
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.time() - _IMPORTED


def summary_line(loop_s: float, tokens: int, sizes: dict[str, int] | None = None, kept: str = "full") -> str:
    """The end-of-run summary of a job: its loop, total time and throughput, and what its final checkpoint
    holds against what ``final_checkpoint`` weights / none would save.

    >>> line = summary_line(10.0, 5000, {"weights": 90 * 2**20, "optimizer": 180 * 2**20}, "full")
    >>> line.startswith("loop 10.0 s, total "), line.split("; ")[1:]
    (True, ['final checkpoint full: 270 MB (weights 90 MB, optimizer state 180 MB)', 'final_checkpoint weights saves 180 MB, none saves 270 MB'])
    """
    text = f"loop {loop_s:.1f} s, total {process_seconds():.1f} s, {tokens / max(loop_s, 1e-9):,.0f} tokens/s"
    if sizes:
        mb = {k: v / 2**20 for k, v in sizes.items()}
        held = {"full": mb["weights"] + mb["optimizer"], "weights": mb["weights"], "none": 0.0}
        saves = ", ".join(f"{k} saves {held[kept] - held[k]:,.0f} MB" for k in ("full", "weights", "none")
                          if k != kept and held[kept] > held[k])
        text += (f"; final checkpoint {kept}: {held[kept]:,.0f} MB (weights {mb['weights']:,.0f} MB, optimizer "
                 f"state {mb['optimizer']:,.0f} MB)" + (f"; final_checkpoint {saves}" if saves else ""))
    return text


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``, skipping a line cut short by a crash."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


def truncate_metrics(path: str | Path, last_step: int) -> None:
    """Keep only the records with ``step <= last_step`` (atomically rewritten)."""
    path = Path(path)
    if path.exists():
        kept = [r for r in read_metrics(path) if r["step"] <= last_step]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))


def plot_loss(records: list[dict[str, Any]], path: str | Path) -> bool:
    """Draw training (and evaluation) loss against the step into a PNG; False if matplotlib is missing."""
    try:
        fig = figure(7, 4)
    except ImportError:
        return False
    ax = fig.add_subplot()
    train = [(r["step"], r["loss"]) for r in records if isinstance(r.get("loss"), (int, float))]
    evals = [(r["step"], r["eval_loss"]) for r in records if isinstance(r.get("eval_loss"), (int, float))]
    if train:
        ax.plot(*zip(*train), label="train", linewidth=1)
    if evals:
        ax.plot(*zip(*evals), "o-", label="eval", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    if train or evals:
        ax.legend()
    atomic_write_bytes(path, png(fig))
    return True


class RunLogger:
    """Writes every step's record to metrics.jsonl, TensorBoard and the progress bar.

    Args:
        out: run folder.
        start_step: the step the run (re)starts from; later records already in metrics.jsonl are dropped.
        max_steps: total steps, for the progress bar's ETA.
        progress: show a tqdm bar (steps, loss, lr, tokens/s, ETA) on stderr.
        tensorboard: also write TensorBoard events (skipped with a warning if tensorboard is not installed).
        job: what the progress bar calls the run (``pretrain``, ``finetune`` ...).
    """

    def __init__(self, out: str | Path, start_step: int, max_steps: int, progress: bool = True,
                 tensorboard: bool = True, job: str = "train") -> None:
        self.out = Path(out)
        make_folder(self.out)
        self.metrics_path = self.out / METRICS_FILE
        truncate_metrics(self.metrics_path, start_step)
        with environment_errors(self.metrics_path, "append to"):
            self._file = open(self.metrics_path, "a", encoding="utf-8")
        with environment_errors(self.out / TENSORBOARD_DIR, "write"):
            self._writer = self._tensorboard(start_step) if tensorboard else None
        self._plot_warned = False
        self._start = time.perf_counter()
        self._started_s = process_seconds()  # the process's age at the start: total_s follows from the clock
        self._tokens = 0
        from tqdm.auto import tqdm

        self.bar = tqdm(total=max_steps, initial=start_step, desc=job, unit="step", dynamic_ncols=True,
                        disable=not progress, file=sys.stderr)

    def _tensorboard(self, start_step: int):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            warnings.warn("tensorboard is not installed: no TensorBoard events are written "
                          "(pip install tensorboard; metrics.jsonl has the same numbers)", stacklevel=3)
            return None
        # purge_step drops events logged after the checkpoint we resume from, as truncate_metrics does.
        return SummaryWriter(str(self.out / TENSORBOARD_DIR), purge_step=start_step + 1 if start_step else None)

    def log(self, record: dict[str, Any]) -> None:
        """Write one step's record (needs ``step``; ``tokens`` is used for the tokens/s rate)."""
        self._tokens += record.get("tokens", 0)
        elapsed = time.perf_counter() - self._start
        record = {**record, "tokens_per_s": round(self._tokens / elapsed, 1) if elapsed > 0 else None,
                  "total_s": round(self._started_s + time.perf_counter() - self._start, 3)}
        with environment_errors(self.metrics_path, "append to"):
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        step = record["step"]
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    tag = f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"
                    self._writer.add_scalar(tag, value, step)
        postfix = {"loss": record.get("loss"), "lr": record.get("lr"), "tok/s": record["tokens_per_s"]}
        self.bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items() if isinstance(v, (int, float))},
                             refresh=False)
        self.bar.update(step - self.bar.n)
        if "eval_loss" in record:
            self.bar.write(f"step {step}: " + ", ".join(
                f"{k} {v:.4f}" for k, v in record.items() if k.startswith("eval_") and isinstance(v, float)),
                file=sys.stderr)

    def plot(self) -> None:
        """Redraw loss.png from metrics.jsonl."""
        if not plot_loss(read_metrics(self.metrics_path), self.out / PLOT_FILE) and not self._plot_warned:
            self._plot_warned = True
            warnings.warn("matplotlib is not installed: no loss.png (pip install matplotlib)", stacklevel=2)

    def close(self) -> None:
        self.plot()
        self._file.close()
        if self._writer is not None:
            self._writer.close()
        self.bar.close()
