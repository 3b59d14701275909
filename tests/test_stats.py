"""Statistics against known truth: scipy's own Welch/t results and seeded simulations with
known true ratios and two-level (between-start, within-start) noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from truthput.analyze.stats import (
    cell_estimate,
    noise_warnings,
    ratio_estimate,
    welch_log_diff,
)
from truthput.errors import MeasurementError


def _experiment(rng, n_starts, true_ratio, sd_b_var=0.03, sd_b_base=0.02, sd_w=0.02, log_normal=True):
    """One synthetic A/B: unequal trials per start (2..4), level 300 tok/s."""

    def arm(level, sd_b):
        out = []
        for _ in range(n_starts):
            k = int(rng.integers(2, 5))
            if log_normal:
                out.append(np.exp(math.log(level) + rng.normal(0, sd_b) + rng.normal(0, sd_w, k)).tolist())
            else:  # additive normal noise on the raw scale (model misspecified on purpose)
                out.append((level * (1 + rng.normal(0, sd_b) + rng.normal(0, sd_w, k))).tolist())
        return out

    return arm(300.0 * true_ratio, sd_b_var), arm(300.0, sd_b_base)


def test_ratio_matches_scipy_welch_on_start_log_means():
    from scipy import stats  # imported here: a second of every worker's collection otherwise

    rng = np.random.default_rng(11)
    v, b = _experiment(rng, 4, 1.2)
    b = b[:3]
    est = ratio_estimate(v, b, confidence=0.95, n_comparisons=3)
    lv = [np.log(s).mean() for s in v]
    lb = [np.log(s).mean() for s in b]
    ref = stats.ttest_ind(lv, lb, equal_var=False)
    ci = ref.confidence_interval(confidence_level=1 - 0.05 / 3)
    assert est.ratio == pytest.approx(math.exp(np.mean(lv) - np.mean(lb)), rel=1e-12)
    assert est.lo == pytest.approx(math.exp(ci.low), rel=1e-10)
    assert est.hi == pytest.approx(math.exp(ci.high), rel=1e-10)
    assert est.p_value == pytest.approx(min(1.0, 3 * ref.pvalue), rel=1e-8)
    assert est.df == pytest.approx(ref.df, rel=1e-10)
    assert est.pct == pytest.approx((est.ratio - 1) * 100)
    assert "Welch" in est.method and "Bonferroni over 3" in est.correction
    assert (est.n_starts_variant, est.n_starts_baseline) == (4, 3)
    assert est.significant == (est.lo > 1 or est.hi < 1) == (est.p_value < 0.05)


@pytest.mark.parametrize(
    ("n_starts", "log_normal"), [(3, True), (5, True), (10, True), (5, False)]
)
def test_ratio_interval_coverage_two_level_noise(n_starts, log_normal):
    """2000 seeded experiments per case, true ratios drawn in [0.7, 1.5]: 95% coverage 93-97%."""
    rng = np.random.default_rng(1000 + n_starts + 7 * log_normal)
    n_exp, hits = 2000, 0
    for _ in range(n_exp):
        true = float(rng.uniform(0.7, 1.5))
        v, b = _experiment(rng, n_starts, true, log_normal=log_normal)
        est = ratio_estimate(v, b)
        hits += est.lo <= true <= est.hi
    coverage = hits / n_exp
    print(f"coverage n_starts={n_starts} log_normal={log_normal}: {coverage:.3f}")
    assert 0.93 <= coverage <= 0.97


def test_bonferroni_family_coverage():
    """Three variants vs one baseline: all three intervals cover together in >= ~95%."""
    rng = np.random.default_rng(5)
    n_exp, n = 2000, 5
    truth = np.log([1.0, 1.1, 0.9])
    base = rng.normal(0, 0.03, (n_exp, 1, n))
    var = truth[None, :, None] + rng.normal(0, 0.03, (n_exp, 3, n))
    w = welch_log_diff(var, base, 0.05 / 3)
    together = ((w.lo <= truth) & (truth <= w.hi)).all(axis=1).mean()
    assert 0.94 <= together <= 0.975
    # the vectorised core is what ratio_estimate uses
    one = ratio_estimate(np.exp(var[0, 1])[:, None].tolist(), np.exp(base[0, 0])[:, None].tolist(),
                         n_comparisons=3)
    assert one.lo == pytest.approx(math.exp(w.lo[0, 1]), rel=1e-12)


def test_cell_estimate_t_interval_on_start_means():
    from scipy import stats  # imported here: a second of every worker's collection otherwise

    per_start = [[100.0, 102.0, 101.0], [97.0, 98.0], [], [103.0, 104.0, 105.0, 106.0]]
    est = cell_estimate(per_start)
    means = np.array([101.0, 97.5, 104.5])
    logs = np.array([np.log(s).mean() for s in ([100.0, 102.0, 101.0], [97.0, 98.0], [103.0, 104.0, 105.0, 106.0])])
    lo, hi = stats.t.interval(0.95, 2, loc=logs.mean(), scale=logs.std(ddof=1) / math.sqrt(3))
    assert est.mean == pytest.approx(math.exp(logs.mean()))  # geometric, on the log scale
    assert (est.lo, est.hi) == (pytest.approx(math.exp(lo)), pytest.approx(math.exp(hi)))
    assert est.n_starts == 3 and est.n_trials == 9  # the empty (failed) start contributes nothing
    assert est.cv_between == pytest.approx(means.std(ddof=1) / means.mean())
    pooled = math.sqrt((2.0 + 0.5 + 5.0) / (2 + 1 + 3))
    assert est.cv_within == pytest.approx(pooled / means.mean())
    assert "2 df" in est.method
    assert est.noisy is False


def test_cell_estimate_coverage():
    rng = np.random.default_rng(9)
    hits = 0
    for _ in range(2000):
        data = [(300 + rng.normal(0, 6) + rng.normal(0, 4, 3)).tolist() for _ in range(4)]
        e = cell_estimate(data)
        hits += e.lo <= 300 <= e.hi
    assert 0.93 <= hits / 2000 <= 0.97


def test_intervals_never_go_below_zero():
    # two starts far apart: an arithmetic t interval reaches far below zero (t = 12.7)
    est = cell_estimate([[100.0], [1000.0]])
    assert 0 < est.lo < est.mean < est.hi
    assert est.mean == pytest.approx(math.sqrt(100.0 * 1000.0))


def test_one_start_has_no_interval_and_says_why():
    est = cell_estimate([[100.0, 101.0, 99.0]])
    assert math.isnan(est.lo) and math.isnan(est.hi)
    assert est.mean == pytest.approx(math.exp(np.log([100.0, 101.0, 99.0]).mean()))
    assert "one server start: no between-start variance" in est.warning
    r = ratio_estimate([[110.0, 111.0]], [[100.0], [101.0]])
    assert math.isnan(r.lo) and not r.significant and "one server start" in r.warning
    assert r.ratio == pytest.approx(math.exp(np.log([110.0, 111.0]).mean() - np.log([100.0, 101.0]).mean()))


def test_bad_values_raise_measurement_error_naming_place():
    with pytest.raises(MeasurementError, match="start 1 trial 0"):
        cell_estimate([[100.0], [0.0]])
    with pytest.raises(MeasurementError, match="no successful trials"):
        cell_estimate([[], []])
    with pytest.raises(MeasurementError, match="baseline"):
        ratio_estimate([[1.0], [2.0]], [[]])


def test_noise_warnings():
    rng = np.random.default_rng(2)
    clean = [(300 * np.exp(rng.normal(0, 0.005) + rng.normal(0, 0.003, 3))).tolist() for _ in range(5)]
    assert noise_warnings(clean) == []
    noisy = [[300.0, 301.0, 299.0], [340.0, 342.0, 338.0], [270.0, 271.0, 269.0]]
    w = noise_warnings(noisy)
    assert any("start-to-start CV" in x for x in w)
    assert cell_estimate(noisy).noisy
    outlier = [[300.0, 301.0, 299.0, 300.5], [300.2, 150.0, 299.8, 300.1], [299.9, 300.3, 300.0, 299.7]]
    w = noise_warnings(outlier)
    assert any("outlier trial" in x and "start 1 trial 1" in x for x in w)
    drift = [[300.0 + 5 * i + d for d in (0.0, 0.5, -0.5)] for i in range(6)]
    assert any("drift upward" in x for x in noise_warnings(drift))
    warm = [[280.0 + i, 300.0 + i, 301.0 + i] for i in range(4)]
    assert any("first trial of each start is slower" in x for x in noise_warnings(warm))


_starts = st.lists(
    st.lists(st.floats(min_value=1.0, max_value=5000.0), min_size=1, max_size=4), min_size=2, max_size=6
)


@settings(max_examples=60, deadline=None)
@given(v=_starts, b=_starts, scale=st.floats(min_value=0.01, max_value=100.0))
def test_ratio_is_scale_invariant_and_antisymmetric(v, b, scale):
    est = ratio_estimate(v, b)
    scaled = ratio_estimate([[x * scale for x in s] for s in v], [[x * scale for x in s] for s in b])
    assert scaled.ratio == pytest.approx(est.ratio, rel=1e-9)
    assert scaled.lo == pytest.approx(est.lo, rel=1e-6) and scaled.hi == pytest.approx(est.hi, rel=1e-6)
    swapped = ratio_estimate(b, v)
    assert swapped.ratio == pytest.approx(1 / est.ratio, rel=1e-9)
    assert swapped.lo == pytest.approx(1 / est.hi, rel=1e-6) and swapped.hi == pytest.approx(1 / est.lo, rel=1e-6)
    assert est.lo <= est.ratio <= est.hi
    assert est.significant == (est.lo > 1 or est.hi < 1)
