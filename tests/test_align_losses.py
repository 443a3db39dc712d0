"""The alignment objectives against their papers' formulas, on fixed numbers computed by hand.

DPO (Rafailov et al. 2023, eq. 7), IPO (Azar et al. 2023, eq. 17) and conservative DPO; the Bradley-Terry
loss; PPO's GAE (Schulman et al. 2016) on a fixed trajectory, its KL-penalised rewards, clipped policy and
value losses; GRPO's group advantages (Shao et al. 2024) and its k3 KL estimate.
"""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.align.dpo import dpo_loss
from lmforge.align.grpo import arithmetic_prompts, exact_answer_reward, group_advantages, k3_kl
from lmforge.align.ppo import clipped_policy_loss, clipped_value_loss, gae, kl_penalty_rewards, whiten
from lmforge.align.reward import bradley_terry_loss, pairwise_accuracy
from lmforge.align.rollouts import KLController, gather_response, response_index


def _logps(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(-10 * torch.rand(5, generator=g, dtype=torch.float64)).requires_grad_(i < 2) for i in range(4)]


def _paper_dpo(pc, pr, rc, rr, beta, eps=0.0):
    """Eq. 7 written out per pair: -log sigma(beta log pi(y_w)/pi_ref(y_w) - beta log pi(y_l)/pi_ref(y_l))."""
    out = []
    for i in range(len(pc)):
        z = beta * ((pc[i] - rc[i]) - (pr[i] - rr[i]))
        sig = 1 / (1 + torch.exp(-z))
        out.append(-(1 - eps) * torch.log(sig) - eps * torch.log(1 - sig))
    return torch.stack(out)


@pytest.mark.parametrize("beta, eps", [(0.1, 0.0), (0.5, 0.0), (0.3, 0.2)])
def test_dpo_loss_and_gradients_equal_the_paper_formula(beta, eps):
    pc, pr, rc, rr = _logps()
    ours, chosen, rejected = dpo_loss(pc, pr, rc, rr, beta, "sigmoid", eps)
    g_ours = torch.autograd.grad(ours.mean(), [pc, pr])
    paper = _paper_dpo(pc, pr, rc, rr, beta, eps)
    g_paper = torch.autograd.grad(paper.mean(), [pc, pr])
    torch.testing.assert_close(ours, paper)
    for a, b in zip(g_ours, g_paper):
        torch.testing.assert_close(a, b)
    # The paper's gradient: -beta * sigma(-z) on log pi(y_w), +beta * sigma(-z) on log pi(y_l) (eps = 0), / B.
    if eps == 0:
        z = beta * ((pc - rc) - (pr - rr)).detach()
        torch.testing.assert_close(g_ours[0], -beta * torch.sigmoid(-z) / 5)
        torch.testing.assert_close(g_ours[1], beta * torch.sigmoid(-z) / 5)
    torch.testing.assert_close(chosen, beta * (pc - rc).detach())
    torch.testing.assert_close(rejected, beta * (pr - rr).detach())


def test_ipo_loss_is_the_squared_distance_to_half_over_beta():
    pc, pr, rc, rr = _logps(1)
    beta = 0.25
    ours, _, _ = dpo_loss(pc, pr, rc, rr, beta, "ipo")
    h = (pc - rc) - (pr - rr)
    torch.testing.assert_close(ours, (h - 1 / (2 * beta)) ** 2)
    # At its optimum the log-ratio margin is exactly 1 / (2 beta): the loss and its gradient vanish.
    at = torch.tensor([2.0], requires_grad=True)
    loss, _, _ = dpo_loss(at, torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([0.0]), beta, "ipo")
    loss.sum().backward()
    assert float(loss.detach()) == 0 and float(at.grad) == 0


def test_dpo_is_log2_for_the_reference_itself():
    x = torch.tensor([-3.0, -7.5])
    loss, _, _ = dpo_loss(x, x - 1, x, x - 1, beta=0.7)
    torch.testing.assert_close(loss, torch.full((2,), math.log(2)))


def test_bradley_terry_is_log2_at_equal_scores_and_falls_with_the_margin():
    s = torch.tensor([0.3, -2.0, 5.0])
    assert float(bradley_terry_loss(s, s)) == pytest.approx(math.log(2))
    assert float(bradley_terry_loss(s + 1, s)) == pytest.approx(-math.log(1 / (1 + math.exp(-1))))
    assert float(bradley_terry_loss(s + 1, s)) < math.log(2) < float(bradley_terry_loss(s, s + 1))
    assert pairwise_accuracy([1.0, 2.0, 0.0, 1.0], [0.0, 3.0, -1.0, 1.0]) == 0.5  # a tie is not a win


