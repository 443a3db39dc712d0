"""Encoder-decoder LM (T5 §3.3.1's prefix LM for encoder-decoders): batch layout by hand, the split-point
distribution, the architecture check, learning on real text, and exact resume."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lmforge.cli.main import main
from lmforge.objectives import EncDecLM, build_objective, check_architecture
from lmforge.objectives.enc_dec_lm import split_point
from lmforge.tokenization import Tokenizer
from lmforge.training import TrainConfig
from lmforge.training.pretrain import build_pretraining
from test_training_pretrain import TINY, data_root, prepared, pretrain_args  # noqa: F401
from test_training_resume import assert_stop_and_resume_is_exact

PAD, EOS, BOS = 0, 1, 2
# The tiny encoder-decoders of the other pre-training tests, with this objective.
MODELS = {"t5": TINY["span-corruption"], "bart": TINY["denoising"]}


def test_layout_by_hand_t5_style():
    lm = EncDecLM(eos_token_id=EOS, pad_token_id=PAD, seed=3)
    g = torch.Generator().manual_seed(3)
    p0, p1 = split_point(5, g), split_point(2, g)  # the draws the objective makes, in order
    assert (p0, p1) == (3, 1)
    batch = lm([[5, 6, 7, 8, 9], [10, 11]])
    assert batch["input_ids"].tolist() == [[5, 6, 7, EOS], [10, EOS, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[8, 9, EOS], [11, EOS, -100]]
    assert batch["decoder_input_ids"].tolist() == [[PAD, 8, 9], [PAD, 11, EOS]]  # T5 starts from pad
    assert batch["decoder_attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


def test_layout_by_hand_bart_style():
    # BART: <s> opens the encoder input, the decoder starts from </s>; a 1-token text has an empty prefix.
    lm = EncDecLM(eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS, decoder_start_token_id=EOS, seed=3)
    batch = lm([[5, 6, 7, 8, 9], [12]])
    assert batch["input_ids"].tolist() == [[BOS, 5, 6, 7, EOS], [BOS, EOS, PAD, PAD, PAD]]
    assert batch["labels"].tolist() == [[8, 9, EOS], [12, EOS, -100]]
    assert batch["decoder_input_ids"].tolist() == [[EOS, 8, 9], [EOS, 12, EOS]]
    assert lm([[]])["labels"].tolist() == [[EOS]]  # nothing to predict but the end


def test_split_is_uniform_and_keeps_every_token_once():
    lm = EncDecLM(eos_token_id=EOS, pad_token_id=PAD, seed=0)
    T, n = 6, 5000
    text = list(range(10, 10 + T))
    batch = lm([text] * n)
    prefix = (batch["attention_mask"].sum(1) - 1)  # (n,) tokens before EOS
    counts = torch.bincount(prefix, minlength=T).double()
    assert counts[0] == 0 and counts[T:].sum() == 0  # 1 <= P <= T - 1
    expected = n / (T - 1)
    chi2 = float(((counts[1:T] - expected) ** 2 / expected).sum())
    assert chi2 < 4 + 6 * math.sqrt(8), counts  # 4 dof: mean 4, sd sqrt(8)
    for inputs, labels, p in zip(batch["input_ids"][:50], batch["labels"][:50], prefix[:50].tolist()):
        target = labels[labels != -100].tolist()
        assert inputs[:p].tolist() + target[:-1] == text and target[-1] == EOS


def test_registered_for_encoder_decoders_only(data_root, tmp_path, capsys):
    check_architecture("enc-dec-lm", "encoder-decoder")
    assert type(build_objective("enc_dec_lm", eos_token_id=EOS, pad_token_id=PAD)).__name__ == "EncDecLM"
    with pytest.raises(ValueError, match="objective 'enc-dec-lm' does not fit arch='decoder'.*'encoder-decoder'"):
        check_architecture("enc-dec-lm", "decoder")
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    assert main(pretrain_args("clm", data, out, objective="enc-dec-lm")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "objective 'enc-dec-lm' does not fit arch='decoder'" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("family", list(MODELS))
def test_pretrain_builds_the_family_framing(family, data_root, tmp_path):
    preset, _, overrides = MODELS[family]
    data = prepared(data_root, family)
    cfg = TrainConfig(model=preset, objective="enc-dec-lm", data=str(data), out=str(tmp_path / "run"), seq_len=24,
                      batch_size=4, overrides=overrides, eval_every=0, precision="fp32", progress=False)
    run = build_pretraining(cfg)
    ids = run.tokenizer.special_token_ids()
    raw = next(iter(run.trainer.train_data))
    batch = run.trainer.objective(raw)
    assert batch["input_ids"].shape[1] <= 24 and batch["labels"].shape[1] <= 24
    first = batch["input_ids"][:, 0]
    assert (first == ids["bos_token_id"]).all() if family == "bart" else not (first == ids["eos_token_id"]).all()
    assert (batch["decoder_input_ids"][:, 0] == ids["decoder_start_token_id"]).all()
    for x, inputs, real, labels in zip(raw, batch["input_ids"], batch["attention_mask"], batch["labels"]):
        source = inputs[real.bool()].tolist()[(family == "bart"):-1]
        target = labels[labels != -100].tolist()[:-1]
        assert source + target == x.tolist()


def test_enc_dec_lm_lowers_validation_loss(data_root, tmp_path):
    preset, _, overrides = MODELS["t5"]
    data = prepared(data_root, "t5")
    cfg = TrainConfig(model=preset, objective="enc-dec-lm", data=str(data), out=str(tmp_path / "run"), seq_len=32,
                      batch_size=16, overrides={**overrides, "dropout": 0.0}, max_steps=60, lr=5e-3, warmup=4,
                      eval_every=60, eval_batches=4, save_every=60, precision="fp32", progress=False,
                      tensorboard=False)
    trainer = build_pretraining(cfg).trainer
    before = trainer.evaluate()["eval_loss"]
    trainer.fit()
    after = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    after = [r["eval_loss"] for r in after if "eval_loss" in r][-1]
    vocab = Tokenizer.load(data / "tokenizer").vocab_size
    assert before > math.log(vocab)  # untrained: no better than a uniform guess
    assert after < before - 1.0 and after < math.log(vocab) - 0.5, (before, after)  # 6.1 -> 4.8 when written


@pytest.mark.parametrize("family", list(MODELS))
def test_stop_and_resume_is_exact(family, data_root, tmp_path):
    preset, _, overrides = MODELS[family]
    data = prepared(data_root, family)

    assert_stop_and_resume_is_exact(tmp_path, preset, "enc-dec-lm", data, overrides)
