"""Verdict and output guard: winners only when the corrected interval excludes 1 and the guard
allows; figures checked against ratio_estimate and known synthetic truth."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from truthput.analyze.guard import compare_outputs
from truthput.analyze.stats import ratio_estimate, shared_noise
from truthput.analyze.stopping import StoppingRule
from truthput.analyze.verdict import make_verdict
from truthput.errors import MeasurementError


def _arm(rng, level, n=4, k=3, sd_b=0.02, sd_w=0.01):
    return [(level * np.exp(rng.normal(0, sd_b) + rng.normal(0, sd_w, k))).tolist() for _ in range(n)]


def _seed_case(rng):
    """The seed case's shape: spec3 +38% at c=1, nothing at c=8, spec1 slower at c=8."""
    return {
        ("baseline", 1): _arm(rng, 67.0), ("spec3", 1): _arm(rng, 92.5), ("spec1", 1): _arm(rng, 67.0),
        ("baseline", 8): _arm(rng, 340.0), ("spec3", 8): _arm(rng, 340.0), ("spec1", 8): _arm(rng, 290.0),
    }


def test_seed_case_lines_and_figures():
    cells = _seed_case(np.random.default_rng(1))
    guard = {"spec3": compare_outputs(["a b c", "d"], ["a b c", "d"])}
    v = make_verdict(cells, "baseline", failed={"spec5": "OOM during CUDA graph capture"}, guard=guard)
    c1, c8 = v.per_concurrency
    assert c1.winner == "spec3" and c8.winner is None
    s3 = next(c for c in c1.comparisons if c.variant == "spec3")
    noise = shared_noise([cells[(v, 1)] for v in ("baseline", "spec1", "spec3")])
    assert noise.df == 9  # 3 arms x (4 starts - 1): counted per start, not per trial
    # Hochberg over the run's 4 comparisons (2 variants x 2 levels): step k's share is 0.05 / (5 - k),
    # tested at the level that holds it at 4 starts at any SD ratio (Welch's t read at `decision_df`)
    from truthput.analyze.verdict import one_look_levels

    assert v.family == 4 and s3.estimate.level == pytest.approx(1 - one_look_levels(4)(0.05 / (5 - s3.step)))
    ref = ratio_estimate(cells[("spec3", 1)], cells[("baseline", 1)], confidence=s3.estimate.level, calibrated=True)
    assert s3.estimate.ratio == pytest.approx(ref.ratio) and s3.estimate.lo == pytest.approx(ref.lo)
    assert 1.30 < s3.estimate.ratio < 1.46
    assert s3.line.startswith(f"c=1: spec3 is {ref.pct:.0f}% faster than baseline (95% CI {ref.pct_lo:.0f}%..")
    assert "4 starts x 3 trials" in s3.line and "output guard: identical" in s3.line
    assert next(c for c in c8.comparisons if c.variant == "spec1").outcome == "slower"
    lines = v.lines()
    s3_8 = next(c for c in c8.comparisons if c.variant == "spec3")
    assert s3_8.outcome in ("equivalent", "not decided")
    assert s3_8.line.startswith("c=8: spec3 is equivalent to baseline within +-2% (" if s3_8.outcome == "equivalent"
                                else "c=8: spec3 vs baseline: not decided (")
    assert "spec5: failed, no measurements (OOM during CUDA graph capture)" in lines
    if s3_8.outcome == "equivalent":  # an equivalence claim says the starts it rests on
        assert s3_8.line.endswith("rests on 4 starts an arm: a start 1 time in 10 unlike these would go unseen "
                                  "in 4 starts 66% of the time"), s3_8.line
    # the typed verdict is its own JSON form: written strictly (NaN as null) and read back whole
    from pydantic import TypeAdapter

    from truthput.analyze.verdict import Verdict

    text = TypeAdapter(Verdict).dump_json(v)
    json.loads(text)
    back = TypeAdapter(Verdict).validate_json(text)
    assert back.lines() == lines and back.per_concurrency[0].level == 1


