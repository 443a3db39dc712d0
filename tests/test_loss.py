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


def test_scaled_loss_scales_the_gradient():
    # backward skips the rescale only when it is seeded with exactly 1 (a plain loss.backward())
    logits = torch.randn(40, 30, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 30, (40,))
    (g1,) = torch.autograd.grad(cross_entropy(logits, target) * 0.25, logits)
    (g2,) = torch.autograd.grad(F.cross_entropy(logits, target) * 0.25, logits)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_equals_chunked(dtype, reduction):
    # fused=True is the torch.compile'd kernel a compiled model uses; one graph serves every row count
    for n in (5, 37):
        logits = (torch.randn(n, 300, dtype=torch.float64) * 4).to(dtype).requires_grad_()
        target = torch.randint(0, 300, (n,))
        fused = cross_entropy(logits, target, reduction, fused=True)
        (g_fused,) = torch.autograd.grad(fused, logits)
        chunked = cross_entropy(logits, target, reduction)
        (g_chunked,) = torch.autograd.grad(chunked, logits)
        assert fused.dtype == chunked.dtype
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(fused, chunked, atol=tol, rtol=tol)
        torch.testing.assert_close(g_fused.float(), g_chunked.float(), atol=tol if dtype == torch.float64 else 4e-3,
                                   rtol=tol if dtype == torch.float64 else 1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_confidently_wrong_rows_keep_a_finite_exact_loss(dtype):
    # p(target) = exp(-200) underflows fp32: the loss must come from the logits, not from log(p)
    logits = torch.zeros(4, 64)
    logits[:, 0] = 200.0
    target = torch.tensor([5, 0, 9, 63])
    ref = F.cross_entropy(logits.double(), target)
    for fused in (False, True):
        ours = cross_entropy(logits.to(dtype).requires_grad_(), target, fused=fused)
        assert torch.isfinite(ours), fused
        torch.testing.assert_close(ours.double(), ref, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("n", [5, 600])  # one chunk and several
def test_row_weights_give_the_weighted_sum(fused, n):
    logits = torch.randn(n, 40, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 40, (n,))
    weight = torch.rand(n, dtype=torch.float64)
    ours = cross_entropy(logits, target, fused=fused, weight=weight)
    ref = (F.cross_entropy(logits, target, reduction="none") * weight).sum()
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    (g1,) = torch.autograd.grad(ours * 0.5, logits)
    (g2,) = torch.autograd.grad(ref * 0.5, logits)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the loss-only path weighs rows too
        torch.testing.assert_close(cross_entropy(logits, target, weight=weight), ref.detach(), rtol=1e-12, atol=1e-12)


def test_row_weights_need_one_per_row():
    with pytest.raises(ValueError, match=r"weight has shape \(3,\); it needs one weight per row, \(4,\)"):
        cross_entropy(torch.randn(4, 6), torch.randint(0, 6, (4,)), weight=torch.ones(3))
