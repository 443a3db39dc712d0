"""The BiLSTM head (BERT Table 7's feature-based ablation, ``TaskSpec.head_bilstm``): shapes for every head task on
an encoder, no padding leak (against torch's LSTM on the unpadded sequence), exact save/reload, refusals."""

from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.config import ConfigError
from lmforge.errors import UserInputError
from lmforge.tasks.bilstm_head import BiLSTMFeatures, BiLSTMHead
from lmforge.tasks.finetune import Recipe, finetune
from lmforge.tasks.model import build_task_model, load_task_model, save_task_model, to_hf_head
from lmforge.tasks.optim import layer_groups
from lmforge.tasks.settings import finetune_settings
from lmforge.tasks.spec import TaskSpec
from tests import task_helpers as th

V = 60


def encoder(**overrides):
    torch.manual_seed(0)
    cfg = dict(n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=V, max_seq_len=32, dropout=0.0,
               attn_dropout=0.0, pad_token_id=0)
    cfg.update(overrides)
    return lmforge.build_model("bert-tiny", **cfg)


def batch(B=2, T=7, choices=None):
    shape = (B, T) if choices is None else (B, choices, T)
    ids = torch.randint(5, V, shape)
    mask = torch.ones(shape, dtype=torch.long)
    mask[0, ..., 4:] = 0  # the first row (every choice of it) is padded after 4 tokens
    ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": (torch.arange(T) >= 3).long().expand(shape)}


# (spec fields, batch kwargs, labels, expected logits shape)
CASES = {
    "classify": (dict(task="classify", labels=["a", "b", "c"]), {}, torch.tensor([0, 2]), (2, 3)),
    "pair-classify-mean": (dict(task="classify", labels=["a", "b"], pooling="mean"), {}, torch.tensor([1, 0]), (2, 2)),
    "regress": (dict(task="regress"), {}, torch.tensor([0.5, 2.0]), (2, 1)),
    "multilabel": (dict(task="multilabel", labels=["x", "y"]), {}, torch.tensor([[1.0, 0.0], [1.0, 1.0]]), (2, 2)),
    "tag": (dict(task="tag", labels=["O", "B", "I"]), {}, torch.tensor([[-100, 1, 2, 0, -100, -100, -100],
                                                                        [-100, 0, 0, 1, 2, 0, -100]]), (2, 7, 3)),
    "qa": (dict(task="qa"), {}, torch.tensor([[1, 2], [3, 5]]), (2, 7, 2)),
    "multiple-choice": (dict(task="multiple-choice"), {"choices": 3}, torch.tensor([2, 0]), (2, 3)),
}


@pytest.mark.parametrize("case", CASES)
def test_every_head_task_runs_under_a_bilstm(case):
    fields, shape, labels, want = CASES[case]
    model = build_task_model(encoder(), TaskSpec(**fields, head_bilstm=2, classifier_dropout=0.0))
    assert isinstance(model.head, BiLSTMHead) and model.head.bilstm.lstm.num_layers == 2
    assert model.head.bilstm.lstm.hidden_size == 8  # d_model / 2 per direction: the head reads 2H = d_model
    out = model(**batch(**shape), labels=labels)
    assert tuple(out.logits.shape) == want
    assert torch.isfinite(out.loss) and out.n_targets > 0
    out.loss.backward()  # the randomly initialised BiLSTM trains with the head
    assert model.head.bilstm.lstm.weight_ih_l1.grad.abs().sum() > 0


def test_hidden_width_is_configurable_and_the_head_reads_2h():
    model = build_task_model(encoder(), TaskSpec(task="tag", labels=["O", "B"], head_bilstm=1, head_bilstm_hidden=5))
    assert model.head.bilstm.width == 10 and model.head.head.out.in_features == 10
    assert model(**batch()).logits.shape == (2, 7, 2)


def test_padding_does_not_leak_into_the_bilstm():
    torch.manual_seed(0)
    feats = BiLSTMFeatures(d_model=6, layers=2).eval()
    real = torch.randn(1, 4, 6)
    padded = torch.cat([real, 100 * torch.randn(1, 3, 6)], dim=1)  # loud garbage where the padding is
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        reference = feats.lstm(real)[0]  # torch's own LSTM on the sequence alone, no padding at all
        got = feats(torch.cat([padded, torch.randn(1, 7, 6)]), torch.cat([mask, torch.ones_like(mask)]))
    torch.testing.assert_close(got[0, :4], reference[0])  # the backward direction starts at the last real token
    assert got[0, 4:].abs().max() == 0