def test_winner_only_when_corrected_interval_excludes_one():
    from truthput.analyze.verdict import one_look_levels

    rng = np.random.default_rng(8)
    named = 0
    for _ in range(300):
        cells = {("base", 4): _arm(rng, 300.0, n=3, sd_b=0.04),
                 ("a", 4): _arm(rng, 300.0 * rng.uniform(0.95, 1.1), n=3, sd_b=0.04),
                 ("b", 4): _arm(rng, 300.0 * rng.uniform(0.95, 1.1), n=3, sd_b=0.04)}
        cv = make_verdict(cells, "base").per_concurrency[0]
        for c in cv.comparisons:
            assert c.outcome != "faster" or c.estimate.lo > 1.0
            assert c.estimate.lo <= 1.0 or c.outcome in ("faster", "equivalent")
            # Hochberg over the two comparisons: the first at the level for 0.025, the second at 0.05's or 0.025's
            levels = one_look_levels(3)
            assert c.estimate.level in (pytest.approx(1 - levels(0.05 / 2)), pytest.approx(1 - levels(0.05)))
        if cv.winner is not None:
            named += 1
            assert next(c for c in cv.comparisons if c.variant == cv.winner).estimate.lo > 1.0
    assert named >= 10  # the property was exercised (12 of 300 here)


def test_no_true_difference_rarely_names_a_winner():
    rng = np.random.default_rng(12)
    wins = sum(
        make_verdict({("base", 1): _arm(rng, 300.0, n=3), ("a", 1): _arm(rng, 300.0, n=3),
                      ("b", 1): _arm(rng, 300.0, n=3)}, "base").per_concurrency[0].winner is not None
        for _ in range(400)
    )
    assert wins / 400 <= 0.05


def test_guard_veto_and_expected_divergence():
    rng = np.random.default_rng(2)
    cells = {("base", 1): _arm(rng, 100.0), ("spec3", 1): _arm(rng, 140.0), ("kvfp8", 1): _arm(rng, 100.0)}
    differs = compare_outputs(["hello world", "x"], ["hello there", "x"])
    v = make_verdict(cells, "base", guard={"spec3": differs})
    cv = v.per_concurrency[0]
    assert cv.winner is None
    assert "NOT named a winner: greedy outputs differ" in cv.comparisons[1].line
    v2 = make_verdict(cells, "base", guard={"spec3": differs}, expected_divergence={"spec3"})
    assert v2.per_concurrency[0].winner == "spec3"
    assert "(expected for this variant)" in v2.lines()[1]


def test_simulated_tag_on_every_line_and_one_start():
    rng = np.random.default_rng(3)
    cells = {("base", 1): _arm(rng, 100.0, n=1), ("a", 1): _arm(rng, 150.0, n=1)}
    v = make_verdict(cells, "base", failed={"b": "timeout"}, simulated=True)
    assert all(line.startswith("simulated: ") for line in v.lines())
    assert v.method_notes[0].startswith("SIMULATED")
    c = v.per_concurrency[0].comparisons[0]
    assert c.outcome == "undetermined" and v.per_concurrency[0].winner is None
    assert "one server start" in c.line


def test_overlapping_qualifiers_no_single_winner():
    rng = np.random.default_rng(4)
    cells = {("base", 1): _arm(rng, 100.0), ("a", 1): _arm(rng, 130.0), ("b", 1): _arm(rng, 130.5)}
    cv = make_verdict(cells, "base").per_concurrency[0]
    assert [c.outcome for c in cv.comparisons] == ["faster", "faster"]
    assert cv.winner is None and any("no single winner" in line for line in cv.lines)
    cells[("b", 1)] = _arm(rng, 160.0)
    assert make_verdict(cells, "base").per_concurrency[0].winner == "b"


def test_sequential_verdict_uses_adjusted_level():
    rng = np.random.default_rng(5)
    cells = {("base", 1): _arm(rng, 100.0, n=3), ("a", 1): _arm(rng, 140.0, n=3)}
    rule = StoppingRule(0.02, max_starts=10, method="obrien-fleming")
    v = make_verdict(cells, "base", stopping_rule=rule)
    est = v.per_concurrency[0].comparisons[0].estimate
    # the boundary's level for the whole alpha at look 3 of 3..10 (one comparison)
    assert est.level == pytest.approx(1 - rule.look_alpha(3))
    assert 1 - est.level > 0.05 * rule.spent(3 / 10) / 2  # the looks' correlation is counted
    assert "sequential-adjusted" in v.lines()[0]


def test_compare_outputs():
    g = compare_outputs(["abc", "same", "xyz"], ["abd", "same", "q"])
    assert g.first_divergence == [2, None, 0]
    assert (g.n, g.exact_matches) == (3, 1) and g.exact_match_rate == pytest.approx(1 / 3)
    assert g.verdict == "diverges: 2/3 prompts differ (earliest at char 0 of prompt 2)"
    assert compare_outputs(["a"], ["a"]).verdict == "identical"
    assert compare_outputs(["abc"], ["abcdef"]).first_divergence == [3]
    with pytest.raises(MeasurementError, match="baseline has 2 outputs but variant has 1"):
        compare_outputs(["a", "b"], ["a"])


