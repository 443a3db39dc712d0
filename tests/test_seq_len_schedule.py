"""BERT's two-phase sequence length (``--seq-len-schedule 128:0.9,512:0.1``): parsing, the switch step, the batches'
lengths per step, the price tag of each phase, exact resume across the switch and the refusals."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from helpers import command_args
from lmforge.cli.main import main
from lmforge.config import ConfigError
from lmforge.training import TrainConfig
from lmforge.training.pretrain import build_pretraining
from lmforge.training.price_tag import batch_flops
from lmforge.training.seq_len_schedule import (check_phase_steps, moved_switch, parse_seq_len_schedule,
                                               phase_starts)
from test_training_pretrain import TINY, data_root, prepared  # noqa: F401
from test_objectives_nsp_pretrain import config as nsp_config
from test_pretrain_electra import config as electra_config
from test_training_resume import assert_same_weights, config, curve, metrics, weights

SCHEDULE = "16:0.5,32:0.5"  # 6 steps: 3 at 16, then 3 at 32 (the switch is at step 4)


def scheduled(recipe: str, data: Path, out: Path, **settings) -> TrainConfig:
    return config(recipe, data, out, seq_len=None, seq_len_schedule=SCHEDULE, **settings)


# ------------------------------------------------------------------ parsing and the switch step, by hand
def test_parse_by_hand():
    assert parse_seq_len_schedule("128:0.9,512:0.1") == [(128, Fraction(9, 10)), (512, Fraction(1, 10))]
    assert parse_seq_len_schedule(" 64:1/3 , 128:2/3 ") == [(64, Fraction(1, 3)), (128, Fraction(2, 3))]
    assert parse_seq_len_schedule("512:1") == [(512, Fraction(1))]


def test_switch_steps_by_hand():
    bert = parse_seq_len_schedule("128:0.9,512:0.1")
    assert phase_starts(bert, 1_000_000) == [0, 900_000]  # BERT's 1M steps: exact, no float drift
    assert phase_starts(bert, 10) == [0, 9]
    assert phase_starts(bert, 15) == [0, 14]  # 13.5 rounds half up
    assert phase_starts(parse_seq_len_schedule("32:0.5,64:0.25,128:0.25"), 8) == [0, 4, 6]


def test_an_extension_is_allowed_only_where_no_switch_moves():
    assert moved_switch("16:0.25,32:0.75", 4, 5) is None  # switch at step 1 either way: the last phase grows
    assert moved_switch("16:0.5,32:0.5", 4, 8) == ("the run switches sequence length at step(s) 2 of max_steps=4; "
                                                   "max_steps=8 would move the switch to 4: resume with --max-steps 4")


@pytest.mark.parametrize("text, message", [
    ("128:0.9,512:0.2", "the fractions sum to 1.1, not 1"),
    ("128:0.5,512:0.4", "the fractions sum to 0.9, not 1"),
    ("128:0.5,64:0.5", "item 2 '64:0.5': lengths must increase, and 64 follows 128"),
    ("128:0.5,128:0.5", "item 2 '128:0.5': lengths must increase"),
    ("128:0.9,512", "item 2 '512' is not LENGTH:FRACTION"),
    ("abc:1", "item 1 'abc:1': length 'abc' is not an integer"),
    ("128:x,512:0.1", "item 1 '128:x': fraction 'x' is not a number"),
    ("1:1", "item 1 '1:1': length must be >= 2"),
    ("128:0,512:1", "item 1 '128:0': fraction must be in (0, 1]"),
    ("128:0.9,,512:0.1", "item 2 ''"),
])
def test_bad_schedules_are_refused_naming_the_item(text, message):
    with pytest.raises(ConfigError, match="seq_len_schedule=.*" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        parse_seq_len_schedule(text)


def test_a_phase_without_steps_and_seq_len_with_a_schedule_are_refused():
    with pytest.raises(ConfigError, match=r"item 2 '512:1/10' gets no step of max_steps=5"):
        check_phase_steps("128:0.9,512:0.1", 5)
    with pytest.raises(ConfigError, match=r"run.yaml: seq_len_schedule='128:0.9,512:0.1' gives every phase its "
                                          r"length, so seq_len=128 must be unset"):
        TrainConfig.from_dict({"seq_len": 128, "seq_len_schedule": "128:0.9,512:0.1"}, source="run.yaml")
    with pytest.raises(ConfigError, match=r"run.yaml: seq_len_schedule='128:0.9,512:0.2': the fractions sum to 1.1"):
        TrainConfig.from_dict({"seq_len_schedule": "128:0.9,512:0.2"}, source="run.yaml")


# ------------------------------------------------------------------ batches, metrics and FLOPs per step
def test_packed_batches_change_length_at_the_switch_step(data_root, tmp_path):
    data = prepared(data_root, "gpt")
    trainer = build_pretraining(scheduled("clm", data, tmp_path / "run", eval_every=0)).trainer
    # grad_accum 2: raw batches 0-5 are steps 1-3 (length 16), 6-11 steps 4-6 (length 32); blocks hold len + 1.
    shapes = [tuple(raw.shape) for raw, _ in zip(trainer.train_data, range(12))]
    assert shapes == [(2, 17)] * 6 + [(2, 33)] * 6


def test_metrics_log_the_switch_and_the_price_tag_charges_each_phase(data_root, tmp_path):
    data = prepared(data_root, "gpt")
    trainer = build_pretraining(scheduled("clm", data, tmp_path / "run", eval_every=0)).trainer
    flops = []
    for _ in range(6):  # one step at a time: each step's FLOPs
        before = trainer.price_tag.flops
        trainer.fit(steps=1)
        flops.append(trainer.price_tag.flops - before)
    records = metrics(tmp_path / "run")
    assert [r["seq_len"] for r in records] == [16, 16, 16, 32, 32, 32]
    assert [r.get("seq_len_switch") for r in records] == [None, None, None, "16->32", None, None]
    assert [r["tokens"] for r in records] == [2 * 2 * 16] * 3 + [2 * 2 * 32] * 3  # the batch stays in sequences
    # Each step: 2 micro-batches of 2 x S tokens, every position labelled (CLM), charged at its own length.
    for S, got in zip([16] * 3 + [32] * 3, flops):
        ids = torch.zeros(2, S, dtype=torch.long)
        assert got == 2 * batch_flops(trainer.model, {"input_ids": ids, "labels": ids}, 2 * S)
    assert flops[3] > 2 * flops[0]  # twice the tokens, and attention grows with the length on top


def test_document_segments_follow_the_schedule(data_root, tmp_path):
    data = prepared(data_root, "bert")
    trainer = build_pretraining(scheduled("mlm", data, tmp_path / "run", eval_every=0)).trainer
    # Segments of at most length - 2 tokens, framed as [CLS] x [SEP]; the objective follows the data's phase.
    widths = [trainer.objective(raw)["input_ids"].shape[1] for raw, _ in zip(trainer.train_data, range(12))]
    assert max(widths[:6]) <= 16 and max(widths[6:]) <= 32 and max(widths[6:]) > 16


# ------------------------------------------------------------------ exact resume across the switch
@pytest.mark.parametrize("recipe, stop, workers", [("clm", 2, 0), ("clm", 3, 0), ("clm", 4, 0), ("mlm", 3, 0),
                                                   ("mlm", 5, 0), ("mlm", 4, 1)])
def test_resume_before_at_and_after_the_switch_is_exact(recipe, stop, workers, data_root, tmp_path):
    data = prepared(data_root, TINY[recipe][1])
    build_pretraining(scheduled(recipe, data, tmp_path / "ref", num_workers=workers)).trainer.fit()
    build_pretraining(scheduled(recipe, data, tmp_path / "run", num_workers=workers)).trainer.fit(steps=stop)
    result = build_pretraining(scheduled(recipe, data, tmp_path / "run", resume=True,
                                         num_workers=workers)).trainer.fit()
    assert result.step == 6
    keys = ("step", "loss", "lr", "grad_norm", "eval_loss", "eval_accuracy", "seq_len", "seq_len_switch", "tokens",
            "total_flops")
    assert curve(tmp_path / "run", keys) == curve(tmp_path / "ref", keys)
    assert_same_weights(weights(tmp_path / "run" / "model"), weights(tmp_path / "ref" / "model"))


# ------------------------------------------------------------------ the command line
def cli_args(data: Path, out: Path, resume: bool = False, **settings) -> list[str]:
    preset, _, overrides = TINY["clm"]
    options = {"model": preset, "objective": "clm", "data": data, "out": out, "max_steps": 4, "batch_size": 2,
               "eval_every": 0, "save_every": 2, "precision": "fp32", "seq_len_schedule": SCHEDULE, **settings}
    return command_args(["pretrain", "--no-progress", *(["--resume"] if resume else [])], options, overrides)


def test_cli_runs_a_schedule_and_resume_refuses_changes(data_root, tmp_path, capsys):
    data = prepared(data_root, "gpt")
    out = tmp_path / "run"
    assert main(cli_args(data, out)) == 0
    assert "seq len 16 -> 32 at step 2" in capsys.readouterr().err
    assert [r["seq_len"] for r in metrics(out)] == [16, 16, 32, 32]
    saved = (out / "config.yaml").read_text()

    assert main(cli_args(data, out, resume=True, seq_len_schedule="16:0.25,32:0.75")) == 2
    err = capsys.readouterr().err.strip()
    assert "--seq-len-schedule: 16:0.5,32:0.5 in the run, 16:0.25,32:0.75 given" in err and "\n" not in err
    # Extending a scheduled run would move its switch (a fraction of max_steps): refused, nothing written.
    assert main(cli_args(data, out, resume=True, max_steps=8)) == 2
    err = capsys.readouterr().err.strip()
    assert "switches sequence length at step(s) 2 of max_steps=4; max_steps=8 would move the switch to 4" in err
    assert "\n" not in err and (out / "config.yaml").read_text() == saved
    assert not (out / "history.jsonl").exists()


def test_cli_refuses_a_schedule_longer_than_the_model_and_with_seq_len(data_root, tmp_path, capsys):
    data = prepared(data_root, "gpt")
    assert main(cli_args(data, tmp_path / "a", seq_len_schedule="32:0.5,128:0.5")) == 2  # max_seq_len is 64
    err = capsys.readouterr().err.strip()
    assert ("seq_len_schedule='32:0.5,128:0.5': its longest length 128 exceeds the model's max_seq_len=64; "
            "pass --override max_seq_len=128") in err and "\n" not in err
    assert main(cli_args(data, tmp_path / "b", seq_len=32)) == 2
    err = capsys.readouterr().err.strip()
    assert "so seq_len=32 must be unset; drop --seq-len" in err and "\n" not in err
    assert main(cli_args(data, tmp_path / "c", seq_len_schedule="16:0.5,32:0.6")) == 2
    assert "the fractions sum to 1.1, not 1" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_bert_recipe_mlm_nsp_pairs_follow_the_schedule_and_resume_exactly(data_root, tmp_path):
    # BERT's own recipe: [CLS] A [SEP] B [SEP] pairs are cut to each phase's length by the NSP objective itself.
    data = prepared(data_root, "bert")

    def bert(out: Path, **settings) -> TrainConfig:
        return nsp_config(data, out, seq_len=None, seq_len_schedule=SCHEDULE, **settings)

    probe = build_pretraining(bert(tmp_path / "probe", eval_every=0)).trainer
    widths = [probe.objective(raw)["input_ids"].shape[1] for raw, _ in zip(probe.train_data, range(12))]
    assert max(widths[:6]) <= 16 and 16 < max(widths[6:]) <= 32
    build_pretraining(bert(tmp_path / "ref")).trainer.fit()
    build_pretraining(bert(tmp_path / "run")).trainer.fit(steps=4)
    build_pretraining(bert(tmp_path / "run", resume=True)).trainer.fit()
    keys = ("step", "loss", "lr", "grad_norm", "eval_loss", "eval_nsp_accuracy", "seq_len")
    assert curve(tmp_path / "run", keys) == curve(tmp_path / "ref", keys)
    assert_same_weights(weights(tmp_path / "run" / "model"), weights(tmp_path / "ref" / "model"))


def test_a_model_without_a_flop_formula_is_counted_again_at_the_switch(data_root, tmp_path):
    # ELECTRA's generator + discriminator have no analytic count: the FLOPs per token measured on step 1 (length
    # 16) would undercharge the steps at 32, so the switch step is measured again under FlopCounterMode.
    data = prepared(data_root, "bert")
    trainer = build_pretraining(electra_config(data, tmp_path / "run", seq_len=None, seq_len_schedule=SCHEDULE,
                                               eval_every=0)).trainer
    rates = []
    for _ in range(6):
        trainer.fit(steps=1)
        rates.append(trainer.price_tag._per_token)
    assert trainer.price_tag.flops_method.startswith("counted")
    assert rates[0] == rates[1] == rates[2] and rates[3] == rates[4] == rates[5]
    assert rates[3] > rates[0]  # attention's share per token grows with the length
    assert trainer.price_tag.flop_check["counted"] == pytest.approx(rates[3] * metrics(tmp_path / "run")[3]["tokens"])
