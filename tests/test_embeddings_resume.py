"""`lmforge finetune --task embedding` runs through the Trainer: killed with SIGKILL after a checkpoint and
resumed, it logs the uninterrupted run's losses and ends with its weights, bit for bit (fp32, CPU, one thread).
"""

from __future__ import annotations

import signal
from pathlib import Path

import lmforge
import embedding_helpers as h
from lmforge.cli.main import main
from test_training_resume import _latest, _spawn, _wait_for, assert_same_weights, curve, weights

N = 10  # the checkpoint to kill after; the run is 4N steps, so the kill lands mid-run


def _args(folder: Path, train: Path, out: Path) -> list[str]:
    return ["finetune", "--model", str(folder), "--task", "embedding", "--loss", "mnrl", "--train", str(train),
            "--max-steps", str(4 * N), "--epochs", "9", "--batch-size", "4", "--grad-accum", "2", "--save-every", str(N),
            "--lr", "1e-3", "--precision", "fp32", "--device", "cpu", "--no-progress", "--no-tensorboard",
            "--out", str(out)]


def test_sigkill_then_resume_matches_the_uninterrupted_run(tmp_path):
    tok = h.tokenizer(tmp_path, "bert")
    # dropout on: resume must restore the random streams, not only the weights and the data position
    folder = lmforge.save(h.model(tok, "bert", dropout=0.1, attn_dropout=0.1), tmp_path / "bert", tokenizer=tok)
    train = tmp_path / "pairs.tsv"
    rows = h.sentences(45, seed=3)
    train.write_text("text1\ttext2\tlabel\n" + "".join(f"{a}\t{b}\t1\n" for a, b in zip(rows, rows[1:])))

    ref = tmp_path / "ref"
    assert main(_args(folder, train, ref)) == 0

    out = tmp_path / "killed"
    proc = _spawn(_args(folder, train, out))
    _wait_for(lambda: _latest(out) == f"step-{N:08d}", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _latest(out) == f"step-{N:08d}" and not (out / "model").exists()  # it really stopped mid-run
    assert main(_args(folder, train, out) + ["--resume"]) == 0
    assert curve(out, ("step", "loss", "lr", "grad_norm")) == curve(ref, ("step", "loss", "lr", "grad_norm"))
    assert len(curve(ref)) == 4 * N
    assert_same_weights(weights(out / "model"), weights(ref / "model"))
    assert (out / "model" / "embedding.json").is_file()
