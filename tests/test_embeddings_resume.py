"""`lmforge finetune --task embedding` runs through the Trainer: killed with SIGKILL after a checkpoint and
resumed, it logs the uninterrupted run's losses and ends with its weights, bit for bit (fp32, CPU, one thread).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import embedding_helpers as h
import lmforge
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


def _triplets(n: int) -> list[dict]:
    rows = h.sentences(n + 2, seed=5)
    return [{"anchor": a, "positive": p, "negative": q} for a, p, q in zip(rows, rows[1:], rows[2:])]


def test_accumulation_equals_the_larger_batch_and_norms_are_not_decayed(tmp_path):
    from lmforge.embeddings import SentenceEncoder
    from lmforge.embeddings.sbert import SentenceTuples, SiameseLoss, train_embedding
    from lmforge.training import TrainConfig, Trainer

    tok = h.tokenizer(tmp_path, "bert")
    rows = _triplets(32)
    common = dict(loss="triplet", max_steps=4, lr=1e-3, warmup=0.0, precision="fp32", weight_decay=0.1)
    # A triplet loss is a mean over tuples, so two micro-batches of 4 make the update of one batch of 8.
    small, large = SentenceEncoder(h.model(tok), tok), SentenceEncoder(h.model(tok), tok)
    a = train_embedding(small, rows, batch_size=4, grad_accum=2, run=tmp_path / "a", **common)
    b = train_embedding(large, rows, batch_size=8, run=tmp_path / "b", **common)
    assert a["steps"] == b["steps"] == 4
    # Same losses and gradient norms at every step (the weights themselves would differ in parameters whose
    # gradient is rounding noise: Adam turns its sign into a full step).
    for key in ("loss", "grad_norm"):
        want = [r[0] for r in curve(tmp_path / "b", (key,))]
        assert [r[0] for r in curve(tmp_path / "a", (key,))] == pytest.approx(want, rel=1e-5)

    trainer = Trainer(small.model, SentenceTuples(tok, "triplet", 32), [rows], TrainConfig(weight_decay=0.1),
                      out=tmp_path / "c", loss=SiameseLoss("triplet", "mean"))
    decayed, kept = trainer.optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    assert any("norm" in n for n in kept["names"]) and any(n.endswith(".bias") for n in kept["names"])
    assert not any(n.endswith(".bias") for n in decayed["names"])
