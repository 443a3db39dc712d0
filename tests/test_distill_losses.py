"""The distillation formulas against hand computations and torch's reference losses, the DistilBERT loss of a
batch (positions: real tokens for KL and cosine, masked tokens for MLM), and the student's initialisation from
every other teacher layer (layers 0, 2, 4, ...; DistilBERT's own script took 0, 2, 4, 7, 9, 11 of 12).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.config import ConfigError
from lmforge.distillation import (
    DistillConfig,
    PretrainingDistillation,
    cosine_embedding_loss,
    init_from_teacher,
    soft_target_kl,
    task_distillation_loss,
    teacher_layers,
    weighted_sum,
)

TINY = dict(d_model=32, n_heads=2, d_ff=64, vocab_size=60, max_seq_len=16)


def test_soft_target_kl_by_hand_and_against_kl_div():
    s, t, T = [1.0, 0.0, -1.0], [0.5, 0.5, 2.0], 2.0
    p_s = [math.exp(x / T) / sum(math.exp(y / T) for y in s) for x in s]
    p_t = [math.exp(x / T) / sum(math.exp(y / T) for y in t) for x in t]
    hand = T * T * sum(q * math.log(q / p) for p, q in zip(p_s, p_t))
    got = soft_target_kl(torch.tensor([s]), torch.tensor([t]), T)
    assert float(got) == pytest.approx(hand, rel=1e-6)

    g = torch.Generator().manual_seed(0)
    zs, zt = torch.randn(5, 11, generator=g), torch.randn(5, 11, generator=g) * 3
    for T in (1.0, 2.0, 4.0):
        ref = F.kl_div(F.log_softmax(zs / T, -1), F.softmax(zt / T, -1), reduction="batchmean") * T**2
        torch.testing.assert_close(soft_target_kl(zs, zt, T), ref)
    assert float(soft_target_kl(zs, zs, 2.0)) == pytest.approx(0.0, abs=1e-6)
    assert float(soft_target_kl(zs[:0], zt[:0], 2.0)) == 0.0  # no positions: no loss, not NaN


def test_the_t_squared_factor_keeps_the_gradient_size_at_high_temperature():
    # Hinton et al.: d KL / d z_s ~ (p_s - p_t) / T, and for high T (p_s - p_t) ~ (z_s - z_t) / (C T); times T^2
    # the gradient tends to (z_s - z_t) / C (zero-mean logits), whatever T is.
    g = torch.Generator().manual_seed(1)
    zs = torch.randn(3, 7, generator=g)
    zs = (zs - zs.mean(-1, keepdim=True)).requires_grad_()
    zt = torch.randn(3, 7, generator=g)
    zt = zt - zt.mean(-1, keepdim=True)
    soft_target_kl(zs, zt, 100.0).backward()
    torch.testing.assert_close(zs.grad, (zs.detach() - zt) / 7 / 3, atol=1e-3, rtol=1e-2)  # / 3: mean over rows


def test_cosine_term_by_hand_and_against_cosine_embedding_loss():
    a, b = torch.tensor([[3.0, 4.0]]), torch.tensor([[4.0, 3.0]])
    assert float(cosine_embedding_loss(a, b)) == pytest.approx(1 - 24 / 25)
    g = torch.Generator().manual_seed(2)
    hs, ht = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    ref = torch.nn.CosineEmbeddingLoss()(hs, ht, torch.ones(6))
    torch.testing.assert_close(cosine_embedding_loss(hs, ht), ref)


def test_weighted_sums():
    terms = {"ce": torch.tensor(0.5), "mlm": torch.tensor(3.0), "cos": torch.tensor(0.25)}
    assert float(weighted_sum(terms, DistillConfig().loss_weights())) == pytest.approx(5 * 0.5 + 2 * 3.0 + 0.25)
    assert float(weighted_sum({"mlm": torch.tensor(3.0)}, {"ce": 0.0, "mlm": 2.0, "cos": 0.0})) == 6.0
    zs, zt = torch.tensor([[1.0, -1.0]]), torch.tensor([[-1.0, 1.0]])
    kl = soft_target_kl(zs, zt, 2.0)
    assert float(task_distillation_loss(zs, zt, torch.tensor(0.7), 0.25, 2.0)) == pytest.approx(
        0.25 * float(kl) + 0.75 * 0.7)
    with pytest.raises(ConfigError, match="all 0"):
        DistillConfig(alpha_ce=0, alpha_mlm=0, alpha_cos=0)
    with pytest.raises(ConfigError, match="alpha=1.5"):
        DistillConfig(alpha=1.5)


def test_pretraining_loss_of_a_padded_batch_by_hand():
    torch.manual_seed(0)
    teacher = lmforge.build_model("bert-tiny", n_layers=2, **TINY)
    student = lmforge.build_model("bert-tiny", n_layers=1, dropout=0.0, attn_dropout=0.0, **TINY).train()
    ids = torch.randint(5, 60, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    labels = torch.full((2, 6), -100)
    labels[0, 1], labels[1, 2] = 7, 9
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    loss = PretrainingDistillation(teacher, {"ce": 5.0, "mlm": 2.0, "cos": 1.0}, 2.0)
    out = loss(student, batch)
    assert out.n_targets == loss.count_targets(batch) == 9  # real tokens: the KL and cosine positions

    s, t = student(ids, mask), teacher(ids, mask)
    real = mask.bool()
    kl = F.kl_div(F.log_softmax(s.logits[real] / 2, -1), F.softmax(t.logits[real] / 2, -1),
                  reduction="batchmean") * 4
    mlm = F.cross_entropy(s.logits[labels != -100], labels[labels != -100])
    cos = (1 - F.cosine_similarity(s.last_hidden_state[real], t.last_hidden_state[real], dim=-1)).mean()
    torch.testing.assert_close(out.loss, 5 * kl + 2 * mlm + cos)
    assert out.terms == pytest.approx({k: float(v.detach()) for k, v in {"ce": kl, "mlm": mlm, "cos": cos}.items()},
                                      rel=1e-5)
    torch.testing.assert_close(out.logits, s.logits[labels != -100])  # what evaluation scores

    out.loss.backward()  # the teacher is frozen: no gradient reaches it
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert not teacher.training
    student.eval()  # evaluation scores the student alone, on its own objective
    torch.testing.assert_close(loss(student, batch).loss, mlm)


def test_student_layers_come_from_every_other_teacher_layer():
    assert teacher_layers(12, 6) == [0, 2, 4, 6, 8, 10] and teacher_layers(6, 3) == [0, 2, 4]
    assert teacher_layers(5, 2) == [0, 2] and teacher_layers(4, 4) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="between 1 and the teacher's 2"):
        teacher_layers(2, 3)
    for preset in ("bert-tiny", "gpt-tiny"):
        torch.manual_seed(0)
        teacher = lmforge.build_model(preset, n_layers=6, **TINY)
        student = lmforge.build_model(preset, n_layers=3, **TINY)
        assert init_from_teacher(student, teacher) == [0, 2, 4]
        stack_t = getattr(teacher, "encoder", None) or teacher.decoder
        stack_s = getattr(student, "encoder", None) or student.decoder
        for i, j in enumerate([0, 2, 4]):
            want = stack_t.layers[j].state_dict()
            for name, tensor in stack_s.layers[i].state_dict().items():
                assert torch.equal(tensor, want[name]), (preset, i, name)
        outside = {k: v for k, v in student.state_dict().items() if ".layers." not in k}
        assert outside and all(torch.equal(v, teacher.state_dict()[k]) for k, v in outside.items())


def test_no_init_when_the_shapes_differ():
    teacher = lmforge.build_model("bert-tiny", n_layers=4, **TINY)
    student = lmforge.build_model("bert-tiny", n_layers=2, **{**TINY, "d_ff": 48})
    before = {k: v.clone() for k, v in student.state_dict().items()}
    assert init_from_teacher(student, teacher) is None
    assert all(torch.equal(v, before[k]) for k, v in student.state_dict().items())  # nothing was copied
