"""Checkpoint pieces without pickle: JSON encoding of tensors and RNG states, the optimizer round trip,
checksum verification, and metrics.jsonl / loss.png bookkeeping."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from helpers import tiny_config
from lmforge.models import Transformer
from lmforge.training import CheckpointManager, CorruptCheckpoint, build_optimizer
from lmforge.training.logging import RunLogger, plot_loss, read_metrics, truncate_metrics
from lmforge.training.state import (capture_rng, from_json, load_checkpoint, load_optimizer, restore_rng, to_json,
                                    verify_checkpoint, write_checkpoint)


def test_json_round_trip_of_tensors_arrays_and_generator_states():
    g = torch.Generator().manual_seed(7)
    torch.rand(3, generator=g)
    value = {"generator": g.get_state(), "bf16": torch.randn(2, 3).bfloat16(),
             "bf16_scalar": torch.tensor(1.5).bfloat16(), "long": torch.arange(5),
             "empty": torch.zeros(0, 4), "array": np.arange(6, dtype=np.uint32).reshape(2, 3), "scalar": np.int64(3),
             "nested": [(1, 2.5, "x", None, True)]}
    back = from_json(json.loads(json.dumps(to_json(value))))
    for key in ("generator", "bf16", "bf16_scalar", "long", "empty"):
        assert back[key].dtype == value[key].dtype and torch.equal(back[key], value[key]), key
    assert back["array"].dtype == np.uint32 and np.array_equal(back["array"], value["array"])
    assert back["scalar"] == 3 and back["nested"] == [[1, 2.5, "x", None, True]]
    h = torch.Generator()
    h.set_state(back["generator"])
    assert torch.equal(torch.rand(4, generator=h), torch.rand(4, generator=g))
    with pytest.raises(TypeError, match="cannot store a object"):
        to_json(object())


def test_rng_capture_and_restore_through_json_text():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached Gaussian in Python's state
    state = json.dumps(to_json(capture_rng()))
    expected = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3).tolist())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng(from_json(json.loads(state)))
    assert (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3).tolist()) == expected


def _trained(seed: int = 0):
    torch.manual_seed(seed)
    model = Transformer(tiny_config())
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    for _ in range(2):
        ids = torch.randint(0, 97, (2, 8))
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_checkpoint_round_trip_restores_model_and_optimizer(tmp_path):
    model, opt = _trained(0)
    folder = write_checkpoint(tmp_path / "step-00000002", model, opt, {"step": 2, "extra": to_json({"a": [1]})})
    assert not list(tmp_path.glob(".*"))  # the temporary folder was renamed into place
    fresh, fresh_opt = _trained(1)
    state = load_checkpoint(folder, fresh, fresh_opt)
    assert state["step"] == 2 and state["extra"] == {"a": [1]}
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    saved, loaded = opt.state_dict(), fresh_opt.state_dict()
    for index, entry in saved["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, loaded["state"][index][key]), (index, key)
    assert [g["names"] for g in saved["param_groups"]] == [g["names"] for g in loaded["param_groups"]]
    assert loaded["param_groups"][0]["betas"] == saved["param_groups"][0]["betas"]
    # A later step from the restored pair equals a later step from the original.
    ids = torch.randint(0, 97, (2, 8))
    for m, o in ((model, opt), (fresh, fresh_opt)):
        m(ids, labels=ids).loss.backward()
        o.step()
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


def test_optimizer_for_another_model_is_refused(tmp_path):
    model, opt = _trained(0)
    folder = write_checkpoint(tmp_path / "ck", model, opt, {"step": 2})
    other = Transformer(tiny_config(bias=False))  # fewer parameters: the groups no longer match
    meta = json.loads((folder / "trainer_state.json").read_text())["optimizer"]
    with pytest.raises(ValueError, match="saved for other parameters"):
        load_optimizer(build_optimizer(other, lr=1e-3), folder / "optimizer.safetensors", meta)


def test_verify_detects_damage_and_the_manager_falls_back(tmp_path):
    model, opt = _trained(0)
    manager = CheckpointManager(tmp_path / "checkpoints", keep=5)
    for step in (1, 2, 3):
        manager.save(step, model, opt, {"step": step})
    assert manager.steps() == [1, 2, 3] and manager.latest_name() == "step-00000003"
    (tmp_path / "checkpoints" / "step-00000003" / "trainer_state.json").write_text('{"step": 3}')
    with pytest.raises(CorruptCheckpoint, match="trainer_state.json: checksum mismatch"):
        verify_checkpoint(tmp_path / "checkpoints" / "step-00000003")
    with pytest.warns(UserWarning, match="step-00000003 is corrupt"):
        folder, state = manager.latest_valid()
    assert folder.name == "step-00000002" and state["step"] == 2
    # A garbled `latest` is not trusted; the newest intact folder is found by scanning.
    (tmp_path / "checkpoints" / "latest").write_text("../../etc")
    with pytest.warns(UserWarning):
        assert manager.latest_valid()[0].name == "step-00000002"
    assert CheckpointManager(tmp_path / "nothing").latest_valid() is None


def test_metrics_truncation_drops_later_and_broken_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.5}\nnot json\n{"step": 3, "loss": 2.0}\n'
                    '{"step": 4, "lo')
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    truncate_metrics(path, 2)
    assert path.read_text() == '{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.5}\n'


def test_run_logger_writes_jsonl_tensorboard_and_png(tmp_path):
    log = RunLogger(tmp_path, start_step=0, max_steps=3, progress=False, tensorboard=True)
    for step in (1, 2, 3):
        log.log({"step": step, "loss": 3.0 / step, "lr": 1e-3, "tokens": 100, "eval_loss": 2.0} if step == 2 else
                {"step": step, "loss": 3.0 / step, "lr": 1e-3, "tokens": 100})
    log.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3] and records[1]["eval_loss"] == 2.0
    assert all(r["tokens_per_s"] > 0 for r in records)
    assert (tmp_path / "loss.png").read_bytes().startswith(b"\x89PNG")
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    # Resuming from step 2 drops step 3 from metrics.jsonl.
    RunLogger(tmp_path, start_step=2, max_steps=3, progress=False, tensorboard=False).close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    assert plot_loss([], tmp_path / "empty.png")
