"""The statistics behind an experiment report's claims: seed std, the 2σ detectable difference, verdicts, seeds
needed, checked by hand and against scipy's Welch t-test."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from lmforge.experiments import power


def test_seed_std_is_the_sample_std():
    values = [5.45, 5.48, 5.47]
    # by hand: mean 5.4666..., squared deviations 0.000278 + 0.000178 + 0.000011 = 0.000467, / (n - 1) = 0.000233
    assert power.seed_std(values) == pytest.approx(math.sqrt(0.00046667 / 2), rel=1e-3)
    assert power.seed_std(values) == pytest.approx(float(np.std(values, ddof=1)))
    assert power.seed_std([1.0]) is None


def test_the_detectable_difference_is_twice_the_standard_error_of_the_difference():
    # by hand: 0.023² = 0.000529, 0.025² = 0.000625; (0.000529 + 0.000625) / 3 = 0.00038467; sqrt = 0.019613
    assert power.detectable(0.023, 3, 0.025, 3) == pytest.approx(0.039226, rel=1e-4)
    # unequal seed counts: 2 * sqrt(0.01/4 + 0.04/2) = 2 * sqrt(0.0225) = 0.3
    assert power.detectable(0.1, 4, 0.2, 2) == pytest.approx(0.3)


def test_seeds_needed_is_the_first_count_whose_bound_the_difference_clears():
    # 4 * (0.03² + 0.04²) / 0.015² = 0.01 / 0.000225 = 44.4: 45 seeds per cell
    n = power.seeds_needed(0.03, 0.04, 0.015)
    assert n == 45
    assert power.detectable(0.03, n, 0.04, n) < 0.015 < power.detectable(0.03, n - 1, 0.04, n - 1)
    assert power.seeds_needed(0.001, 0.001, 1.0) == 2  # never below two: one seed has no variance
    assert power.seeds_needed(0.03, 0.04, 0.0) is None


@pytest.mark.parametrize("better, than, lower, verdict", [
    ([5.45, 5.48, 5.47], [5.62, 5.66, 5.63], True, power.REPRODUCED),     # 0.17 lower, bound 0.030
    ([5.62, 5.66, 5.63], [5.45, 5.48, 5.47], True, power.CONTRADICTED),
    ([0.55, 0.52, 0.58], [0.54, 0.51, 0.56], False, power.INCONCLUSIVE),  # 0.013 higher, bound 0.05
    ([0.60], [0.50, 0.52], False, power.ONE_SEED),
    ([], [0.5, 0.6], False, power.NO_RESULT),
])
def test_verdicts(better, than, lower, verdict):
    assert power.compare(better, than, lower).verdict == verdict


def test_the_difference_is_signed_in_the_claimed_direction():
    c = power.compare([5.45, 5.48, 5.47], [5.62, 5.66, 5.63], lower_is_better=True)
    assert c.delta == pytest.approx(0.17) and c.bound == pytest.approx(0.029814, rel=1e-4)
    assert c.n == (3, 3) and c.std[0] == pytest.approx(0.015275, rel=1e-4)
    up = power.compare([0.56, 0.58], [0.50, 0.52], lower_is_better=False)
    assert up.delta == pytest.approx(0.06)


def test_an_inconclusive_verdict_says_how_many_seeds_would_settle_it():
    better, than = [0.55, 0.52, 0.58], [0.54, 0.51, 0.56]
    c = power.compare(better, than, lower_is_better=False)
    sa, sb = statistics.stdev(better), statistics.stdev(than)
    delta = statistics.fmean(better) - statistics.fmean(than)
    assert c.seeds == math.floor(4 * (sa ** 2 + sb ** 2) / delta ** 2) + 1
    # the paper's effect, when given, is what the seeds must detect
    paper = power.compare(better, than, lower_is_better=False, paper_delta=0.05)
    assert paper.seeds == math.floor(4 * (sa ** 2 + sb ** 2) / 0.05 ** 2) + 1 < c.seeds


def test_a_same_claim_needs_the_whole_interval_inside_the_margin():
    a, b = [5.726, 5.712, 5.740], [5.708, 5.696, 5.720]  # Δ 0.018, bound ≈ 0.021
    c = power.compare(a, b, True, expect="same", margin=0.05)
    assert c.verdict == power.REPRODUCED and abs(c.delta) + c.bound < 0.05
    assert power.compare(a, b, True, expect="same", margin=0.03).verdict == power.INCONCLUSIVE
    far = power.compare([6.22, 6.23, 6.21], [5.63, 5.64, 5.61], True, expect="same", margin=0.05)
    assert far.verdict == power.CONTRADICTED
    with pytest.raises(ValueError):
        power.compare(a, b, True, expect="same")


def test_a_group_verdict_needs_every_pair():
    R, C, I, O = power.REPRODUCED, power.CONTRADICTED, power.INCONCLUSIVE, power.ONE_SEED
    assert power.overall([R, R, R]) == R and power.overall([C, C]) == C
    assert power.overall([R, C]) == power.MIXED and power.overall([R, C, I]) == power.MIXED
    assert power.overall([R, I]) == I and power.overall([C, I]) == I and power.overall([O, O]) == O
    assert power.overall([O, power.NO_RESULT]) == O and power.overall([R, O]) == I


def _pair(rng, n: int, ratio: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Two normal samples whose means differ by exactly ``ratio`` times the 2σ bound."""
    a = rng.normal(0.0, 0.03, n)
    b = rng.normal(0.0, 0.05, n)
    bound = power.detectable(float(np.std(a, ddof=1)), n, float(np.std(b, ddof=1)), n)
    b = b - b.mean() + a.mean() + ratio * bound
    return a, b, bound


@pytest.mark.parametrize("ratio", [0.8, 0.95, 1.02, 1.05, 1.3])  # exactly 1.0 is the tie
def test_the_bound_is_where_welchs_t_test_reaches_p_005_at_large_n(ratio):
    # At n = 400 per cell Welch's t has ~650 degrees of freedom: |t| = 2 (the bound) is p = 0.046, and
    # p = 0.05 falls at |t| = 1.964, i.e. 0.982 of the bound.
    rng = np.random.default_rng(int(ratio * 100))
    a, b, bound = _pair(rng, 400, ratio)
    p = stats.ttest_ind(a, b, equal_var=False).pvalue
    verdict = power.compare(list(b), list(a), lower_is_better=False).verdict
    if ratio >= 1.0:
        assert p < 0.05 and verdict == power.REPRODUCED
    else:
        assert p > 0.05 and verdict == power.INCONCLUSIVE
    assert abs(stats.ttest_ind(a, b, equal_var=False).statistic) == pytest.approx(2 * ratio, rel=1e-9)


def test_with_three_seeds_the_bound_is_suggestive_not_settled():
    # the module docstring's caveat: at n = 3 a difference at the bound has a Welch p of about 0.1
    rng = np.random.default_rng(0)
    a, b, _ = _pair(rng, 3, 1.0)
    p = stats.ttest_ind(a, b, equal_var=False).pvalue
    assert 0.05 < p < 0.2
