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

import contextlib
import json
import math
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from lmforge.errors import EnvironmentFault
from lmforge.utils.faults import ADVICE, as_fault, environment_errors, library_errno
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
        self._events: _GuardedRecords | None = None
        self._quiet = False
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
        _QuietEventThreads.enter()  # left in close()
        self._quiet = True
        try:
            writer = SummaryWriter(str(self.out / TENSORBOARD_DIR), purge_step=start_step + 1 if start_step else None)
        except Exception as exc:  # its first event is flushed at once: a full disk shows here
            if library_errno(exc) not in ADVICE:
                raise
            self._warn_tensorboard(exc)
            return None
        self._events = _GuardedRecords.install(writer)
        return writer

    def _warn_tensorboard(self, fault: BaseException) -> None:
        code = library_errno(fault)
        message = as_fault(OSError(code, str(fault)), self.out / TENSORBOARD_DIR, "write") if code else fault
        warnings.warn(f"TensorBoard events stopped: {message} (metrics.jsonl keeps every record)", stacklevel=4)

    def _tensorboard_failed(self, exc: BaseException | None = None) -> None:
        """Stop writing TensorBoard events after a full or read-only disk, with one warning: metrics.jsonl holds
        the same numbers, and it (or the next checkpoint) reports the disk as the command's error."""
        fault = exc or (self._events.fault if self._events is not None else None)
        if fault is None:
            return
        writer, self._writer = self._writer, None
        with contextlib.suppress(Exception):
            writer.close()
        self._warn_tensorboard(fault)

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
            try:
                for key, value in record.items():
                    if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                        tag = f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"
                        self._writer.add_scalar(tag, value, step)
            except Exception as exc:
                if library_errno(exc) not in ADVICE:
                    raise
                self._tensorboard_failed(exc)
            self._tensorboard_failed()
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
        # Every handle is closed even when the plot (or a flush) finds the disk full, so no "Exception ignored"
        # from a later garbage collection adds lines after the command's one-line error.
        failing = sys.exc_info()[1]  # closed from a ``finally`` after a failure (say, a checkpoint the disk refused)
        try:
            self.plot()
        except EnvironmentFault:
            if failing is None:
                raise  # else the failure that stopped the run stays the command's error, not the plot after it
        finally:
            try:
                with environment_errors(self.metrics_path, "append to"):  # close flushes what a full disk refused
                    self._file.close()
            finally:
                if self._writer is not None:
                    with contextlib.suppress(Exception):
                        self._writer.flush()
                    self._tensorboard_failed()
                    if self._writer is not None:
                        self._writer.close()
                if self._quiet:
                    self._quiet = False
                    _QuietEventThreads.exit()
                self.bar.close()


class _GuardedRecords:
    """TensorBoard's record writer, as its background thread calls it, made to stop instead of failing there.

    A full disk raised in that thread would print the thread's traceback and reach the main thread only at some
    later ``add_scalar``. Here the first fixable disk error is kept in :attr:`fault`, and every later write is
    dropped, so :class:`RunLogger` can warn once and carry on.
    """

    def __init__(self, records) -> None:
        self._records = records
        self.fault: BaseException | None = None

    @classmethod
    def install(cls, writer) -> "_GuardedRecords | None":
        """Put a guard between ``writer``'s (a SummaryWriter) queue and its file; None where TensorBoard's
        internals differ from the ones this knows (then a disk error fails as before, in the main thread)."""
        try:
            queue = writer._get_file_writer().event_writer._async_writer
            guard = cls(queue._writer)
            if queue._worker._record_writer is not queue._writer:
                return None
        except AttributeError:
            return None
        queue._writer = queue._worker._record_writer = guard
        return guard

    def _call(self, name: str, *args) -> None:
        if self.fault is not None:
            return
        try:
            getattr(self._records, name)(*args)
        except Exception as exc:
            if library_errno(exc) not in ADVICE:
                raise
            self.fault = exc

    def write(self, data: bytes) -> None:
        self._call("write", data)

    def flush(self) -> None:
        self._call("flush")

    def close(self) -> None:
        try:
            self._records.close()
        except Exception as exc:
            if library_errno(exc) not in ADVICE:
                raise


class _QuietEventThreads:
    """While a :class:`RunLogger` writes TensorBoard events, a full or read-only disk met by TensorBoard's writer
    thread before :class:`_GuardedRecords` is in place (the first event, written as the writer is made) is not
    printed as that thread's traceback: the logger warns about it in one line. Every other thread exception goes
    to the hook that was there before."""

    users = 0
    previous = None

    @classmethod
    def enter(cls) -> None:
        if cls.users == 0:
            cls.previous, threading.excepthook = threading.excepthook, cls.hook
        cls.users += 1

    @classmethod
    def exit(cls) -> None:
        cls.users -= 1
        if cls.users == 0 and threading.excepthook is cls.hook:
            threading.excepthook = cls.previous

    @staticmethod
    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and library_errno(args.exc_value) in ADVICE:
            return
        (_QuietEventThreads.previous or threading.__excepthook__)(args)