def test_task_outputs_at_real_positions_do_not_change_when_padding_is_added():
    model = build_task_model(encoder(), TaskSpec(task="tag", labels=["O", "B"], head_bilstm=2)).eval()
    ids = torch.randint(5, V, (1, 5))
    longer = torch.cat([ids, torch.randint(5, V, (1, 4))], dim=1)  # padding positions hold real-looking ids
    mask = torch.cat([torch.ones(1, 5), torch.zeros(1, 4)], dim=1).long()
    with torch.no_grad():
        alone = model(ids).logits
        padded = model(longer, attention_mask=mask).logits
    torch.testing.assert_close(padded[:, :5], alone, atol=1e-5, rtol=1e-5)


def test_left_padding_is_refused():
    feats = BiLSTMFeatures(d_model=4, layers=1)
    with pytest.raises(ValueError, match="right padding"):
        feats(torch.randn(1, 3, 4), torch.tensor([[0, 1, 1]]))


@pytest.mark.parametrize("task, labels", [("classify", ["neg", "pos"]), ("tag", ["O", "B", "I"])])
def test_saved_task_folder_reloads_with_identical_outputs(task, labels, tmp_path):
    model = build_task_model(encoder(), TaskSpec(task=task, labels=labels, head_bilstm=2)).eval()
    folder = save_task_model(model, tmp_path / "task")
    reloaded = load_task_model(folder)
    assert reloaded.spec.head_bilstm == 2 and isinstance(reloaded.head, BiLSTMHead)
    b = batch()
    with torch.no_grad():
        assert torch.equal(model(**b).logits, reloaded(**b).logits)


@pytest.mark.parametrize("preset", ["gpt-tiny", "bart-tiny"])
def test_decoders_and_encoder_decoders_are_refused_in_one_line(preset):
    body = lmforge.build_model(preset, n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=V)
    with pytest.raises(UserInputError, match="head_bilstm=2.*encoder") as info:
        build_task_model(body, TaskSpec(task="classify", labels=["a", "b"], head_bilstm=2))
    assert "\n" not in str(info.value) and body.config.head == "lm"  # refused before the LM head was stripped


@pytest.mark.parametrize("fields, field", [
    (dict(task="seq2seq", head_bilstm=2), "head_bilstm"),
    (dict(task="classify", head_bilstm=-1), "head_bilstm"),
    (dict(task="classify", head_bilstm_hidden=8), "head_bilstm_hidden"),
])
def test_spec_validation_names_the_field(fields, field):
    with pytest.raises(ConfigError, match=rf"TaskSpec\.{field}="):
        TaskSpec(**fields)


def test_no_hugging_face_head_is_written_for_a_bilstm_head():
    model = build_task_model(encoder(), TaskSpec(task="classify", labels=["a", "b"], head_bilstm=1))
    with pytest.raises(UserInputError, match="BiLSTM"):
        to_hf_head(model)


def test_frozen_body_finetune_trains_the_bilstm_and_saves_it(tmp_path):
    tok = th.tokenizer(tmp_path, "bert")
    train = th.write_conll(tmp_path / "train.conll", 8)
    spec = TaskSpec(task="tag", head_bilstm=2)
    result = finetune(th.body("bert", tok, n_layers=1), spec, train, config=th.train_config(steps=2, batch_size=4),
                      recipe=Recipe(freeze_body=True), out=tmp_path / "run", tokenizer=tok)
    assert result.train.step == 2
    groups = layer_groups(result.model)  # the BiLSTM is part of the head: with a frozen body, it is what trains
    top = max(groups.values())
    assert all(groups[n] == top for n, _ in result.model.named_parameters() if n.startswith("head.bilstm."))
    reloaded = load_task_model(tmp_path / "run" / "model")
    assert isinstance(reloaded.head, BiLSTMHead) and reloaded.spec.head_bilstm == 2


def test_cli_flags_reach_the_spec_and_a_decoder_is_refused_writing_nothing(tmp_path, capsys):
    settings = finetune_settings({"model": "bert-tiny", "task": "tag", "train": "x.conll", "out": str(tmp_path / "o"),
                                  "head_bilstm": 2, "head_bilstm_hidden": 12})
    assert settings["task"]["head_bilstm"] == 2 and settings["task"]["head_bilstm_hidden"] == 12
    tok = th.tokenizer(tmp_path, "gpt")
    gpt_dir = checkpoint.save(th.body("gpt", tok, n_layers=1), tmp_path / "gpt", tokenizer=tok)
    train = th.write_sentiment(tmp_path / "train.tsv", 8)
    capsys.readouterr()
    assert main(["finetune", "--model", str(gpt_dir), "--out", str(tmp_path / "refused"), "--task", "classify",
                 "--train", str(train), "--head-bilstm", "2", "--max-steps", "1", "--no-progress",
                 "--no-tensorboard"]) != 0
    err = capsys.readouterr().err.strip()
    assert "head_bilstm=2" in err and "arch='decoder'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "refused").exists()  # a refused command writes nothing