def test_gae_equals_a_hand_computation_on_a_fixed_trajectory():
    # Two responses: lengths 3 and 2 (the second padded). gamma 0.9, lambda 0.8.
    rewards = torch.tensor([[0.1, -0.2, 1.0], [0.5, 2.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.3, 0.6, 0.4], [1.0, -0.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    g, lam = 0.9, 0.8
    # row 0, by hand: the deltas, then A_t = delta_t + g*lam*A_{t+1}
    d2 = 1.0 - 0.4
    d1 = -0.2 + g * 0.4 - 0.6
    d0 = 0.1 + g * 0.6 - 0.3
    a2 = d2
    a1 = d1 + g * lam * a2
    a0 = d0 + g * lam * a1
    # row 1: length 2, V after the end is 0
    e1 = 2.0 - (-0.5)
    e0 = 0.5 + g * (-0.5) - 1.0
    b1 = e1
    b0 = e0 + g * lam * b1
    expected = torch.tensor([[a0, a1, a2], [b0, b1, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, (expected + values) * mask)


def test_kl_penalised_rewards_pay_the_score_at_the_last_token():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-0.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    r = kl_penalty_rewards(torch.tensor([2.0, -1.0]), old, ref, mask, kl_coef=0.1)
    torch.testing.assert_close(r, torch.tensor([[-0.05, 0.0, 0.1 + 2.0], [0.05, 0.0 - 1.0, 0.0]]))
    # policy == reference: no penalty at all, only the scores
    r0 = kl_penalty_rewards(torch.tensor([2.0, -1.0]), old, old, mask, kl_coef=0.1)
    torch.testing.assert_close(r0, torch.tensor([[0.0, 0.0, 2.0], [0.0, -1.0, 0.0]]))


def test_clipped_policy_objective_matches_its_formula():
    g = torch.Generator().manual_seed(3)
    old = -3 * torch.rand(4, 6, generator=g)
    logps = (old + 0.5 * torch.randn(4, 6, generator=g)).requires_grad_(True)
    adv = torch.randn(4, 6, generator=g)
    mask = (torch.arange(6) < torch.tensor([[6], [4], [2], [5]])).long()
    eps = 0.2
    loss, frac = clipped_policy_loss(logps, old, adv, mask, eps)
    terms, clipped = [], 0
    for i in range(4):
        for t in range(6):
            if mask[i, t]:
                ratio = math.exp(float(logps[i, t]) - float(old[i, t]))
                a = float(adv[i, t])
                terms.append(-min(ratio * a, max(min(ratio, 1 + eps), 1 - eps) * a))
                clipped += (ratio > 1 + eps and a > 0) or (ratio < 1 - eps and a < 0)
    assert float(loss) == pytest.approx(sum(terms) / len(terms), rel=1e-5)
    assert float(frac) == pytest.approx(clipped / len(terms))
    loss.backward()  # clipped tokens pass no gradient
    ratio = torch.exp(logps.detach() - old)
    outside = ((ratio > 1 + eps) & (adv > 0)) | ((ratio < 1 - eps) & (adv < 0))
    assert torch.all(logps.grad[outside.bool() & mask.bool()] == 0)


def test_clipped_value_loss_matches_its_formula():
    v, v_old, ret = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.1]]), torch.tensor([[2.0, -1.0]])
    loss = clipped_value_loss(v, v_old, ret, torch.ones(1, 2), eps=0.2)
    # token 0: max((1-2)^2, (0.7-2)^2) = 1.69; token 1: max((0+1)^2, (0+1)^2) = 1
    assert float(loss) == pytest.approx(0.5 * (1.69 + 1.0) / 2)


def test_whitening_and_adaptive_kl():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    w = whiten(x, m)
    assert float(w[m.bool()].mean()) == pytest.approx(0, abs=1e-6) and float(w[~m.bool()].abs().sum()) == 0
    ctl = KLController(0.2, target=6.0, horizon=100)
    ctl.update(kl=12.0, n=10)  # KL twice the target: the error is clipped to 0.2
    assert ctl.coef == pytest.approx(0.2 * (1 + 0.2 * 10 / 100))
    fixed = KLController(0.2)
    fixed.update(kl=100.0, n=10)
    assert fixed.coef == 0.2


def test_grpo_group_advantages_have_mean_zero_per_group():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(5 * 4, generator=g)
    scores[8:12] = 1.0  # a group whose samples tie: advantage 0, not nan
    adv = group_advantages(scores, group=4).view(5, 4)
    torch.testing.assert_close(adv.mean(1), torch.zeros(5), atol=1e-6, rtol=0)
    assert torch.all(adv[2] == 0)
    raw = scores.view(5, 4)
    torch.testing.assert_close(adv[0], (raw[0] - raw[0].mean()) / (raw[0].std() + 1e-4))


def test_k3_kl_is_zero_at_equality_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    assert torch.all(k3_kl(logp, logp) == 0)
    assert torch.all(k3_kl(logp, logp + torch.tensor([0.3, -0.4, 1.0])) > 0)


def test_response_index_gathers_each_rows_response():
    index, mask = response_index(torch.tensor([1, 0]), torch.tensor([2, 3]))
    values = torch.arange(8.0).view(2, 4)
    assert gather_response(values, index, mask).tolist() == [[1.0, 2.0, 0.0], [4.0, 5.0, 6.0]]


def test_arithmetic_problems_are_checked_exactly():
    rows = arithmetic_prompts(50, seed=3)
    assert rows == arithmetic_prompts(50, seed=3) and len({r["prompt"] for r in rows}) > 10
    for r in rows:
        a, op, b = r["prompt"][0], r["prompt"][1], r["prompt"][2:-1]
        assert int(r["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    answers = [r["answer"] for r in rows[:3]]
    assert exact_answer_reward([""] * 3, [f" {answers[0]}", f"{answers[1]}0", "x"], rows[:3]) == [1.0, 0.0, 0.0]
