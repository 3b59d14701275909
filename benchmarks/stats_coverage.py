"""Coverage and stopping-rule tables from seeded synthetic experiments (simulated, not measured).

Run:  .venv/bin/python benchmarks/stats_coverage.py [--reps 20000]

Table 1: coverage of the 95% ratio interval (Welch on per-start mean log tok/s) by number of
server starts and noise scenario; trials per start vary 2..4.  Table 2: the sequential stopping
rule under several true ratios: false-winner rate, power, coverage of the adjusted intervals,
mean starts used, and the starts a fixed design needs for the same precision.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from truthput.analyze.stats import welch_log_diff
from truthput.analyze.stopping import StoppingRule, fixed_design_starts_from_sd

SCENARIOS = {
    # name: (sd_between variant, sd_between baseline, sd_within, log-normal noise?)
    "equal 2%/1%": (0.02, 0.02, 0.01, True),
    "variant noisier 4% vs 1%": (0.04, 0.01, 0.01, True),
    "within-dominated 0.5%/3%": (0.005, 0.005, 0.03, True),
    "raw-scale normal 3%/2%": (0.03, 0.03, 0.02, False),
}


def per_start_log_means(rng, reps, n_starts, level, sd_b, sd_w, log_normal):
    k = rng.integers(2, 5, (reps, n_starts))
    mask = np.arange(4)[None, None, :] < k[..., None]
    if log_normal:
        logs = np.log(level) + rng.normal(0, sd_b, (reps, n_starts, 1)) + rng.normal(0, sd_w, (reps, n_starts, 4))
    else:
        raw = level * (1 + rng.normal(0, sd_b, (reps, n_starts, 1)) + rng.normal(0, sd_w, (reps, n_starts, 4)))
        logs = np.log(raw)
    return (logs * mask).sum(-1) / mask.sum(-1)


def coverage_table(reps: int) -> None:
    rng = np.random.default_rng(2026)
    starts = (2, 3, 5, 10)
    print(f"Table 1: coverage of 95% ratio intervals, {reps} experiments per cell (simulated)")
    print(f"{'scenario':28s}" + "".join(f"{f'{n} starts':>11s}" for n in starts))
    for name, (sv, sb, sw, ln) in SCENARIOS.items():
        row = []
        for n in starts:
            truth = rng.uniform(0.7, 1.5, reps)
            lv = per_start_log_means(rng, reps, n, 300 * truth[:, None, None], sv, sw, ln)
            lb = per_start_log_means(rng, reps, n, 300.0, sb, sw, ln)
            w = welch_log_diff(lv, lb, 0.05)
            row.append(float(((w.lo <= np.log(truth)) & (np.log(truth) <= w.hi)).mean()))
        print(f"{name:28s}" + "".join(f"{c:11.3f}" for c in row))
    print()


SHARED_SCENARIOS = {
    # name: between-start sd of log tok/s per arm (baseline first), within-start sd
    "equal 10%": ((0.10, 0.10, 0.10), 0.02),
    "one variant 4x noisier": ((0.10, 0.10, 0.40), 0.02),
    "baseline 4x noisier": ((0.40, 0.10, 0.10), 0.02),
    "equal 3%": ((0.03, 0.03, 0.03), 0.01),
    "equal 30%": ((0.30, 0.30, 0.30), 0.05),
}


def _arms(rng, n, sds, sd_w, ratios):
    """Per arm, per start, 1-4 trials of tok/s: log-normal start and trial effects."""
    out = []
    for sd, r in zip(sds, ratios):
        starts = []
        for _ in range(n):
            k = int(rng.integers(1, 5))
            starts.append((300.0 * r * np.exp(rng.normal(0, sd) + rng.normal(0, sd_w, k))).tolist())
        out.append(starts)
    return out


def shared_noise_table(reps: int) -> None:
    """Coverage of the unadjusted 95% intervals and the share of 2x effects decided, the shared-noise
    intervals the verdict uses beside per-comparison Welch (the method before)."""
    from truthput.analyze.stats import ratio_estimate, shared_noise

    rng = np.random.default_rng(7)
    print(f"Table 3: shared between-start noise vs per-comparison Welch; 3 arms (baseline + 2 variants), 1-4 "
          f"trials per start, {reps} experiments per cell (simulated)")
    print(f"{'scenario':26s}{'starts':>7s}{'cover shared':>14s}{'cover Welch':>13s}{'pooled':>8s}"
          f"{'2x decided shared':>19s}{'2x decided Welch':>18s}")
    for name, (sds, sd_w) in SHARED_SCENARIOS.items():
        for n in (2, 3, 4):
            cov_s = cov_w = pooled = dec_s = dec_w = 0
            total = 0
            for _ in range(reps):
                truth = (1.0, float(rng.uniform(0.8, 1.25)), 2.0)
                arms = _arms(rng, n, sds, sd_w, truth)
                noise = shared_noise(arms)
                pooled += noise.pooled
                for v in (1, 2):
                    s = ratio_estimate(arms[v], arms[0], noise=noise)
                    w = ratio_estimate(arms[v], arms[0])
                    if v == 1:
                        total += 1
                        cov_s += s.lo <= truth[1] <= s.hi
                        cov_w += w.lo <= truth[1] <= w.hi
                    else:
                        dec_s += s.lo > 1.0
                        dec_w += w.lo > 1.0
            print(f"{name:26s}{n:7d}{cov_s / total:14.3f}{cov_w / total:13.3f}{pooled / reps:8.2f}"
                  f"{dec_s / reps:19.3f}{dec_w / reps:18.3f}")
    print()


def stopping_table(reps: int) -> None:
    print(f"Table 2: stopping rule, target +-2%, starts 2..10, alpha 0.05, noise 3% between / 2% within,"
          f" 3 trials per start; {reps} experiments per row (simulated)")
    print(f"{'spending':16s}{'true ratios':18s}{'false win':>10s}{'power':>8s}{'coverage':>10s}"
          f"{'mean starts':>12s}{'fixed n':>9s}  stop reasons")
    sd_start = float(np.sqrt(0.03**2 + 0.02**2 / 3))
    for method in ("linear", "pocock", "obrien-fleming"):
        rule = StoppingRule(0.02, max_starts=10, min_starts=2, method=method)
        for truth in ([1.0], [1.0, 1.0, 1.0], [1.05], [1.10], [1.38], [1.38, 1.0]):
            sim = rule.simulate(truth, 0.03, 0.02, 3, reps, seed=1)
            fixed = fixed_design_starts_from_sd(sd_start, sd_start, 0.02, n_comparisons=len(truth))
            reasons = ", ".join(f"{k}: {v}" for k, v in sorted(sim.reasons.items()))
            power = "-" if np.isnan(sim.power) else f"{sim.power:.3f}"
            print(f"{method:16s}{str(truth):18s}{sim.false_winner_rate:10.4f}{power:>8s}{sim.coverage:10.4f}"
                  f"{sim.mean_starts:12.2f}{fixed:9d}  {reasons}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20000)
    parser.add_argument("--only-shared", action="store_true", help="print only the shared-noise table")
    args = parser.parse_args()
    t0 = time.perf_counter()
    if args.only_shared:
        shared_noise_table(args.reps)
        print(f"({time.perf_counter() - t0:.1f} s)")
        return
    coverage_table(args.reps)
    shared_noise_table(max(args.reps // 10, 200))
    stopping_table(args.reps)
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
