"""LR schedules: the shape of each (warmup peak, decay endpoint, slanted triangular's cut), against the formulas."""

from __future__ import annotations

import math

import pytest

from lmforge.training.config import SCHEDULES
from lmforge.training.schedules import Schedule

T, W = 100, 10


@pytest.mark.parametrize("name", ["linear", "cosine", "inverse-sqrt", "constant"])
def test_warmup_rises_linearly_to_the_peak(name):
    sched = Schedule(name, T, warmup=W)
    assert [sched(s) for s in range(1, W + 1)] == pytest.approx([s / W for s in range(1, W + 1)])
    assert sched(W) == 1.0
    assert max(sched(s) for s in range(1, T + 1)) == 1.0  # the peak is lr itself, reached once warmup ends


@pytest.mark.parametrize("min_ratio", [0.0, 0.1])
def test_linear_and_cosine_decay_end_at_min_ratio(min_ratio):
    linear = Schedule("linear", T, warmup=W, min_ratio=min_ratio)
    cosine = Schedule("cosine", T, warmup=W, min_ratio=min_ratio)
    assert linear(T) == pytest.approx(min_ratio) and cosine(T) == pytest.approx(min_ratio)
    mid = W + (T - W) // 2  # half-way through the decay
    assert linear(mid) == pytest.approx((1 + min_ratio) / 2) and cosine(mid) == pytest.approx((1 + min_ratio) / 2)
    # Cosine stays above the straight line in the first half of the decay and below it in the second.
    assert cosine(W + 20) > linear(W + 20) and cosine(T - 20) < linear(T - 20)
    s = W + 30
    expected = min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * (s - W) / (T - W)))
    assert cosine(s) == pytest.approx(expected)
    for sched in (linear, cosine):
        values = [sched(s) for s in range(W, T + 1)]
        assert all(a >= b for a, b in zip(values, values[1:]))


def test_inverse_sqrt_and_constant():
    inv = Schedule("inverse-sqrt", T, warmup=W)
    assert inv(4 * W) == pytest.approx(0.5) and inv(T) == pytest.approx(math.sqrt(W / T))
    assert Schedule("inverse-sqrt", T)(25) == pytest.approx(1 / 5)  # no warmup: 1/sqrt(s)
    assert {Schedule("constant", T, warmup=W)(s) for s in range(W, T + 1)} == {1.0}
    assert Schedule("constant", T)(1) == 1.0


def test_slanted_triangular_matches_ulmfit():
    cut_frac, ratio = 0.1, 32
    sched = Schedule("slanted-triangular", T, cut_frac=cut_frac, ratio=ratio)
    cut = math.floor(T * cut_frac)
    assert sched.cut == cut
    for s in range(1, T + 1):  # Howard & Ruder 2018, eq. 3
        p = s / cut if s < cut else 1 - (s - cut) / (cut * (1 / cut_frac - 1))
        assert sched(s) == pytest.approx((1 + p * (ratio - 1)) / ratio)
    assert sched(cut) == 1.0 and sched(T) == pytest.approx(1 / ratio)
    assert sched(1) < sched(cut // 2) < sched(cut) > sched(cut + 1)
    # The rise is short and steep, the fall long: the slopes differ by (1 - cut_frac) / cut_frac = 9x.
    rise, fall = sched(cut) - sched(cut - 1), sched(cut) - sched(cut + 1)
    assert rise / fall == pytest.approx((1 - cut_frac) / cut_frac)


@pytest.mark.parametrize("name", SCHEDULES)
def test_no_jumps_and_flat_past_the_end(name):
    sched = Schedule(name, T, warmup=0 if name == "slanted-triangular" else W)
    values = [sched(s) for s in range(1, T + 1)]
    assert max(abs(a - b) for a, b in zip(values, values[1:])) <= 0.1 + 1e-12  # the steepest is warmup's 1/W
    assert sched(T + 50) == sched(T)  # a run extended past max_steps stays at the final factor
    assert all(v > 0 for v in values[:-1])


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown schedule 'cosin'"):
        Schedule("cosin", T)