def test_runner_loop_end_to_end_on_synthetic_truth():
    """The runner's intended use: interleaved starts, a look after each round, verdict at the stop
    with the same adjusted level. Truth: spec3 = 1.38 x baseline at c=1, equal at c=8."""
    from truthput.analyze.design import interleaved_order
    from truthput.analyze.stopping import fixed_design_starts

    rng = np.random.default_rng(21)
    truth = {("baseline", 1): 67.0, ("spec3", 1): 92.5, ("baseline", 8): 340.0, ("spec3", 8): 340.0}
    rule = StoppingRule(target_rel_halfwidth=0.03, max_starts=8, method="obrien-fleming")
    cells: dict[tuple[str, int], list[list[float]]] = {key: [] for key in truth}
    order = interleaved_order(["baseline", "spec3"], rule.max_starts, seed=1, randomized=True)
    decision = None
    for i, (variant, start) in enumerate(order):
        start_effect = rng.normal(0, 0.01)
        for conc in (1, 8):
            cells[(variant, conc)].append(
                (truth[(variant, conc)] * np.exp(start_effect + rng.normal(0, 0.005, 3))).tolist())
        if i % 2 == 1:  # end of a round
            decision = rule.decide(cells, "baseline", look=start + 1)
            if decision.stop:
                break
    assert decision is not None and decision.stop
    assert decision.reason in ("precision reached", "every comparison decided")
    assert decision.look < rule.max_starts
    v = make_verdict(cells, "baseline", stopping_rule=rule, look=decision.look)
    c1, c8 = v.per_concurrency
    assert c1.winner == "spec3" and c8.winner is None
    e = c1.comparisons[0].estimate
    assert e.lo == pytest.approx(decision.per_comparison["spec3@c=1"].lo)
    assert e.lo <= 92.5 / 67.0 <= e.hi
    assert fixed_design_starts(cells, "baseline", 0.03) >= 2


def test_the_design_fixes_the_model_whatever_the_arms_variances_show():
    """Each comparison is Welch's t on its own two arms, whether the arms' variances look alike
    or not: the family's noise figures (pooled SD, Bartlett's p) are diagnostics said in the
    verdict's noise line, never a choice of model made from the data the verdict uses."""
    from truthput.analyze.stats import shared_noise

    rng = np.random.default_rng(8)
    base, double, other = _arm(rng, 100.0, n=4), _arm(rng, 200.0, n=4), _arm(rng, 100.0, n=4)
    v = make_verdict({("b", 4): base, ("x", 4): double, ("y", 4): other}, "b")
    (cv,) = v.per_concurrency
    x = next(c for c in cv.comparisons if c.variant == "x")
    assert x.estimate.method.startswith("Welch t") and x.outcome == "faster"
    assert x.estimate.diff_log == pytest.approx(ratio_estimate(double, base).diff_log)
    assert any("each comparison is Welch's t on its own two arms" in line for line in cv.lines)
    noisy = [[60.0], [250.0], [90.0], [180.0]]
    assert "Bartlett p" in shared_noise([base, double, noisy]).note


def test_latency_verdict_names_its_metric_and_lower_is_better():
    """A variant whose p99 ITL is 20% lower: decided "lower" and better, in a line that names the
    metric; tok/s and latency comparisons are one family (Hochberg over both)."""
    rng = np.random.default_rng(3)
    tok = {("b", 4): _arm(rng, 300.0), ("v", 4): _arm(rng, 300.0)}
    itl = {("b", 4): _arm(rng, 50.0), ("v", 4): _arm(rng, 40.0)}
    v = make_verdict(tok, "b", metrics={"itl_p99": (itl, None)})
    assert v.family == 2
    lat = next(cv for cv in v.per_concurrency if cv.metric == "itl_p99")
    (c,) = lat.comparisons
    assert c.outcome == "lower" and c.better is True and c.metric == "itl_p99"
    assert c.line.startswith("c=4: v's p99 ITL is ") and " lower than b's (95% CI " in c.line
    assert c.estimate.lo <= 0.8 <= c.estimate.hi
    tput = next(cv for cv in v.per_concurrency if cv.metric == "tok/s")
    assert tput.comparisons[0].outcome in ("equivalent", "not decided")


