"""lmforge.nn.dropout: the CPU mask drawn from 16-bit uniforms behaves as F.dropout's does."""

import pytest
import torch
import torch.nn.functional as F

from lmforge.nn.dropout import LEVELS, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_rate_expectation_and_gradient(p):
    torch.manual_seed(0)
    x = torch.randn(200_000, dtype=torch.float64, requires_grad=True)
    y = dropout(x, p)
    kept = y != 0
    assert abs(float(kept.double().mean()) - (1 - p)) < 0.005  # 4 standard errors at p = 0.5
    scale = LEVELS / round((1 - p) * LEVELS)
    assert torch.equal(y[kept], x[kept] * scale)  # survivors scaled by 1 / (rounded keep probability)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, kept.double() * scale)
    # the expectation over masks is x itself: E[mask] * scale = 1 exactly, for the rounded probability
    assert round((1 - p) * LEVELS) / LEVELS * scale == pytest.approx(1.0, abs=1e-15)


def test_seeded_reproducible_bf16_and_shapes():
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    torch.manual_seed(1)
    a = dropout(x, 0.3)
    torch.manual_seed(1)
    b = dropout(x, 0.3)
    assert torch.equal(a, b) and a.dtype == torch.bfloat16 and a.shape == x.shape
    assert not torch.equal(dropout(x, 0.3), a)  # the generator moved on


def test_every_16_bit_lane_is_uniform():
    """Each of a word's four int16 lanes must be uniform: a sign bit that never varies would bias one lane."""
    torch.manual_seed(0)
    mask, _ = keep_mask((400_000,), LEVELS // 2)  # keep probability 0.5
    lanes = mask.view(-1, 4).double().mean(0)
    assert torch.all((lanes - 0.5).abs() < 0.006), lanes


def test_falls_back_where_the_mask_cannot_be_drawn():
    x = torch.ones(1000)
    assert torch.equal(dropout(x, 0.0), x) and torch.equal(dropout(x, 0.5, training=False), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros(1000))  # F.dropout's p = 1
    torch.manual_seed(0)  # 1e-9 rounds to keeping every element: F.dropout draws that mask instead
    expected = F.dropout(x, 1e-9)
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 1e-9), expected)
