"""TinyBERT (Jiao et al. 2020): the layer map, each loss term against a hand computation or torch, the model's
pre-softmax attention scores, the width projections, the augmentation, and both stages end to end via the CLI.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import lmforge
from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.config import ConfigError
from lmforge.data.prepare import prepare
from lmforge.distillation.augmentation import TinyBertCandidates, augment_table
from lmforge.distillation.tinybert import IntermediateDistillation, TinyBertStudent, intermediate_terms
from lmforge.distillation.tinybert_losses import (
    WidthProjections,
    attention_score_mse,
    check_layer_map,
    parse_layer_map,
    soft_cross_entropy,
    state_mse,
    uniform_layer_map,
)
from lmforge.tasks.data import Table
from lmforge.tasks.finetune import finetune
from lmforge.tasks.model import load_task_model, read_task_meta
from lmforge.tasks.spec import TaskSpec
from tests import task_helpers as th


def tiny(n_layers=2, d_model=32, n_heads=2, vocab=60, **extra):
    return lmforge.build_model("bert-tiny", n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_ff=2 * d_model,
                               vocab_size=vocab, max_seq_len=32, dropout=0.0, attn_dropout=0.0, **extra)


# ---------------------------------------------------------------------------------------------- layer map
def test_uniform_map_parsed_maps_and_the_two_count_errors():
    assert uniform_layer_map(12, 4) == {0: 0, 1: 3, 2: 6, 3: 9, 4: 12}  # the paper's TinyBERT4 of BERT-base
    assert uniform_layer_map(3, 3) == {0: 0, 1: 1, 2: 2, 3: 3}
    assert parse_layer_map(" 0:0, 2:6,1:3") == {0: 0, 2: 6, 1: 3}
    assert check_layer_map({2: 6, 0: 0}, 6, 2) == {0: 0, 2: 6}
    with pytest.raises(ConfigError, match=r"teacher has 6 layers and the student 4") as bad:
        uniform_layer_map(6, 4)
    assert "\n" not in str(bad.value)
    for mapping, n_t, n_s in [({1: 7}, 6, 2), ({3: 2}, 6, 2)]:
        with pytest.raises(ConfigError, match=rf"student has {n_s} layers .* teacher {n_t}"):
            check_layer_map(mapping, n_t, n_s)
    with pytest.raises(ConfigError, match="embedding layer"):
        check_layer_map({0: 3}, 6, 2)
    for text in ("0-0", "a:1", "1:2,1:3"):
        with pytest.raises(ConfigError, match="layer_map"):
            parse_layer_map(text)


# ---------------------------------------------------------------------------------------------- losses
def test_state_mse_over_real_tokens_by_hand():
    s = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]]])  # (1, 3, 2): the last token is padding
    t = torch.tensor([[[0.0, 2.0], [1.0, 1.0], [0.0, 0.0]]])
    real = torch.tensor([[True, True, False]])
    by_hand = (1 + 0 + 4 + 9) / 4  # squared differences of the two real tokens, over 2 tokens x 2 dims
    assert float(state_mse(s, t, real)) == pytest.approx(by_hand)
    assert float(state_mse(s, t)) == pytest.approx((14 + 81 + 81) / 6)


def test_attention_score_mse_zeroes_masked_entries_and_counts_the_seen_ones():
    low = torch.finfo(torch.float32).min / 2  # what the attention writes at masked scores
    s = torch.tensor([[[[1.0, 2.0, low], [0.0, 1.0, low], [5.0, 5.0, low]]]])  # (1, 1, 3, 3): key 2 is padding
    t = torch.tensor([[[[0.0, 0.0, low], [0.0, 3.0, low], [0.0, 0.0, low]]]])
    real = torch.tensor([[True, True, False]])  # query 2 is padding too
    by_hand = (1 + 4 + 0 + 4) / 4
    assert float(attention_score_mse(s, t, real)) == pytest.approx(by_hand)
    two_heads = torch.cat([s, s + 1]), torch.cat([t, t])  # as a batch of 2: the mean over both
    assert float(attention_score_mse(*two_heads)) == pytest.approx((1 + 4 + 0 + 4 + 25 + 25 + 4 + 9 + 1 + 1 + 36
                                                                    + 36) / 12)


def test_soft_cross_entropy_by_hand_and_against_torch():
    z_s, z_t = torch.tensor([[1.0, 0.0, -1.0], [0.5, 0.5, 2.0]]), torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    for t in (1.0, 2.0):
        p = torch.softmax(z_t / t, -1)
        by_hand = -(p * torch.log_softmax(z_s / t, -1)).sum(-1).mean()
        assert float(soft_cross_entropy(z_s, z_t, t)) == pytest.approx(float(by_hand))
        assert float(soft_cross_entropy(z_s, z_t, t)) == pytest.approx(float(F.cross_entropy(z_s / t, p)))


# ---------------------------------------------------------------------------------------------- the model seam
def test_scores_are_q_k_over_sqrt_d_before_the_softmax_and_leave_the_output_alone():
    torch.manual_seed(0)
    model = tiny().eval()
    ids, mask = torch.randint(5, 60, (2, 6)), torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    plain = model(ids, attention_mask=mask, output_hidden_states=True)
    scored = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions="scores")
    probs = model(ids, attention_mask=mask, output_attentions=True).attentions
    torch.testing.assert_close(scored.last_hidden_state, plain.last_hidden_state)
    for a, p in zip(scored.attentions, probs):
        torch.testing.assert_close(a.softmax(-1), p)  # softmax of the scores: the weights
    attn = model.encoder.layers[0].attn
    x = plain.hidden_states[0]  # (B, T, D): what layer 0 reads (a post-LN block: its input as it is)
    q = attn.q(x).view(2, 6, 2, 16).transpose(1, 2)
    k = attn.k(x).view(2, 6, 2, 16).transpose(1, 2)
    by_hand = q @ k.transpose(-1, -2) / 16**0.5  # (B, H, T, T)
    torch.testing.assert_close(scored.attentions[0][0], by_hand[0])
    torch.testing.assert_close(scored.attentions[0][1][..., :4], by_hand[1][..., :4])  # the real keys
    assert bool((scored.attentions[0][1][..., 4:] < -1e30).all())  # padding keys carry the mask value


def test_projections_only_when_the_widths_differ_and_a_copy_of_the_teacher_has_zero_loss():
    assert WidthProjections(32, 32).w_h is None and WidthProjections(32, 32).w_e is None
    wide = WidthProjections(16, 32)
    assert tuple(wide.w_h.weight.shape) == (32, 16) and wide.w_h.bias is None and wide.w_e is not wide.w_h
    torch.manual_seed(0)
    teacher = tiny(n_layers=2)
    copy = tiny(n_layers=2)
    copy.load_state_dict(teacher.state_dict())
    batch = {"input_ids": torch.randint(5, 60, (2, 5)), "attention_mask": torch.tensor([[1] * 5, [1] * 3 + [0] * 2])}
    loss = IntermediateDistillation(teacher, uniform_layer_map(2, 2))
    out = loss(TinyBertStudent(copy.eval(), WidthProjections(32, 32)), batch)
    assert float(out.loss.detach()) < 1e-10 and out.n_targets == 8 and sorted(out.metrics) == ["attn", "embd", "hidn"]
    narrow = TinyBertStudent(tiny(n_layers=1, d_model=16), wide)
    terms = IntermediateDistillation(teacher, uniform_layer_map(2, 1))(narrow, batch)
    terms.loss.backward()
    assert wide.w_h.weight.grad is not None and wide.w_e.weight.grad is not None  # W learns with the student


def test_the_terms_pair_the_mapped_layers():
    """Student layer 1 of 1 against teacher layer 2 of 2: hidden_states[1] vs [2], attention 0 vs 1."""
    torch.manual_seed(1)
    teacher, student = tiny(n_layers=2).eval(), tiny(n_layers=1).eval()
    ids = torch.randint(5, 60, (1, 5))
    kw = dict(output_hidden_states=True, output_attentions="scores")
    with torch.no_grad():
        s, t = student(ids, **kw), teacher(ids, **kw)
        terms = intermediate_terms(s, t, {0: 0, 1: 2}, WidthProjections(32, 32), None)
    assert float(terms["hidn"]) == pytest.approx(float(F.mse_loss(s.hidden_states[1], t.hidden_states[2])))
    assert float(terms["attn"]) == pytest.approx(float(F.mse_loss(s.attentions[0], t.attentions[1])))
    assert float(terms["embd"]) == pytest.approx(float(F.mse_loss(s.hidden_states[0], t.hidden_states[0])))


# ---------------------------------------------------------------------------------------------- augmentation
def test_augmentation_is_seeded_keeps_labels_and_replaces_at_rate_p():
    rows = [{"text": " ".join(f"w{j}" for j in range(20)), "label": str(i % 2), "id": i} for i in range(10)]
    table = Table("t.tsv", rows, ["text", "label", "id"])
    propose = lambda row, words, i: ["X", "Y"]  # noqa: E731
    a = augment_table(table, ["text"], 3, propose, p=0.4, seed=7)
    b = augment_table(table, ["text"], 3, propose, p=0.4, seed=7)
    c = augment_table(table, ["text"], 3, propose, p=0.4, seed=8)
    assert a.rows == b.rows and a.rows != c.rows and len(a) == 40
    assert [r["label"] for r in a.rows] == [r["label"] for r in rows for _ in range(4)]  # labels kept, in order
    assert [r["id"] for r in a.rows[:4]] == [0, 0, 0, 0] and a.rows[0] == rows[0]  # the original first
    replaced = sum(w in ("X", "Y") for r in a.rows if r is not None for w in r["text"].split())
    assert 0.25 < replaced / (30 * 20) < 0.55  # about p of the copies' words
    assert augment_table(table, ["text"], 2, propose, p=0.0).rows[1]["text"] == rows[0]["text"]


def test_the_paper_proposer_mlm_for_single_pieces_and_neighbours_for_the_rest(tmp_path):
    tok = th.tokenizer(tmp_path, "bert")
    torch.manual_seed(0)
    mlm = th.body("bert", tok, n_layers=1)
    sentences = [s.split() for s, _ in th.sentiment_rows(100)] + [["thefilmplot", "movie"]] * 3
    propose = TinyBertCandidates(mlm, tok, sentences, k=5)
    words = ["the", "film", "was", "good"]
    assert len(propose.pieces("good")) == 1
    got = propose(0, words, 3)
    assert 0 < len(got) <= 5 and not any(w.startswith("##") or w.startswith("[") for w in got)
    assert propose(0, words, 3) == got  # cached: the same candidates for the same masked sentence
    assert len(propose.pieces("thefilmplot")) > 1
    assert propose(0, ["thefilmplot"], 0) == propose.neighbours("thefilmplot") and len(propose.neighbours("film")) == 5
    assert len(propose.pieces("plotfilm")) > 1 and propose(0, ["plotfilm"], 0) == []  # no vector: kept


# ---------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(folder, tokenizer, shards, pre-trained MLM folder with 2 layers): the general stage's inputs."""
    folder = tmp_path_factory.mktemp("tinybert")
    tok = th.tokenizer(folder, "bert")
    prepare([th.corpus(folder)], tok, folder / "data", val_fraction=0.1, progress=False)
    torch.manual_seed(0)
    mlm = checkpoint.save(th.body("bert", tok, n_layers=2), folder / "bert", tokenizer=tok)
    return folder, tok, folder / "data", mlm