def test_drift_between_rounds_is_said_and_never_changes_the_model():
    """Every arm's start k shares a round effect (a box warming up by 8% per round): the round
    effect is reported (p < 0.01) but the comparison stays Welch on the two arms (no pre-test picks
    pairing: choosing by it broke the error rate); its interval covers the truth."""
    rng = np.random.default_rng(6)
    n = 5
    drift = np.log(1.0 + 0.08 * np.arange(n))
    arms = {name: [(level * np.exp(drift[k] + rng.normal(0, 0.005, 2))).tolist() for k in range(n)]
            for name, level in (("b", 300.0), ("v", 330.0), ("w", 300.0))}
    rounds = {(name, 1): list(range(n)) for name in arms}
    cells = {(name, 1): arms[name] for name in arms}
    from truthput.analyze.stats import shared_noise

    noise = shared_noise([arms["b"], arms["v"], arms["w"]], rounds=[list(range(n))] * 3)
    assert not noise.paired and noise.drift_p is not None and noise.drift_p < 0.01
    v = make_verdict(cells, "b", rounds=rounds)
    (cv,) = v.per_concurrency
    c = next(c for c in cv.comparisons if c.variant == "v")
    assert c.estimate.method.startswith("Welch t") and c.estimate.lo <= 1.1 <= c.estimate.hi
    assert any("round effect p = 0.00" in line and "alternating order" in line for line in cv.lines)


def test_unequal_variances_shrink_partly_and_widen_the_noisy_comparison():
    """Bartlett's p between the two thresholds: each arm's variance is shrunk only partly toward the
    pooled one; the note says so and the noisier arm's interval is wider than under full pooling."""
    from truthput.analyze.stats import HETEROGENEITY_P, POOL_P, SharedNoise, prior_weight, shared_noise

    assert prior_weight(None) == 1.0 and prior_weight(HETEROGENEITY_P) == 0.0 and prior_weight(POOL_P) == 1.0
    assert 0 < prior_weight((HETEROGENEITY_P + POOL_P) / 2) < 1
    base = [[100.0], [104.0], [98.0], [101.0]]
    noisy = [[100.0], [115.0], [90.0], [108.0]]
    other = [[100.0], [103.0], [97.0], [102.0]]
    noise = shared_noise([base, noisy, other])
    full = SharedNoise(True, noise.sd_log, noise.df, noise.arms, noise.bartlett_p, "", 1.0)
    shrunk = ratio_estimate(noisy, base, noise=noise)
    pooled = ratio_estimate(noisy, base, noise=full)
    if noise.kind == "shrunk":
        assert "shrunk toward" in noise.note and "prior weight" in noise.note
    assert noise.kind in ("shrunk", "separate")
    assert shrunk.hi / shrunk.lo > pooled.hi / pooled.lo


def test_absurd_bounds_and_start_counts_print_as_bounds_not_forty_digit_numbers():
    """Two starts per arm at a sequential look's small nominal level give a t quantile so large that
    exp() of it is a 10^40 % bound: exact, unreadable. The wording caps it, in every view that
    uses these helpers."""
    from truthput.analyze.verdict import _pct
    from truthput.report.terminal import interval_text
    from truthput.text import percent

    assert percent(1.5e40) == ">+999%" and percent(-2000.0) == "<-999%" and percent(12.34) == "+12.3%"
    assert _pct(1e50) == ">+999%"
    assert interval_text(-100.0, 1e45, "{:+.1f}") == " (-100.0..>+999.0)"


def test_an_equivalence_claim_says_the_starts_it_rests_on():
    """Three quiet starts an arm, no change: equivalent, and the line says on how many starts --
    a slow start one time in ten would go unseen in 3 starts 73% of the time (0.9 ** 3)."""
    rng = np.random.default_rng(3)
    cells = {("base", 4): _arm(rng, 300.0, n=3, sd_b=0.002, sd_w=0.001),
             ("same", 4): _arm(rng, 300.0, n=3, sd_b=0.002, sd_w=0.001)}
    (c,) = make_verdict(cells, "base").per_concurrency[0].comparisons
    assert c.outcome == "equivalent", c.line
    assert c.line.endswith("rests on 3 starts an arm: a start 1 time in 10 unlike these would go unseen in 3 starts "
                           "73% of the time"), c.line
