"""The Trainer's loss terms: a micro-batch that holds no target of one term adds nothing to that term's mean
(its own mean over zero targets is NaN, which must reach neither the logged loss nor the gradient)."""

from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.models.transformer import LossTerm, ModelOutput
from lmforge.training import TrainConfig, Trainer


class TwoTerms(nn.Module):
    """A token term over ``labels`` and a pair term over ``pair_label``: each the mean squared error of one weight."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(1.0))
        self.b = nn.Parameter(torch.tensor(2.0))

    def forward(self, labels, pair_label):
        tokens = labels[labels != -100].float()
        pairs = pair_label[pair_label != -100].float()
        token_loss = ((self.a - tokens) ** 2).mean()  # NaN when the micro-batch has no token target
        pair_loss = ((self.b - pairs) ** 2).mean()
        terms = [LossTerm("tokens", "labels", token_loss), LossTerm("pair", "pair_label", pair_loss)]
        return ModelOutput(loss=token_loss + pair_loss, n_targets=int(tokens.numel()), loss_terms=terms)


def identity(batch):
    return batch


def test_a_micro_batch_without_targets_of_a_term_adds_nothing_to_it(tmp_path):
    model = TwoTerms()
    cfg = TrainConfig(max_steps=1, lr=1e-3, eval_every=0, progress=False, tensorboard=False, precision="fp32",
                      grad_accum=2)
    with_tokens = {"labels": torch.tensor([[3, -100]]), "pair_label": torch.tensor([0])}
    without = {"labels": torch.tensor([[-100, -100]]), "pair_label": torch.tensor([1])}
    trainer = Trainer(model, identity, [with_tokens, without], cfg, out=tmp_path)
    result = trainer.accumulate([with_tokens, without])
    # token term: mean over its one target (1 - 3)^2 = 4; pair term: mean over two, ((2-0)^2 + (2-1)^2) / 2 = 2.5
    assert math.isclose(result["loss"], 4.0 + 2.5)
    assert math.isclose(float(model.a.grad), 2 * (1 - 3))
    assert math.isclose(float(model.b.grad), (2 * (2 - 0) + 2 * (2 - 1)) / 2)
