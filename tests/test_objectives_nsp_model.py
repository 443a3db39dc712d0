"""BERT's NSP head: the config rule, the loss (MLM mean + NSP mean, by hand), HF BertForPreTraining parity in
both directions (both heads, padded batches, and the loss), and the Trainer's weighting of the two means
under gradient accumulation (grad_accum=k, batch b == grad_accum=1, batch k*b)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import lmforge
from helpers import tiny_config
from lmforge.config import ConfigError
from lmforge.errors import UserInputError
from lmforge.models import Transformer
from lmforge.objectives.base import pad, pad_labels
from lmforge.training import Trainer
from test_interop_hf_parity import _assert_close, _batch, _bert, _perturb, tf
from test_training_optim import grads, ragged_examples, train_cfg

V = 97


def bert_nsp(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config(arch="encoder", head="mlm", type_vocab_size=2, embedding_norm=True, pooler=True,
                                   nsp_head=True, **kw))


def test_nsp_head_needs_an_encoder_with_a_pooler():
    with pytest.raises(ConfigError, match="nsp_head=True needs arch='encoder' and pooler=True"):
        tiny_config(arch="encoder", head="mlm", nsp_head=True)
    with pytest.raises(ConfigError, match="nsp_head=True needs arch='encoder'"):
        tiny_config(arch="decoder", nsp_head=True)
    assert not lmforge.ModelConfig.from_preset("bert-tiny").nsp_head  # off by default: presets are unchanged
    assert Transformer(tiny_config(arch="encoder", head="mlm", pooler=True)).nsp_head is None


def test_loss_is_mlm_mean_plus_nsp_mean_by_hand():
    model = bert_nsp().eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (3, 8), generator=g)
    labels = torch.full((3, 8), -100)
    labels[0, 1], labels[0, 4], labels[1, 2], labels[2, 7] = 11, 12, 13, 14
    nsp_labels = torch.tensor([0, 1, -100])  # the third pair is not scored
    with torch.no_grad():
        full = model(ids)  # (B, T, V) logits and (B, 2) NSP logits
        out = model(ids, labels=labels, next_sentence_label=nsp_labels)
    sel = labels != -100
    mlm = F.cross_entropy(full.logits[sel], labels[sel])
    nsp = F.cross_entropy(full.nsp_logits[:2], nsp_labels[:2])
    torch.testing.assert_close(out.loss, mlm + nsp)
    assert out.n_targets == 4
    assert [(t.name, t.labels_key) for t in out.loss_terms] == [("tokens", "labels"), ("nsp", "next_sentence_label")]
    torch.testing.assert_close(out.loss_terms[0].loss, mlm)
    torch.testing.assert_close(out.loss_terms[1].loss, nsp)
    alone = model(ids, next_sentence_label=nsp_labels)  # NSP only: its mean over the scored pairs
    torch.testing.assert_close(alone.loss, nsp)
    assert alone.n_targets == 2 and alone.loss_terms is None
    with pytest.raises(UserInputError, match="no NSP head"):
        Transformer(tiny_config(arch="encoder", head="mlm", pooler=True))(ids, next_sentence_label=nsp_labels)


def _hf_pretraining():
    torch.manual_seed(0)
    return _perturb(tf.BertForPreTraining(tf.BertConfig(**_bert()))).eval()


def _compare(ours, theirs, real: torch.Tensor) -> None:
    _assert_close(ours.logits, theirs.prediction_logits, real)
    _assert_close(ours.nsp_logits, theirs.seq_relationship_logits, torch.ones(len(real), dtype=torch.bool))


def test_from_hf_bert_for_pretraining_matches_both_heads_and_the_loss():
    hf = _hf_pretraining()
    model = lmforge.from_hf(hf)
    assert model.config.nsp_head and model.config.pooler
    inputs, real = _batch(model.config)
    with torch.no_grad():
        _compare(model(**inputs), hf(**inputs), real)
        labels = torch.where(real & (torch.arange(real.shape[1]) % 3 == 1), inputs["input_ids"], -100)
        nsp = torch.tensor([0, 1, 1])
        ours = model(**inputs, labels=labels, next_sentence_label=nsp).loss
        theirs = hf(**inputs, labels=labels, next_sentence_label=nsp).loss
    assert abs(float(ours) - float(theirs)) <= 1e-4


def test_to_hf_writes_bert_for_pretraining_and_round_trips(tmp_path):
    torch.manual_seed(0)
    model = _perturb(lmforge.build_model("bert-tiny", d_model=32, n_heads=4, d_ff=64, n_layers=2, max_seq_len=64,
                                         vocab_size=V, pooler=True, nsp_head=True)).eval()
    path = lmforge.to_hf(model, tmp_path / "hf")
    hf, info = tf.BertForPreTraining.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    inputs, real = _batch(model.config)
    with torch.no_grad():
        _compare(model(**inputs), hf.eval()(**inputs), real)
    back = lmforge.from_hf(path)
    assert back.config.nsp_head
    ours, again = model.state_dict(), back.state_dict()
    assert ours.keys() == again.keys() and all(torch.equal(ours[k], again[k]) for k in ours)
    # Without the NSP head, the same model is still written as BertForMaskedLM.
    plain = lmforge.build_model("bert-tiny", d_model=32, n_heads=4, d_ff=64, n_layers=1, vocab_size=V, pooler=True)
    written = json.loads((lmforge.to_hf(plain, tmp_path / "plain") / "config.json").read_text())
    assert written["architectures"] == ["BertForMaskedLM"]


def nsp_examples(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(ids, MLM labels, NSP label): the MLM counts differ per example, so token and pair shares differ."""
    g = torch.Generator().manual_seed(seed + 100)
    return [(ids, labels, int(torch.randint(2, (), generator=g))) for ids, labels in ragged_examples(n, seed)]


