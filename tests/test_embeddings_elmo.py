"""ELMo's biLM: neither direction sees the token it predicts; padding-invariance; the scalar mix; learning."""

from __future__ import annotations

import pytest
import torch

from lmforge.models.bilstm_lm import BiLM, BiLMConfig, bilm_labels, reverse_within_length
from lmforge.objectives.bilm import BiLMObjective


@pytest.fixture
def lm():
    torch.manual_seed(0)
    return BiLM(BiLMConfig(vocab_size=40, d_embed=12, d_hidden=12, n_layers=2, dropout=0.0)).eval()


def test_neither_lm_sees_the_token_it_predicts(lm):
    ids = torch.randint(1, 40, (1, 9))
    t = 4
    perturbed = ids.clone()
    perturbed[0, t] = (ids[0, t] % 39) + 1  # another real token
    with torch.no_grad():
        a, b = lm(ids), lm(perturbed)
    # forward LM: position t-1 predicts token t, and so does everything before it
    torch.testing.assert_close(a.forward_logits[0, :t], b.forward_logits[0, :t])
    # backward LM: position t+1 predicts token t, from the right context only
    torch.testing.assert_close(a.backward_logits[0, t + 1:], b.backward_logits[0, t + 1:])
    # ... while the positions that do read token t change (so the test can fail)
    assert not torch.allclose(a.forward_logits[0, t], b.forward_logits[0, t])
    assert not torch.allclose(a.backward_logits[0, t], b.backward_logits[0, t])


def test_padding_does_not_change_the_states_of_real_tokens(lm):
    ids = torch.randint(1, 40, (1, 5))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    with torch.no_grad():
        alone, batched = lm.layer_states(ids), lm.layer_states(padded, mask)
    for x, y in zip(alone, batched):
        torch.testing.assert_close(y[:, :5], x)


def test_reverse_within_length_is_an_involution_that_keeps_padding():
    x = torch.arange(10).view(2, 5)
    lengths = torch.tensor([5, 3])
    assert reverse_within_length(x, lengths).tolist() == [[4, 3, 2, 1, 0], [7, 6, 5, 8, 9]]
    assert torch.equal(reverse_within_length(reverse_within_length(x, lengths), lengths), x)


def test_loss_is_mean_ce_of_both_directions_over_real_targets(lm):
    ids = torch.randint(1, 40, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    ids[1, 4:] = 0
    with torch.no_grad():
        out = lm(ids, attention_mask=mask, labels=bilm_labels(ids, mask))
    terms = []
    for b, n in enumerate([6, 4]):
        terms += [torch.log_softmax(out.forward_logits[b, t], -1)[ids[b, t + 1]] for t in range(n - 1)]
        terms += [torch.log_softmax(out.backward_logits[b, t], -1)[ids[b, t - 1]] for t in range(1, n)]
    assert out.n_targets == len(terms) == 2 * (5 + 3)
    assert float(out.loss) == pytest.approx(-float(torch.stack(terms).mean()), rel=1e-5)


def test_elmo_is_the_softmax_weighted_mix_and_its_weights_sum_to_one(lm):
    ids = torch.randint(1, 40, (2, 6))
    with torch.no_grad():
        lm.scalar_mix.scalars.copy_(torch.tensor([1.0, -1.0, 0.5]))
        lm.scalar_mix.gamma.fill_(0.7)
        layers = lm.layer_states(ids)
        w = lm.scalar_mix.weights
        assert float(w.sum()) == pytest.approx(1.0) and len(layers) == 3
        assert all(l.shape == (2, 6, 24) for l in layers)
        torch.testing.assert_close(lm.elmo(ids), 0.7 * sum(wi * l for wi, l in zip(w, layers)))


@pytest.mark.filterwarnings("ignore:train_data has no state_dict")  # a plain list: resume is not under test
def test_pretraining_lowers_the_loss(tmp_path):
    from lmforge.training import TrainConfig, Trainer
    from lmforge.training.logging import read_metrics

    torch.manual_seed(0)
    lm = BiLM(BiLMConfig(vocab_size=12, d_embed=16, d_hidden=16, n_layers=1, dropout=0.0))
    seq = [[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1]]
    cfg = TrainConfig(max_steps=80, lr=2e-2, eval_every=0, save_every=0, progress=False, tensorboard=False,
                      precision="fp32", schedule="constant", weight_decay=0.0)
    Trainer(lm, BiLMObjective(pad_token_id=0), [seq], cfg, out=tmp_path / "run").fit()
    losses = [r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert losses[-1] < 0.3 * losses[0]


@pytest.mark.filterwarnings("ignore:train_data has no state_dict")  # a plain list: resume is not under test
def test_the_trainer_runs_the_bilm_objective_unchanged(tmp_path):
    from lmforge.training import TrainConfig, Trainer

    torch.manual_seed(0)
    lm = BiLM(BiLMConfig(vocab_size=12, d_embed=16, d_hidden=16, n_layers=1, dropout=0.0))
    data = [[[1, 2, 3, 4, 5, 6], [6, 5, 4, 3]]] * 4  # raw batches: lists of token sequences
    cfg = TrainConfig(max_steps=30, lr=2e-2, eval_every=30, save_every=0, progress=False, tensorboard=False,
                      precision="fp32", schedule="constant", weight_decay=0.0)
    trainer = Trainer(lm, BiLMObjective(pad_token_id=0), data, cfg, out=tmp_path / "run", eval_data=data[:1])
    first = trainer.evaluate()
    trainer.fit()
    last = trainer.evaluate()
    assert last["eval_loss"] < 0.5 * first["eval_loss"]
    assert last["eval_accuracy"] > first["eval_accuracy"]
    batch = BiLMObjective(pad_token_id=0)(data[0])
    assert int((batch["labels"] != -100).sum()) == 2 * (5 + 3)  # one target per prediction of either LM
