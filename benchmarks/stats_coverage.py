"""Coverage, error rates, power and starts used by the verdict's statistics, on seeded synthetic
experiments (simulated, not measured), beside the method used before (Welch on each comparison's
two arms, Bonferroni, a fixed number of starts).

Run:  .venv/bin/python benchmarks/stats_coverage.py [--reps 400] [--only false-claims|power-rows|...]
Tables 4a/4b are the issue-47 targets (false claims <= 5% in every row; power >= 0.90 of a fixed
6-start Welch + Holm; 2x at CV 10% decided by 3 starts in >= 95%), each row with its Monte-Carlo SE.

Every experiment: a baseline and variants, server starts with a start effect on log tok/s (shared
by every concurrency level measured on that start, plus a small per-level part), 1-4 trials per
start with within-start noise; start CVs, effects, tails and drift as each table says.

Table 1: coverage of the unadjusted 95% intervals at a fixed number of starts per arm.
Table 2: family-wise false-claim rate with no true change (3 variants x 2 levels = 6 comparisons),
         the sequential rule against a fixed design.
Table 3: the sequential default rule (first look at 3 starts, at most 8, decide-early spending,
         Hochberg, equivalence within +-2%):
         share decided, power, mean starts per arm and share decided by 3 starts, per true effect and
         start CV; beside it the fixed 2-start design used before.
"""

from __future__ import annotations

import argparse
import math
import time
import zlib
from collections.abc import Sequence

import numpy as np

from truthput.analyze.decide import decide_family
from truthput.analyze.stats import ratio_estimate
from truthput.analyze.stopping import family_estimates, simulate_rule
from truthput.analyze.values import stopping_rule
from truthput.experiment.file import MeasureSection

RULE = stopping_rule(MeasureSection())
"""The rule every experiment gets by default: first look at 3 starts per variant, at most 8."""


def make_cells(rng: np.random.Generator, n: int, sds: Sequence[float], ratios: Sequence[float], levels: int = 1,
               sd_within: float = 0.01, tail: str = "normal", drift: float = 0.0, trials: tuple[int, int] = (1, 4)):
    """(cells keyed (arm, level), rounds): arm 0 is the baseline; start j is round j.

    tail "normal": start effects normal on the log scale (log-normal tok/s); "t3": Student-t with 3
    df scaled to the same SD (heavy tails).  drift: a trend shared by every arm, `drift` per round
    on the log scale (a box warming up), plus a random walk of the same size.
    """
    walk = np.cumsum(rng.normal(0.0, drift, n)) + drift * np.arange(n) if drift else np.zeros(n)
    cells, rounds = {}, {}
    for a, (sd, r) in enumerate(zip(sds, ratios, strict=True)):
        if tail == "t3":
            eff = rng.standard_t(3, n) * sd / math.sqrt(3.0)
        else:
            eff = rng.normal(0.0, sd, n)
        for lv in range(levels):
            per_level = rng.normal(0.0, sd / 4, n)
            starts = []
            for j in range(n):
                k = int(rng.integers(trials[0], trials[1] + 1))
                base = math.log(300.0 * (lv + 1) * r) + eff[j] + per_level[j] + walk[j]
                starts.append(np.exp(base + rng.normal(0.0, sd_within, k)).tolist())
            cells[(f"a{a}", lv + 1)] = starts
            rounds[(f"a{a}", lv + 1)] = list(range(n))
    return cells, rounds


COVERAGE = {
    # name: (SDs per arm, baseline first; tail; drift; levels)
    "equal 10%": ((0.10, 0.10, 0.10), "normal", 0.0, 1),
    "equal 10%, 3 levels": ((0.10, 0.10, 0.10), "normal", 0.0, 3),
    "one variant 4x noisier": ((0.10, 0.10, 0.40), "normal", 0.0, 1),
    "baseline 4x noisier": ((0.40, 0.10, 0.10), "normal", 0.0, 1),
    "drift 10%/round": ((0.05, 0.05, 0.05), "normal", 0.10, 1),
    "heavy-tailed (t3) 10%": ((0.10, 0.10, 0.10), "t3", 0.0, 1),
    "equal 3%, 2 levels": ((0.03, 0.03, 0.03), "normal", 0.0, 2),
}