def collate(examples) -> dict[str, torch.Tensor]:
    ids, real = pad([e[0] for e in examples], 0)
    return {"input_ids": ids, "attention_mask": real.long(), "labels": pad_labels([e[1] for e in examples]),
            "next_sentence_label": torch.tensor([e[2] for e in examples])}


@pytest.mark.filterwarnings("ignore:train_data has no state_dict")
def test_grad_accumulation_weighs_the_nsp_mean_by_pairs(tmp_path):
    examples = nsp_examples(8, seed=1)
    counts = [int((lab != -100).sum()) for _, lab, _ in examples]
    assert len(set(sum(counts[i:i + 2]) for i in range(0, 8, 2))) > 1  # token shares differ from pair shares
    micro = [examples[i:i + 2] for i in range(0, 8, 2)]
    a, b = bert_nsp(), bert_nsp()
    ta = Trainer(a, collate, micro, train_cfg(grad_accum=4, batch_size=2), out=tmp_path / "a")
    tb = Trainer(b, collate, [examples], train_cfg(grad_accum=1, batch_size=8), out=tmp_path / "b")
    stats_a = ta.accumulate([collate(m) for m in micro])
    stats_b = tb.accumulate([collate(examples)])
    with torch.no_grad():
        whole = b(**collate(examples)).loss  # HF's loss of the one big batch: MLM mean + NSP mean
    assert stats_a["loss"] == pytest.approx(stats_b["loss"], rel=1e-6)
    assert stats_b["loss"] == pytest.approx(float(whole), rel=1e-6)
    ga, gb = grads(a), grads(b)
    assert "nsp_head.classifier.weight" in gb
    c = bert_nsp()
    c(**collate(examples)).loss.backward()  # the gradient of HF's loss of the one big batch
    for name, grad in grads(c).items():
        torch.testing.assert_close(gb[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    for name in gb:
        torch.testing.assert_close(ga[name], gb[name], rtol=1e-5, atol=1e-7, msg=name)
    # Weighing the NSP term by the micro-batch's token share instead (out.loss * n / N) is a different gradient.
    a.zero_grad()
    total = sum(counts)
    for m in micro:
        batch = collate(m)
        (a(**batch).loss * int((batch["labels"] != -100).sum()) / total).backward()
    assert max(float((a.get_parameter(n).grad - gb[n]).abs().max()) for n in gb) > 1e-5


@pytest.mark.filterwarnings("ignore:train_data has no state_dict")
def test_evaluation_reports_nsp_loss_and_accuracy(tmp_path):
    examples = nsp_examples(8, seed=2)
    model = bert_nsp()
    cfg = train_cfg(eval_every=1, eval_batches=2)
    trainer = Trainer(model, collate, [examples[:4]], cfg, eval_data=[examples[:4], examples[4:]],
                      out=tmp_path / "run")
    record = trainer.evaluate()
    model.eval()
    with torch.no_grad():
        outs = [model(**collate(part)) for part in (examples[:4], examples[4:])]
    nsp = torch.cat([o.nsp_logits for o in outs])  # (8, 2)
    labels = torch.tensor([e[2] for e in examples])
    assert record["eval_nsp_accuracy"] == pytest.approx(float((nsp.argmax(-1) == labels).float().mean()))
    assert record["eval_nsp_loss"] == pytest.approx(float(F.cross_entropy(nsp, labels)), rel=1e-5)
    tokens = sum(o.loss_terms[0].loss * o.n_targets for o in outs) / sum(o.n_targets for o in outs)
    assert record["eval_loss"] == pytest.approx(float(tokens), rel=1e-5)  # the MLM loss alone, as for mlm
