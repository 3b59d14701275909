"""When to stop starting servers: a sequential rule that stays honest under repeated looks.

Why: server starts are the expensive unit (minutes each for a 27B model).  Looking at the data
after every round of starts and stopping when the answer is clear saves hours -- but naive
repeated looks at a 95% interval name false winners far more often than 5%.

Method (stated in every decision): *alpha spending with a union bound over looks*.  The planned
looks are the rounds ``min_starts .. max_starts`` (one start per variant per round).  A spending
function F(t), t = look / max_starts, gives look k the error budget F(t_k) - F(t_{k-1}) (look
``min_starts`` gets F(t_min), covering the looks that were skipped).  Those budgets sum to at most
alpha, and each look's interval is a Welch interval at its own budget split Bonferroni-wise over
the comparisons, so by the union bound *all intervals at all looks hold together with
probability >= 1 - alpha*.  That makes the reported interval at whatever look we stop valid
under any stopping reason (precision, decision, budget) -- a discrete confidence sequence.  It
is conservative (no credit for the correlation between looks) and exact for normal start means.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from truthput.analyze.stats import (
    RatioEstimate,
    clean_starts,
    ratio_estimate,
    start_log_means,
    welch_log_diff,
)
from truthput.errors import MeasurementError, SpecError

SPENDING_FUNCTIONS = ("linear", "pocock", "obrien-fleming")

CONTINUE = "continue"
PRECISION = "precision reached"
DECISION = "decision stable: interval excludes 1"
MAX_STARTS = "max_starts reached"
BUDGET = "time budget exhausted"


@dataclass(frozen=True)
class StopDecision:
    """What the runner should do after a look, and the adjusted estimates that justify it."""

    stop: bool
    reason: str
    """One of "precision reached", "decision stable: interval excludes 1", "max_starts reached",
    "time budget exhausted", "continue"."""
    per_comparison: dict[str, RatioEstimate] = field(default_factory=dict)
    """Keyed "variant" or "variant@c=N"; intervals are the look- and comparison-adjusted ones."""
    look: int = 0
    look_alpha: float = 0.0
    method: str = ""


def _cell_key(key: Hashable) -> tuple[str, int | None]:
    if isinstance(key, tuple) and len(key) == 2:
        return str(key[0]), key[1]
    return str(key), None


def comparison_label(variant: str, concurrency: int | None) -> str:
    return variant if concurrency is None else f"{variant}@c={concurrency}"


def resolution(
    lo: np.ndarray, hi: np.ndarray, mid: np.ndarray, target_rel_halfwidth: float
) -> tuple[np.ndarray, np.ndarray]:
    """(all precise, resolved) over the last axis = the comparisons of one family, on log ratios.

    Precise: the interval's relative half-width is within the target.  Resolved: every
    comparison is precise or excludes 1, *or* the winner is separated -- one variant's interval
    lies above 1 and above every other variant's interval.  Because all intervals of all looks
    hold together (union bound), a separated winner is then the true best with the same
    confidence, so the remaining unresolved comparisons need not be chased to max_starts.
    """
    lo, hi, mid = np.asarray(lo, float), np.asarray(hi, float), np.asarray(mid, float)
    with np.errstate(over="ignore", invalid="ignore"):
        precise = np.expm1(hi - mid) <= target_rel_halfwidth
    significant = (lo > 0) | (hi < 0)
    all_precise = precise.all(axis=-1)
    every = (precise | significant).all(axis=-1)
    m = lo.shape[-1]
    if m > 1:
        his = np.where(np.isfinite(hi), hi, np.inf)
        order = np.argsort(his, axis=-1)
        top = np.take_along_axis(his, order[..., -1:], axis=-1)
        second = np.take_along_axis(his, order[..., -2:-1], axis=-1)
        other_max = np.where(np.arange(m) == order[..., -1:], second, top)
        separated = ((lo > 0) & (lo > other_max)).any(axis=-1)
    else:
        separated = np.zeros_like(every)
    return all_precise, every | separated


class StoppingRule:
    """Alpha-spending stopping rule over server starts (see the module docstring).

    ``target_rel_halfwidth``: stop when every ratio interval is within +-this fraction (e.g.
    0.02 = +-2%).  ``alpha``: family-wise error over all looks and all comparisons at one
    concurrency.  ``method``: the spending function, "linear" (F = alpha*t, the default),
    "pocock" (Lan-DeMets Pocock type, spends early) or "obrien-fleming" (Lan-DeMets OBF type,
    keeps nearly all alpha for late looks).
    """

    def __init__(
        self,
        target_rel_halfwidth: float,
        max_starts: int,
        min_starts: int = 2,
        alpha: float = 0.05,
        method: str = "linear",
    ) -> None:
        if not 0 < alpha < 1:
            raise SpecError(f"stopping: alpha must be in (0, 1), got {alpha!r}")
        if min_starts < 2:
            raise SpecError(f"stopping: min_starts must be >= 2 (an interval needs two starts), got {min_starts}")
        if max_starts < min_starts:
            raise SpecError(f"stopping: max_starts ({max_starts}) must be >= min_starts ({min_starts})")
        if method not in SPENDING_FUNCTIONS:
            raise SpecError(f"stopping: method must be one of {', '.join(SPENDING_FUNCTIONS)}, got {method!r}")
        if not target_rel_halfwidth > 0:
            raise SpecError(f"stopping: target_rel_halfwidth must be > 0, got {target_rel_halfwidth!r}")
        self.target_rel_halfwidth = float(target_rel_halfwidth)
        self.max_starts = int(max_starts)
        self.min_starts = int(min_starts)
        self.alpha = float(alpha)
        self.method = method

    # -- spending -------------------------------------------------------------------------
    def spent(self, t: float) -> float:
        """Cumulative alpha spent by information fraction t in [0, 1]."""
        from scipy import stats

        t = min(max(t, 0.0), 1.0)
        if t == 0.0:
            return 0.0
        if self.method == "linear":
            return self.alpha * t
        if self.method == "pocock":
            return self.alpha * math.log(1.0 + (math.e - 1.0) * t)
        z = stats.norm.isf(self.alpha / 2.0)
        return float(2.0 * stats.norm.sf(z / math.sqrt(t)))

    def look_alpha(self, look: int) -> float:
        """Error budget of look ``look`` (= server starts per variant so far); 0 outside the plan."""
        if look < self.min_starts or look > self.max_starts:
            return 0.0
        n = self.max_starts
        if look == self.min_starts:
            return self.spent(look / n)
        return self.spent(look / n) - self.spent((look - 1) / n)

    def confidence_at(self, look: int, n_comparisons: int = 1) -> float:
        """Per-comparison confidence level of an interval reported at ``look``."""
        a = self.look_alpha(max(look, self.min_starts) if look <= self.max_starts else self.max_starts)
        return 1.0 - a / max(1, n_comparisons)

    def describe(self) -> str:
        return (
            f"sequential: alpha={self.alpha:g} spent over looks {self.min_starts}..{self.max_starts} "
            f"server starts with the {self.method} spending function, union bound over looks and "
            "Bonferroni over comparisons, so every interval at every look holds together at "
            f"{1 - self.alpha:.0%}"
        )

    def simulate(
        self,
        true_ratios: Sequence[float],
        sd_between: float,
        sd_within: float,
        trials_per_start: int = 3,
        n_experiments: int = 2000,
        seed: int = 0,
    ) -> SequentialSimulation:
        """Run this rule on ``n_experiments`` synthetic experiments (vectorised numpy): one
        baseline and one variant per entry of ``true_ratios``, start effects ~ N(0, sd_between)
        and trial noise ~ N(0, sd_within) on log tok/s.  Same decision logic as ``decide``
        (precision / decision / max_starts; no time budget).  For `truthput plan` and tests."""
        return _simulate(self, true_ratios, sd_between, sd_within, trials_per_start, n_experiments, seed)

    # -- decision -------------------------------------------------------------------------
    def decide(
        self,
        cells: Mapping[Hashable, Sequence[Sequence[float]]],
        baseline: str,
        elapsed_s: float | None = None,
        budget_s: float | None = None,
        look: int | None = None,
    ) -> StopDecision:
        """Decide after a round of starts.

        ``cells`` is keyed by variant name, or by (variant, concurrency); the family for the
        comparison correction is the variants compared with ``baseline`` at one concurrency.
        ``look`` is the round number (server starts per variant attempted so far); by default
        the largest number of successful starts in any cell.
        """
        groups: dict[int | None, dict[str, Sequence[Sequence[float]]]] = {}
        for key, data in cells.items():
            variant, conc = _cell_key(key)
            groups.setdefault(conc, {})[variant] = data
        if look is None:
            look = max((len(clean_starts(d)) for d in cells.values()), default=0)
        alpha_k = self.look_alpha(min(max(look, self.min_starts), self.max_starts))
        per: dict[str, RatioEstimate] = {}
        for conc, by_variant in groups.items():
            if baseline not in by_variant:
                where = "" if conc is None else f" at c={conc}"
                raise MeasurementError(f"stopping rule: baseline {baseline!r} has no cell{where}: nothing to compare with")
            others = [v for v in by_variant if v != baseline]
            m = len(others)
            base = by_variant[baseline]
            for v in others:
                data = by_variant[v]
                if not clean_starts(data) or not clean_starts(base):
                    continue
                est = ratio_estimate(data, base, confidence=1.0 - alpha_k, n_comparisons=m)
                est = dataclasses.replace(
                    est,
                    correction=(
                        f"look {look} of {self.min_starts}..{self.max_starts}: alpha {alpha_k:.4g} "
                        f"({self.method} spending, union bound over looks)"
                        + (f", Bonferroni over {m} comparisons" if m > 1 else "")
                        + f"; interval at {est.level:.2%}"
                    ),
                )
                per[comparison_label(v, conc)] = est
        method = self.describe()
        if look >= self.min_starts and per:
            flags = []
            for conc, by_variant in groups.items():
                ests = [per[k] for v in by_variant if (k := comparison_label(v, conc)) in per]
                if not ests:
                    continue
                with np.errstate(divide="ignore", invalid="ignore"):
                    lo = np.log([e.lo for e in ests])
                    hi = np.log([e.hi for e in ests])
                    mid = np.log([e.ratio for e in ests])
                flags.append(resolution(lo, hi, mid, self.target_rel_halfwidth))
            if flags and all(bool(p) for p, _ in flags):
                return StopDecision(True, PRECISION, per, look, alpha_k, method)
            if flags and all(bool(r) for _, r in flags):
                return StopDecision(True, DECISION, per, look, alpha_k, method)
        if look >= self.max_starts:
            return StopDecision(True, MAX_STARTS, per, look, alpha_k, method)
        if budget_s is not None and elapsed_s is not None and elapsed_s >= budget_s:
            return StopDecision(True, BUDGET, per, look, alpha_k, method)
        return StopDecision(False, CONTINUE, per, look, alpha_k, method)


@dataclass(frozen=True)
class SequentialSimulation:
    """Operating characteristics of a StoppingRule on synthetic experiments (simulated, not
    measured): two-level log-normal noise, known true ratios."""

    n_experiments: int
    mean_starts: float
    """Mean server starts per variant at the stop."""
    starts_histogram: dict[int, int]
    reasons: dict[str, int]
    false_winner_rate: float
    """Fraction of experiments where some comparison was called significant in the wrong
    direction, or at all when its true ratio is 1."""
    power: float
    """Fraction where every comparison with a true ratio != 1 was called in the right direction."""
    coverage: float
    """Fraction where every interval at the stop covered its true ratio."""


def _simulate(
    rule: "StoppingRule",
    true_ratios: Sequence[float],
    sd_between: float,
    sd_within: float,
    trials_per_start: int,
    n_experiments: int,
    seed: int,
) -> SequentialSimulation:
    rng = np.random.default_rng(seed)
    truth = np.log(np.asarray(true_ratios, dtype=float))
    n_max, k = rule.max_starts, trials_per_start
    arms = truth.size + 1
    # log tok/s = arm effect + start effect + trial noise; the level (e.g. log 300) cancels.
    start_eff = rng.normal(0.0, sd_between, (n_experiments, arms, n_max))
    trial_noise = rng.normal(0.0, sd_within, (n_experiments, arms, n_max, k))
    log_means = np.concatenate([[0.0], truth])[None, :, None] + start_eff + trial_noise.mean(axis=-1)
    return simulate_on_log_means(rule, log_means, true_ratios)


def simulate_on_log_means(
    rule: "StoppingRule", log_means: np.ndarray, true_ratios: Sequence[float]
) -> SequentialSimulation:
    """The rule's decisions on given per-start mean log tok/s, shape (experiments, arms,
    max_starts) with arm 0 the baseline; vectorised twin of looking with ``decide`` after every
    round (tests check that the two agree)."""
    truth = np.log(np.asarray(true_ratios, dtype=float))
    m = truth.size
    n_experiments, arms, n_max = log_means.shape
    if arms != m + 1 or n_max != rule.max_starts:
        raise ValueError(f"log_means shape {log_means.shape} does not match {m} variants x {rule.max_starts} starts")
    stopped = np.zeros(n_experiments, dtype=bool)
    stop_look = np.full(n_experiments, n_max)
    reason = np.full(n_experiments, MAX_STARTS, dtype=object)
    lo_at = np.full((n_experiments, m), np.nan)
    hi_at = np.full((n_experiments, m), np.nan)
    for look in range(rule.min_starts, n_max + 1):
        alpha_k = rule.look_alpha(look) / m
        w = welch_log_diff(log_means[:, 1:, :look], log_means[:, :1, :look], alpha_k)
        all_precise, all_resolved = resolution(w.lo, w.hi, w.diff, rule.target_rel_halfwidth)
        now = ~stopped & (all_resolved | (look == n_max))
        lo_at[now], hi_at[now] = w.lo[now], w.hi[now]
        stop_look[now] = look
        reason[now & all_precise] = PRECISION
        reason[now & ~all_precise & all_resolved] = DECISION
        stopped |= now
    significant = (lo_at > 0) | (hi_at < 0)
    wrong = significant & ((truth[None, :] == 0) | (np.sign(lo_at) != np.sign(truth[None, :])))
    right = significant & (np.sign(lo_at) == np.sign(truth[None, :]))
    needs = truth != 0
    power = float((right | ~needs[None, :]).all(axis=1).mean()) if needs.any() else float("nan")
    covered = ((lo_at <= truth[None, :]) & (truth[None, :] <= hi_at)).all(axis=1)
    looks, counts = np.unique(stop_look, return_counts=True)
    reasons, rcounts = np.unique(reason.astype(str), return_counts=True)
    return SequentialSimulation(
        n_experiments=n_experiments,
        mean_starts=float(stop_look.mean()),
        starts_histogram={int(a): int(b) for a, b in zip(looks, counts, strict=True)},
        reasons={str(a): int(b) for a, b in zip(reasons, rcounts, strict=True)},
        false_winner_rate=float(wrong.any(axis=1).mean()),
        power=power,
        coverage=float(covered.mean()),
    )


def fixed_design_starts_from_sd(
    sd_log_variant: float,
    sd_log_baseline: float,
    target_rel_halfwidth: float,
    confidence: float = 0.95,
    n_comparisons: int = 1,
    max_n: int = 10_000,
) -> int:
    """Starts per arm a fixed (non-sequential) design needs for a Welch interval on the log
    ratio of relative half-width <= target, given per-start SDs of mean log tok/s."""
    from scipy import stats

    sv2, sb2 = sd_log_variant**2, sd_log_baseline**2
    if sv2 + sb2 == 0.0:
        return 2
    n = np.arange(2, max_n + 1, dtype=float)
    df = (sv2 + sb2) ** 2 / ((sv2**2 + sb2**2) / (n - 1))
    alpha = (1.0 - confidence) / n_comparisons
    half = stats.t.isf(alpha / 2.0, df) * np.sqrt((sv2 + sb2) / n)
    ok = np.flatnonzero(half <= math.log1p(target_rel_halfwidth))
    return int(n[ok[0]]) if ok.size else max_n


def fixed_design_starts(
    cells: Mapping[Hashable, Sequence[Sequence[float]]],
    baseline: str,
    target_rel_halfwidth: float,
    confidence: float = 0.95,
) -> int:
    """Starts per variant a fixed design would have needed for the same precision on every
    comparison, using the observed between-start SDs (for reporting server time saved)."""
    groups: dict[int | None, dict[str, Sequence[Sequence[float]]]] = {}
    for key, data in cells.items():
        variant, conc = _cell_key(key)
        groups.setdefault(conc, {})[variant] = data
    need = 2
    for by_variant in groups.values():
        base = start_log_means(clean_starts(by_variant[baseline]))
        others = [v for v in by_variant if v != baseline]
        for v in others:
            lv = start_log_means(clean_starts(by_variant[v]))
            if lv.size < 2 or base.size < 2:
                continue
            need = max(need, fixed_design_starts_from_sd(
                float(lv.std(ddof=1)), float(base.std(ddof=1)), target_rel_halfwidth,
                confidence, len(others)))
    return need
