"""`lmforge pretrain --objective bilm --model elmo-tiny`: ELMo's biLM through the ordinary Trainer.

Training lowers the validation loss; ``OUT/model`` reloads (``lmforge.load``, ``SentenceEncoder.load``) to the
very same outputs; resuming is exact; the framing of training segments is the tokenizer's own; mismatched
models and objectives are refused with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lmforge
from lmforge.cli.main import main
from lmforge.embeddings import SentenceEncoder
from lmforge.models.bilstm_lm import BiLM
from lmforge.objectives import build_objective
from lmforge.tokenization import Tokenizer
from lmforge.training import TrainConfig
from lmforge.training.pretrain import build_pretraining, objective_kwargs
from test_training_pretrain import data_root, prepared  # noqa: F401  (tokenizer + shards of 60 kB of Austen)

TINY_BILM = {"d_embed": 16, "d_hidden": 16, "n_layers": 2}


def config(data: Path, out: Path, **settings) -> TrainConfig:
    """A tiny biLM run that keeps the randomness that resume must restore: dropout 0.1, shuffled data."""
    base = dict(model="elmo-tiny", objective="bilm", data=str(data), out=str(out), overrides=TINY_BILM,
                max_steps=100, batch_size=8, seq_len=32, lr=1e-2, warmup=5, eval_every=100, eval_batches=2,
                save_every=100, precision="fp32", progress=False, tensorboard=False)
    return TrainConfig.from_dict({**base, **settings})


def test_pretraining_lowers_val_loss_and_the_model_folder_reloads_exactly(data_root, tmp_path):
    data = prepared(data_root, "bert")
    run = build_pretraining(config(data, tmp_path / "run"))
    trainer = run.trainer
    assert isinstance(run.model, BiLM) and run.model.config.vocab_size == run.tokenizer.vocab_size
    before = trainer.evaluate()
    result = trainer.fit()
    after = trainer.evaluate()
    assert result.step == 100 and result.model_dir == tmp_path / "run" / "model"
    # ~5.5 at initialisation (ln 200 = 5.3 is chance); 100 steps reach ~4.8
    assert after["eval_loss"] < before["eval_loss"] - 0.4, (before, after)
    assert after["eval_accuracy"] > before["eval_accuracy"]

    loaded = lmforge.load(result.model_dir)
    assert isinstance(loaded, BiLM) and loaded.config == run.model.config and not loaded.training
    trained = run.model.eval()
    batch = trainer.eval_objective([torch.arange(5, 25), torch.arange(30, 40)])
    with torch.no_grad():
        a, b = trained(**batch), loaded(**batch)
        assert torch.equal(a.forward_logits, b.forward_logits) and torch.equal(a.backward_logits, b.backward_logits)
        assert a.loss == b.loss
        for x, y in zip(trained.layer_states(batch["input_ids"], batch["attention_mask"]),
                        loaded.layer_states(batch["input_ids"], batch["attention_mask"])):
            assert torch.equal(x, y)

    # The folder is self-contained for the embedding tools: tokenizer inside, vectors equal to the live model's.
    encoder = SentenceEncoder.load(result.model_dir)
    assert Tokenizer.load(result.model_dir).sha256() == Tokenizer.load(data / "tokenizer").sha256()
    texts = ["the family of Dashwood", "had long been settled in Sussex, their estate was large"]
    live = SentenceEncoder(trained, run.tokenizer).encode(texts, layer="scalar-mix")
    assert live.shape == (2, 2 * TINY_BILM["d_hidden"])
    assert (encoder.encode(texts, layer="scalar-mix") == live).all()
    # a sentence's vector does not depend on the longer one it was batched with
    alone = encoder.encode(texts[:1], layer=1)
    assert abs(encoder.encode(texts, layer=1, sort_by_length=False)[0] - alone[0]).max() < 1e-6


def test_resume_is_exact(data_root, tmp_path):
    data = prepared(data_root, "bert")
    settings = dict(max_steps=6, eval_every=3, save_every=3, grad_accum=2)
    build_pretraining(config(data, tmp_path / "ref", **settings)).trainer.fit()
    first = build_pretraining(config(data, tmp_path / "run", **settings)).trainer
    assert first.fit(steps=3).step == 3
    resumed = build_pretraining(config(data, tmp_path / "run", resume=True, **settings)).trainer
    assert resumed.fit().step == 6

    def curve(out):
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["grad_norm"], r.get("eval_loss")) for r in rows]

    assert curve(tmp_path / "run") == curve(tmp_path / "ref")
    ref, run = (load_file(str(tmp_path / d / "model" / "model.safetensors")) for d in ("ref", "run"))
    assert ref.keys() == run.keys() and all(torch.equal(ref[k], run[k]) for k in ref)


def test_segments_are_framed_as_the_tokenizer_frames_a_text(data_root):
    # what the biLM sees in training ([CLS] x [SEP]) is what the encoder feeds it at inference
    tok = Tokenizer.load(prepared(data_root, "bert") / "tokenizer")
    objective = build_objective("bilm", **objective_kwargs("bilm", tok, seed=0, options={}))
    text = "It is a truth universally acknowledged"
    batch = objective([tok.encode(text, add_special_tokens=False)])
    assert batch["input_ids"][0].tolist() == tok.encode(text)
    labels = batch["labels"][0]
    n = len(tok.encode(text))
    assert int((labels[0] != -100).sum()) == int((labels[1] != -100).sum()) == n - 1


def test_cli_run_and_refusals(data_root, tmp_path, capsys):
    data = prepared(data_root, "bert")
    common = ["pretrain", "--no-progress", "--no-tensorboard", "--data", str(data), "--max-steps", "2",
              "--batch-size", "2", "--seq-len", "16", "--precision", "fp32", "--eval-every", "0", "--warmup", "0"]
    assert main(common + ["--model", "elmo-tiny", "--objective", "bilm", "--out", str(tmp_path / "ok"),
                          "--override", "d_embed=8", "--override", "d_hidden=8"]) == 0
    assert "model elmo-tiny (bilstm" in capsys.readouterr().err
    assert isinstance(lmforge.load(tmp_path / "ok" / "model"), BiLM)
    cases = [
        (["--model", "elmo-tiny", "--objective", "mlm"], "objective 'mlm' does not fit arch='bilstm'"),
        (["--model", "bert-tiny", "--objective", "bilm"], "objective 'bilm' does not fit arch='encoder'"),
        (["--model", "elmo-tiny", "--objective", "bilm", "--override", "n_heads=2"],
         "unknown BiLM setting(s) n_heads"),
        (["--model", "elmo-tiny", "--objective", "bilm", "--override", "vocab_size=10"],
         "vocab_size=10 is smaller than the tokenizer's 200 tokens"),
    ]
    for i, (args, expected) in enumerate(cases):
        assert main(common + args + ["--out", str(tmp_path / f"bad{i}")]) == 2, expected
        assert expected in capsys.readouterr().err


def test_unknown_bilm_folder_settings_are_named(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"arch": "bilstm", "vocab_size": 10, "d_hiden": 4}))
    with pytest.raises(ValueError, match=r"config.json: unknown BiLM setting\(s\) d_hiden"):
        lmforge.load(tmp_path / "m")


def test_sigkill_then_resume_matches_the_uninterrupted_run(data_root, tmp_path):
    import signal

    from test_training_resume import _latest, _spawn, _wait_for, assert_same_weights, curve, weights

    data = prepared(data_root, "bert")
    N = 10

    def args(out: Path) -> list[str]:  # dropout 0.1 and shuffled data: resume must restore both streams
        return ["pretrain", "--no-progress", "--no-tensorboard", "--model", "elmo-tiny", "--objective", "bilm",
                "--data", str(data), "--out", str(out), "--max-steps", str(4 * N), "--batch-size", "4",
                "--grad-accum", "2", "--seq-len", "16", "--precision", "fp32", "--eval-every", "0",
                "--save-every", str(N), "--warmup", "2", "--override", "d_embed=8", "--override", "d_hidden=8"]

    assert main(args(tmp_path / "ref")) == 0
    out = tmp_path / "killed"
    proc = _spawn(args(out))
    _wait_for(lambda: _latest(out) == f"step-{N:08d}", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _latest(out) == f"step-{N:08d}" and not (out / "model").exists()  # it really stopped mid-run
    assert main(args(out) + ["--resume"]) == 0
    assert curve(out) == curve(tmp_path / "ref") and len(curve(out)) == 4 * N
    assert_same_weights(weights(out / "model"), weights(tmp_path / "ref" / "model"))
