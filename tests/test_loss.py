"""The lean cross-entropy equals F.cross_entropy in value and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmforge.nn.loss import cross_entropy


@pytest.mark.parametrize("n", [1, 7, 300, 600])
def test_matches_reference_fp32(n):
    logits = torch.randn(n, 50, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 50, (n,))
    ours = cross_entropy(logits, target)
    ref = F.cross_entropy(logits, target)
    torch.testing.assert_close(ours, ref)
    (g1,) = torch.autograd.grad(ours, logits)
    (g2,) = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(g1, g2)
    assert torch.autograd.gradcheck(lambda z: cross_entropy(z, target[:3]), (logits[:3].detach().requires_grad_(),))


def test_sum_reduction_and_bf16():
    logits = torch.randn(512, 1000, requires_grad=True)
    target = torch.randint(0, 1000, (512,))
    torch.testing.assert_close(cross_entropy(logits, target, "sum"), F.cross_entropy(logits, target, reduction="sum"))
    low = logits.detach().bfloat16().requires_grad_()
    ours = cross_entropy(low, target)
    ref = F.cross_entropy(low.float(), target)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    ours.backward()
    assert low.grad.dtype == torch.bfloat16