COMMON = ["--precision", "fp32", "--no-progress", "--no-tensorboard", "--batch-size", "8", "--lr", "3e-3",
          "--save-every", "2", "--max-steps", "2"]


def test_general_then_task_distillation_via_the_cli(made, tmp_path, capsys):
    folder, tok, data, mlm = made
    train, dev = th.write_sentiment(tmp_path / "train.tsv", 16), th.write_sentiment(tmp_path / "dev.tsv", 8, seed=1)
    finetune(lmforge.load(mlm), TaskSpec(task="classify"), str(train), None, config=th.train_config(2),
             out=tmp_path / "ft", tokenizer=tok)

    general = tmp_path / "general"
    args = ["distill", "--method", "tinybert", "--teacher", str(mlm), "--data", str(data), "--out", str(general),
            "--override", "d_model=16", "--override", "d_ff=32", "--override", "n_layers=1", "--seq-len", "16",
            "--eval-every", "2", "--eval-batches", "1", *COMMON]
    assert main(args) == 0
    assert "layer map 0:0,1:2" in capsys.readouterr().err
    student = lmforge.load(general / "model")
    assert (student.config.n_layers, student.config.d_model) == (1, 16)
    logged = [json.loads(line) for line in (general / "metrics.jsonl").read_text().splitlines()]
    assert {"embd", "hidn", "attn"} <= set(logged[-2]) and logged[-1]["eval_loss"] > 0  # evaluation: the same loss
    saved = load_file(general / "checkpoints" / "step-00000002" / "model" / "model.safetensors")
    assert {k for k in saved if k.startswith("projections.")} == {"projections.w_e.weight", "projections.w_h.weight"}
    assert not any("projections" in k for k in load_file(general / "model" / "model.safetensors"))

    task = tmp_path / "task"
    args = ["distill", "--method", "tinybert", "--teacher", str(tmp_path / "ft" / "model"), "--student",
            str(general / "model"), "--train", str(train), "--eval", str(dev), "--out", str(task), "--eval-every", "2",
            "--augment", "1", "--augment-model", str(mlm), "--temperature", "1", *COMMON]
    assert main(args) == 0
    assert "augmented 16 examples x1 -> 32 rows" in capsys.readouterr().err
    rows = [json.loads(line) for line in (task / "augmented.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows[::2]] == [r["label"] for r in rows[1::2]]  # each copy keeps its label
    assert (task / "intermediate" / "model").is_dir() and read_task_meta(task / "best") is not None
    first = [json.loads(line) for line in (task / "intermediate" / "metrics.jsonl").read_text().splitlines()]
    assert {"embd", "hidn", "attn"} <= set(first[-1])  # the intermediate phase, then the prediction phase
    assert load_task_model(task / "model").body.config.d_model == 16
    assert "method: tinybert" in (task / "distill.yaml").read_text()


def test_refusals_are_one_line(made, tmp_path, capsys):
    folder, tok, data, _ = made
    mlm = checkpoint.save(th.body("bert", tok, n_layers=3), tmp_path / "bert", tokenizer=tok)
    base = ["distill", "--method", "tinybert", "--teacher", str(mlm), "--data", str(data), "--no-progress",
            "--max-steps", "1", "--precision", "fp32"]
    for extra, needle in [(["--override", "n_layers=2"], "teacher has 3 layers and the student 2"),
                          (["--layer-map", "0:0,1:5"], "student has 1 layers (0..1, 0 = embeddings) and the teacher 3"),
                          (["--override", "n_heads=4", "--override", "n_layers=1"], "--override n_heads=2")]:
        out = tmp_path / "run"
        assert main([*base, "--out", str(out), *extra]) != 0
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err
        assert not out.exists()  # a refused command writes nothing