def coverage_table(reps: int) -> None:
    rng = np.random.default_rng(2026)
    print(f"Table 1: coverage of unadjusted 95% intervals (every comparison), {reps} experiments per cell (simulated)")
    print(f"{'scenario':26s}{'starts':>7s}{'new':>8s}{'before':>8s}{'  noise model used (share of families)'}")
    for name, (sds, tail, drift, levels) in COVERAGE.items():
        for n in (2, 3, 4, 6):
            hit_new = hit_old = total = 0
            kinds: dict[str, int] = {}
            for _ in range(reps):
                ratios = (1.0, float(rng.uniform(0.8, 1.25)), float(rng.uniform(0.8, 1.25)))
                cells, rounds = make_cells(rng, n, sds, ratios, levels, tail=tail, drift=drift)
                new = family_estimates(cells, "a0", rounds)
                for key, est in new.items():
                    t = ratios[int(key.variant[1:])]
                    old = ratio_estimate(cells[(key.variant, key.level)], cells[("a0", key.level)])
                    total += 1
                    hit_new += est.lo <= t <= est.hi
                    hit_old += old.lo <= t <= old.hi
                kind = _kind(cells, rounds)
                kinds[kind] = kinds.get(kind, 0) + 1
            used = ", ".join(f"{k} {v / reps:.2f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
            print(f"{name:26s}{n:7d}{hit_new / total:8.3f}{hit_old / total:8.3f}  {used}")
    print("  new: shared / shrunk / paired noise model (what the verdict uses); before: Welch on the two arms alone")
    print()


def _kind(cells, rounds) -> str:
    from truthput.analyze.stats import shared_noise

    keys = sorted(k for k in cells if k[1] == 1)
    return shared_noise([cells[k] for k in keys], rounds=[rounds[k] for k in keys]).kind


def fixed_before(cells, n_variants: int) -> dict:
    """The method before: Welch per comparison, Bonferroni over the variants at a level."""
    out = {}
    for (arm, lv) in cells:
        if arm != "a0":
            out[(arm, lv)] = ratio_estimate(cells[(arm, lv)], cells[("a0", lv)], n_comparisons=n_variants)
    return out


def null_table(reps: int) -> None:
    rng = np.random.default_rng(11)
    rule = RULE
    print(f"Table 2: no true change, 3 variants x 2 levels (6 comparisons), start CV 10%; {reps} experiments "
          "(simulated)")
    print(f"{'design':44s}{'false claims':>13s}{'mean starts':>12s}")
    sds, ratios = (0.1, 0.1, 0.1, 0.1), (1.0, 1.0, 1.0, 1.0)
    truth = {(f"a{i}", lv): 1.0 for i in (1, 2, 3) for lv in (1, 2)}
    sim = simulate_rule(rule, lambda r: make_cells(r, 6, sds, ratios, 2)[0], truth, "a0", reps, rng)
    label = f"sequential {rule.min_starts}..{rule.max_starts}, Hochberg over all 6"
    print(f"{label:44s}{sim.false_winner_rate:13.3f}{sim.mean_starts:12.2f}")
    for n in (2, 6):
        wrong = 0
        for _ in range(reps):
            cells, _ = make_cells(rng, n, sds, ratios, 2)
            wrong += any(e.significant for e in fixed_before(cells, 3).values())
        print(f"{f'fixed {n} starts, Welch + Bonferroni per level (before)':44s}{wrong / reps:13.3f}{n:12.2f}")
    fam = 0
    for _ in range(reps):
        cells, rounds = make_cells(rng, 6, sds, ratios, 2)
        ds = decide_family(family_estimates(cells, "a0", rounds), 0.05, 0.02)
        fam += any(d.kind == "different" for d in ds.values())
    print(f"{'fixed 6 starts, Welch + Hochberg (one look)':44s}{fam / reps:13.3f}{6:12.2f}")
    print()


def power_table(reps: int) -> None:
    rng = np.random.default_rng(5)
    rule = RULE
    print(f"Table 3: baseline + 1 variant, 1 level, 1-4 trials per start (1% within); {reps} experiments per row "
          "(simulated)")
    print(f"{'effect':>7s}{'start CV':>9s}{'decided':>9s}{'power':>7s}{'mean starts':>12s}{'by 3 starts':>12s}"
          f"{'false':>7s}{'  before: fixed 2 starts, Welch: decided':>42s}")
    for effect in (1.02, 1.05, 1.10, 2.0):
        for cv in (0.03, 0.10, 0.30):
            sds, ratios = (cv, cv), (1.0, effect)
            hist_rng = np.random.default_rng(int(effect * 1000 + cv * 100))
            sim = simulate_rule(rule, lambda r, s=sds, q=ratios: make_cells(r, 6, s, q)[0],
                                {("a1", 1): effect}, "a0", reps, hist_rng)
            by3 = sum(v for k, v in sim.starts_histogram.items() if k <= 3) / reps
            power = "-" if math.isnan(sim.power) else f"{sim.power:.2f}"
            before = 0
            for _ in range(reps):
                cells, _ = make_cells(rng, 2, sds, ratios)
                e = ratio_estimate(cells[("a1", 1)], cells[("a0", 1)])
                before += e.significant
            # "decided by 3 starts" counts the runs that stopped decided at look 2 or 3
            print(f"{effect - 1:7.0%}{cv:9.0%}{sim.decided:9.2f}{power:>7s}{sim.mean_starts:12.2f}{by3:12.2f}"
                  f"{sim.false_winner_rate:7.3f}{before / reps:42.2f}")
    print("  targets: 2x at 10% CV decided by 3 starts in >= 90%; 2x at 30% CV <= 5 starts on average; "
          "10% at 3% CV <= 4.5")
    print()


def scenario_cells(rng: np.random.Generator, n: int, ratios: Sequence[float], cv: float, kind: str = "gaussian",
                   levels: int = 1) -> dict:
    """One experiment's cells (arm a0 the baseline), start j of every arm in round j, run in the
    default order (rounds alternate A B, B A). kind: "gaussian"; "t3" (heavy tails); "bimodal" (15%
    of starts 20% slower); "round drift" (a shift shared by every start of a round, SD = cv);
    "thermal" (continuous drift: -cv per start position in time, the arms' positions as the runner
    orders them); "noisy arm" (the last arm's start SD is 4x; "noisy arm 8x", "noisy arm 10x");
    "ar1" (the host's state wanders over the starts in time as AR(1), phi 0.8, SD = cv); "step"
    (every start after the middle of the run 8% slower); "catastrophic" (5% of starts 40% slow)."""
    from truthput.analyze.design import block_order

    arms = [f"a{i}" for i in range(len(ratios))]
    position = {}
    t = 0
    for j in range(n):
        for a in block_order(arms, j):
            position[(a, j)] = t
            t += 1
    shared = rng.normal(0.0, cv, n) if kind == "round drift" else np.zeros(n)
    host = np.zeros(t)  # the host's state at each start position in time
    if kind == "ar1":
        for k in range(t):
            host[k] = (0.8 * host[k - 1] if k else 0.0) + rng.normal(0.0, cv * math.sqrt(1 - 0.8**2))
    elif kind == "step":
        host[t // 2:] = math.log(0.92)
    noisy = {"noisy arm": 4.0, "noisy arm 8x": 8.0, "noisy arm 10x": 10.0}.get(kind, 1.0)
    cells = {}
    for i, (arm, r) in enumerate(zip(arms, ratios, strict=True)):
        sd = cv * (noisy if i == len(arms) - 1 else 1.0)
        if kind == "t3":
            eff = rng.standard_t(3, n) * sd / math.sqrt(3.0)
        else:
            eff = rng.normal(0.0, sd, n)
        if kind == "bimodal":
            eff = eff + np.where(rng.random(n) < 0.15, math.log(0.8), 0.0)
        if kind == "catastrophic":
            eff = eff + np.where(rng.random(n) < 0.05, math.log(0.6), 0.0)
        if kind == "rare bad" and i == len(arms) - 1:
            eff = eff + np.where(rng.random(n) < 0.10, math.log(0.8), 0.0)
        if kind in ("ar1", "step"):
            eff = eff + np.array([host[position[(arm, j)]] for j in range(n)])
        for lv in range(1, levels + 1):
            starts = []
            for j in range(n):
                drift = -cv * position[(arm, j)] if kind == "thermal" else 0.0
                base = math.log(300.0 * lv * r) + eff[j] + shared[j] + drift + rng.normal(0.0, cv / 4)
                starts.append(np.exp(base + rng.normal(0.0, 0.01, 2)).tolist())
            cells[(arm, lv)] = starts
    return cells


def fixed_welch_holm(cells: dict, baseline: str = "a0", alpha: float = 0.05) -> dict:
    """The plain comparator: Welch's t per comparison at a fixed number of starts, Holm over all."""
    est = {(a, lv): ratio_estimate(v, cells[(baseline, lv)]) for (a, lv), v in cells.items() if a != baseline}
    order = sorted(est, key=lambda k: est[k].p_value)
    out, m, stopped = {}, len(order), False
    for i, k in enumerate(order):
        stopped = stopped or est[k].p_value > alpha / (m - i)
        out[k] = (not stopped, est[k].diff_log)
    return out


SCENARIOS = [
    # name, true ratios per arm (baseline first), start CV, kind, levels
    ("A/A gaussian, CV 5%", (1.0, 1.0), 0.05, "gaussian", 1),
    ("A/A gaussian, CV 3%", (1.0, 1.0), 0.03, "gaussian", 1),
    ("A/A heavy tails (t3), CV 5%", (1.0, 1.0), 0.05, "t3", 1),
    ("A/A bimodal starts, CV 3%", (1.0, 1.0), 0.03, "bimodal", 1),
    ("A/A drift shared by round, CV 3%", (1.0, 1.0), 0.03, "round drift", 1),
    ("A/A thermal drift, default order, CV 1%", (1.0, 1.0), 0.01, "thermal", 1),
    ("A/A thermal drift, default order, CV 3%", (1.0, 1.0), 0.03, "thermal", 1),
    ("A/A one arm 4x noisier, CV 5%", (1.0, 1.0), 0.05, "noisy arm", 1),
    ("A/A one arm 8x noisier, CV 5%", (1.0, 1.0), 0.05, "noisy arm 8x", 1),
    ("A/A one arm 8x noisier, CV 5%, 2 levels", (1.0, 1.0), 0.05, "noisy arm 8x", 2),
    ("A/A one arm 10x noisier, CV 5%", (1.0, 1.0), 0.05, "noisy arm 10x", 1),
    ("A/A one arm 10x noisier, CV 5%, 2 levels", (1.0, 1.0), 0.05, "noisy arm 10x", 2),
    ("A/A host state AR(1), CV 5%", (1.0, 1.0), 0.05, "ar1", 1),
    ("A/A 8% step mid-run, CV 3%", (1.0, 1.0), 0.03, "step", 1),
    ("A/A 5% of starts 40% slow, CV 3%", (1.0, 1.0), 0.03, "catastrophic", 1),
    ("A/A, 9 comparisons (9 variants), CV 5%", (1.0,) * 10, 0.05, "gaussian", 1),
    ("A/A, 3 variants x 2 levels, CV 10%", (1.0, 1.0, 1.0, 1.0), 0.10, "gaussian", 2),
    ("one real effect (+10%) + 2 nulls, 2 levels", (1.0, 1.10, 1.0, 1.0), 0.05, "gaussian", 2),
    # issue 62's corners: two variants just outside the +-2% margin on either side share the baseline,
    # so their equivalence tests are negatively dependent (a low baseline start draws one toward 0,
    # the other away); a variant whose starts are 0.8x one time in ten (truth -2.2% on the log scale)
    ("near the margin, negative dependence: +2.2% and -2.2%, CV 1%", (1.0, 1.022, 0.978), 0.01, "gaussian", 1),
    ("near the margin, negative dependence: +2.2% and -2.2%, CV 2%", (1.0, 1.022, 0.978), 0.02, "gaussian", 1),
    ("near the margin, negative dependence: +/-2.2%, 2 levels, CV 1%", (1.0, 1.022, 0.978), 0.01, "gaussian", 2),
    ("at the margin, negative dependence: +2.01% and -2.01%, CV 1%", (1.0, 1.0201, 1 / 1.0201), 0.01, "gaussian", 1),
    ("at the margin, negative dependence: +/-2.01% x 2 pairs, CV 1%", (1.0, 1.0201, 1 / 1.0201, 1.0201, 1 / 1.0201),
     0.01, "gaussian", 1),
    ("rare bad starts in one arm (10% at 0.8x), CV 1%", (1.0, 1.0), 0.01, "rare bad", 1),
]

POWER = [((1.0, 2.0), 0.10, 1), ((1.0, 2.0), 0.30, 1), ((1.0, 1.10), 0.03, 1), ((1.0, 1.10), 0.10, 1),
         ((1.0, 1.03), 0.02, 1), ((1.0, 2.0), 0.10, 2), ((1.0, 1.10), 0.05, 2), ((1.0, 1.10), 0.10, 2),
         ((1.0, 1.10, 1.10, 1.10), 0.10, 2)]
"""(true ratios, baseline first; start CV; levels). With several variants, power is per comparison
(the share of comparisons decided in their direction), each row against the fixed design's."""


def _claims(sim_truth: dict, decisions: dict, margin: float) -> tuple[bool, bool]:
    """(a false claim anywhere, every real effect decided in its direction)."""
    wrong, right = False, True
    for key, t in sim_truth.items():
        kind, diff = decisions[key]
        lt = math.log(t)
        if kind == "different" and (lt == 0 or np.sign(diff) != np.sign(lt)):
            wrong = True
        if kind == "equivalent" and abs(lt) > margin:
            wrong = True
        if abs(lt) > margin and not (kind == "different" and np.sign(diff) == np.sign(lt)):
            right = False
    return wrong, right


def _run_rule(rule, full: dict, truth: dict, sequential: bool = True, one_look=None) -> tuple[bool, bool, int]:
    """Look after each round as `truthput run` does (rule.decide_estimates on family_estimates,
    decisions of earlier looks kept: `StoppingRule.decide_looks`); with sequential=False one look
    at the first look's starts, Hochberg at alpha."""
    from truthput.analyze.stopping import CONTINUE

    def at(j: int) -> dict:
        return family_estimates({k: v[:j] for k, v in full.items()}, "a0")

    looks = range(rule.min_starts, rule.max_starts + 1) if sequential else [rule.min_starts]
    for look in looks:
        est = at(look)
        if sequential:
            reason, dec, _a = rule.decide_estimates(est, look, estimates_at=at)
            if reason != CONTINUE:
                break
        else:
            dec = decide_family(est, rule.alpha, rule.min_effect, nominal=one_look)
    decisions = {(k.variant, k.level): (v.kind, v.estimate.diff_log) for k, v in dec.items()}
    wrong, right = _claims(truth, decisions, math.log1p(rule.min_effect))
    _run_rule.last = decisions  # type: ignore[attr-defined]  # per comparison, for the power per comparison
    return wrong, right, look


FIXED = 6
"""The comparator: Welch's t at a fixed FIXED starts per arm, Holm over the family."""


def _status(value: float, se: float, target: float, at_most: bool) -> str:
    """How a row stands against its target, its Monte-Carlo SE counted (never rounded over)."""
    gap = (target - value) if at_most else (value - target)
    if gap >= se:
        return "meets"
    if gap > -se:
        return "within 1 SE"
    return "FAILS"


def false_claims_table(reps: int, rule=None, rows: str = "") -> None:  # type: ignore[no-untyped-def]
    """False claims (any look) in every scenario: the rule, its one-look mode (sequential =
    false, as `run` decides it: Welch at the calibrated one-look level, Hochberg) and a fixed 6-start
    Welch + Holm, with mean starts per row."""
    from truthput.analyze.verdict import one_look_levels

    rule = rule or RULE
    print(f"Table 4a: false claims, the default rule (looks {rule.min_starts}..{rule.max_starts}, {rule.method} "
          f"spending, boundaries calibrated over SD ratios 1..100, futility) vs its one-look mode and fixed "
          f"{FIXED}-start Welch + Holm; {reps} experiments a row (simulated; a row's Monte-Carlo SE beside it)")
    print(f"{'scenario':44s}{'rule: false':>12s}{'SE':>7s}{'starts':>7s}{'':>13s}{'one look':>9s}{'':>13s}"
          f"{f'fixed {FIXED}':>8s}")
    for name, ratios, cv, kind, levels in SCENARIOS:
        if rows and rows.lower() not in name.lower():
            continue
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        # the truth of an arm with rare bad starts is its mean on the log scale: 0.8 ** 0.1, -2.2%
        true = [r * (0.8 ** 0.1 if kind == "rare bad" and i == len(ratios) - 1 else 1.0) for i, r in enumerate(ratios)]
        truth = {(f"a{i}", lv): r for i, r in enumerate(true) if i for lv in range(1, levels + 1)}
        w_rule = w_one = w_fix = 0
        used = []
        for _ in range(reps):
            full = scenario_cells(rng, rule.max_starts, ratios, cv, kind, levels)
            wrong, _right, look = _run_rule(rule, full, truth)
            w_rule += wrong
            used.append(look)
            w_one += _run_rule(rule, full, truth, sequential=False, one_look=one_look_levels(rule.min_starts))[0]
            fx = fixed_welch_holm({k: v[:FIXED] for k, v in full.items()})
            w_fix += any(dec and (true[int(a[1:])] == 1.0 or np.sign(diff) != np.sign(math.log(true[int(a[1:])])))
                         for (a, _lv), (dec, diff) in fx.items())
        fr, fo = w_rule / reps, w_one / reps
        se_r, se_o = math.sqrt(max(fr * (1 - fr), 0.05 * 0.95) / reps), math.sqrt(max(fo * (1 - fo), 0.05 * 0.95) / reps)
        print(f"{name:44s}{fr:12.4f}{se_r:7.4f}{np.mean(used):7.2f}{_status(fr, se_r, 0.05, True):>13s}"
              f"{fo:9.4f}{_status(fo, se_o, 0.05, True):>13s}{w_fix / reps:8.4f}", flush=True)
    print(f"  one look: sequential = false at {rule.min_starts} starts (Welch at the calibrated one-look level, "
          "Hochberg)")
    print()


def power_rows_table(reps: int, rule=None, rows: str = "") -> None:  # type: ignore[no-untyped-def]
    """Power in every true-effect row against a fixed 6-start Welch + Holm (target: ratio >= 0.90),
    mean starts, and the share decided by 3 starts (target for 2x at CV 10%: >= 95%)."""
    rule = rule or RULE
    print(f"Table 4b: power, the default rule (looks {rule.min_starts}..{rule.max_starts}, {rule.method}) vs fixed "
          f"{FIXED}-start Welch + Holm; {reps} experiments a row (simulated)")
    print(f"{'power: effect, start CV, levels':44s}{'rule':>8s}{'SE':>7s}{f'fixed {FIXED}':>8s}{'ratio':>7s}"
          f"{'SE':>7s}{'':>13s}{'starts':>7s}{'by 3':>6s}{'SE':>7s}")
    for ratios, cv, levels in POWER:
        variants = len(ratios) - 1
        name = (f"{ratios[1] - 1:+.0%} at CV {cv:.0%}, {levels} level{'s' if levels > 1 else ''}"
                + (f", {variants} variants (per comparison)" if variants > 1 else ""))
        if rows and rows.lower() not in name.lower():
            continue
        rng = np.random.default_rng(int(ratios[1] * 1000 + cv * 100 + levels + 7 * (variants - 1)))
        truth = {(f"a{i}", lv): ratios[i] for i in range(1, variants + 1) for lv in range(1, levels + 1)}
        p_rule = p_fix = by3 = both = 0.0
        used = []
        for _ in range(reps):
            full = scenario_cells(rng, rule.max_starts, ratios, cv, "gaussian", levels)
            _w, right, look = _run_rule(rule, full, truth)
            fx = fixed_welch_holm({k: v[:FIXED] for k, v in full.items()})
            if variants > 1:  # the share of comparisons each design decided in their direction
                dec = _run_rule.last  # type: ignore[attr-defined]
                rule_share = np.mean([dec[k][0] == "different" and dec[k][1] > 0 for k in truth])
                fixed_share = np.mean([fx[k][0] and fx[k][1] > 0 for k in truth])
                right, fixed_right = float(rule_share), float(fixed_share)
            else:
                fixed_right = all(dec and diff > 0 for dec, diff in fx.values())
            p_rule += right
            used.append(look)
            by3 += right if look <= 3 else 0.0
            p_fix += fixed_right
            both += right * fixed_right
        pr, pf, b3 = p_rule / reps, p_fix / reps, by3 / reps
        ratio = (pr / pf) if pf else float("nan")
        # the ratio's SE by the delta method, the two powers from the same experiments (their covariance counted)
        cov = both / reps - pr * pf
        se_ratio = ratio * math.sqrt(max((pr * (1 - pr) / pr**2 + pf * (1 - pf) / pf**2 - 2 * cov / (pr * pf)) / reps,
                                         0.0)) if pf and pr else float("nan")
        print(f"{name:44s}{pr:8.3f}{math.sqrt(pr * (1 - pr) / reps):7.4f}{pf:8.3f}{ratio:7.3f}{se_ratio:7.3f}"
              f"{_status(ratio, se_ratio, 0.90, False):>13s}{np.mean(used):7.2f}{b3:6.3f}"
              f"{math.sqrt(b3 * (1 - b3) / reps):7.4f}", flush=True)
    print("  targets: ratio >= 0.90 in every row; 2x at CV 10% decided by 3 starts in >= 95% (one and two levels)")
    print()


def frontier_table(reps: int) -> None:
    """Each spending function at the same 3..6 looks: how often 2x at CV 10% is decided by 3
    starts, against the lowest power ratio to the fixed 6-start Welch + Holm over the power rows.
    Spending early buys the 3-start decisions with power at the last look, where the weak effects
    are decided: the two targets pull the boundary opposite ways."""
    from truthput.analyze.stopping import SPENDING_FUNCTIONS, StoppingRule

    print(f"Table 5: spending functions, 3..6 looks, {reps} experiments a row (simulated)")
    print(f"{'spending':16s}{'levels at looks 3..6':>34s}{'2x@CV10 by 3':>14s}{'lowest power ratio':>20s}")
    for method in SPENDING_FUNCTIONS:
        rule = StoppingRule(max_starts=RULE.max_starts, min_starts=RULE.min_starts, alpha=RULE.alpha, method=method,
                            min_effect=RULE.min_effect)
        levels = ", ".join(f"{rule.look_alpha(k):.4f}" for k in range(rule.min_starts, rule.max_starts + 1))
        ratios, by3 = [], None
        for ratios_true, cv, nlev in POWER:
            rng = np.random.default_rng(int(ratios_true[1] * 1000 + cv * 100 + nlev))
            truth = {("a1", lv): ratios_true[1] for lv in range(1, nlev + 1)}
            p_rule = p_fix = b3 = 0
            for _ in range(reps):
                full = scenario_cells(rng, rule.max_starts, ratios_true, cv, "gaussian", nlev)
                _w, right, look = _run_rule(rule, full, truth)
                p_rule += right
                b3 += right and look <= 3
                p_fix += all(dec and diff > 0 for dec, diff in fixed_welch_holm({k: v[:FIXED] for k, v in full.items()}).values())
            ratios.append(p_rule / max(p_fix, 1))
            by3 = b3 / reps if by3 is None else by3
        print(f"{method:16s}{levels:>34s}{by3:14.2f}{min(ratios):20.2f}")
    print()


def _other_spending(first: float, middle: float) -> None:
    """The decide-early shares for this process, the boundaries computed (the shipped tables are
    of the default shares and of 400,000 experiments a ratio)."""
    from truthput.analyze import stopping

    stopping.FIRST_LOOK_SHARE, stopping.MIDDLE_LOOKS_SHARE = first, middle
    stopping._shipped = lambda: {}
    stopping.nominal_levels.cache_clear()
    print(f"decide-early {first:g} at look 3, {middle:g} over looks 4-7: levels "
          f"{' | '.join(f'{x:.4f}' for x in stopping.nominal_levels(3, 8, 0.05, 'decide-early'))} (computed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--only", choices=("coverage", "null", "power", "false-claims", "power-rows", "frontier"))
    parser.add_argument("--rows", default="", help="tables 4a and 4b: only the rows whose name holds this text "
                        "(each row is seeded by its name, so a row alone prints what it prints in the whole table)")
    parser.add_argument("--spending", metavar="FIRST,MIDDLE", help="another decide-early design: FIRST and MIDDLE "
                        "shares of alpha at look 3 and at looks 4-7 together (the default is 0.62,0); every "
                        "boundary then computed with 100,000 null experiments a ratio, not the shipped tables, so "
                        "compare designs run with this option, the default's too")
    args = parser.parse_args()
    if args.spending:
        _other_spending(*(float(x) for x in args.spending.split(",")))
    t0 = time.perf_counter()
    if args.only in (None, "coverage"):
        coverage_table(args.reps)
    if args.only in (None, "null"):
        null_table(args.reps)
    if args.only in (None, "power"):
        power_table(args.reps)
    if args.only in (None, "false-claims"):
        false_claims_table(args.reps, rows=args.rows)
    if args.only in (None, "power-rows"):
        power_rows_table(args.reps, rows=args.rows)
    if args.only in (None, "frontier"):
        frontier_table(args.reps)
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
