"""When to stop starting servers: a sequential rule that stays honest under repeated looks.

Why: server starts are the expensive unit (minutes each for a 27B model).  Looking at the data
after every round of starts and stopping when the answer is clear saves hours -- but naive
repeated looks at a 95% interval name false winners far more often than 5%.

Method (stated in every decision): *alpha spending with a union bound over looks*.  The planned
looks are the rounds ``min_starts .. max_starts`` (one start per variant per round).  A spending
function F(t), t = look / max_starts, gives look k the error budget F(t_k) - F(t_{k-1}) (look
``min_starts`` gets F(t_min), covering the looks that were skipped).  Those budgets sum to at most
alpha; at each look every comparison of the run is decided together at the look's budget (Holm,
`truthput.analyze.decide`), so by the union bound a wrong claim anywhere, at any look, has
probability <= alpha, whatever the reason the run stopped (decided, precise, max starts, budget).
It is conservative (no credit for the correlation between looks).

The default goal is a decision: stop when every comparison is decided (a change, or equivalence
within +-min_effect).  A precision target (``[measure] target``) also stops the run once every
interval is that narrow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from truthput.analyze.decide import ComparisonKey, Decision, decide_family
from truthput.analyze.stats import RatioEstimate, clean_starts, ratio_estimate, shared_noise, start_log_means
from truthput.errors import MeasurementError, InputError
from truthput.experiment.levels import Level, level_label

SPENDING_FUNCTIONS = ("linear", "pocock", "obrien-fleming")

CONTINUE = "continue"
PRECISION = "precision reached"
DECISION = "every comparison decided"
MAX_STARTS = "max_starts reached"
BUDGET = "time budget exhausted"

Cells = Mapping[Hashable, Sequence[Sequence[float]]]


@dataclass(frozen=True)
class StopDecision:
    """What the runner should do after a look, and the decisions that justify it."""

    stop: bool
    reason: str
    """One of "precision reached", "every comparison decided", "max_starts reached",
    "time budget exhausted", "continue"."""
    per_comparison: dict[str, RatioEstimate] = field(default_factory=dict)
    """Keyed "variant" or "variant@c=N"; intervals at the level the family decision used."""
    look: int = 0
    look_alpha: float = 0.0
    method: str = ""
    decisions: dict[str, Decision] = field(default_factory=dict)


def _cell_key(key: Hashable) -> tuple[str, Level | None]:
    if isinstance(key, tuple) and len(key) == 2:
        return str(key[0]), key[1]
    return str(key), None


def comparison_label(variant: str, level: Level | None) -> str:
    return variant if level is None else f"{variant}@{level_label(level)}"


def family_estimates(
    cells: Cells, baseline: str, rounds: Mapping[Hashable, Sequence[int]] | None = None, metric: str = "tok/s",
) -> dict[ComparisonKey, RatioEstimate]:
    """Each variant against `baseline` at each level of `cells` (keyed by variant or
    (variant, level)), with the level's shared noise model; raw estimates for `decide_family`."""
    groups: dict[Level | None, dict[str, Hashable]] = {}
    for key, data in cells.items():
        variant, conc = _cell_key(key)
        if clean_starts(data):
            groups.setdefault(conc, {})[variant] = key
    out: dict[ComparisonKey, RatioEstimate] = {}
    for conc, by_variant in groups.items():
        if baseline not in by_variant:
            where = "" if conc is None else f" at {level_label(conc)}"
            raise MeasurementError(f"stopping rule: baseline {baseline!r} has no cell{where}: nothing to compare with")
        names = [baseline, *[v for v in by_variant if v != baseline]]
        keys = [by_variant[v] for v in names]
        rr = None if rounds is None else [list(rounds[k]) for k in keys]
        noise = shared_noise([cells[k] for k in keys], rounds=rr)
        for i, v in enumerate(names[1:], start=1):
            out[ComparisonKey(metric, -1 if conc is None else conc, v)] = ratio_estimate(
                cells[keys[i]], cells[keys[0]], noise=noise,
                rounds_variant=None if rr is None else rr[i], rounds_baseline=None if rr is None else rr[0])
    return out


class StoppingRule:
    """Alpha-spending stopping rule over server starts (see the module docstring).

    ``target_rel_halfwidth``: optional precision goal (0.02 = every interval within +-2%).
    ``min_effect``: the equivalence margin (default 2%).  ``alpha``: family-wise error over all
    looks and all comparisons.  ``method``: the spending function, "linear" (F = alpha*t, the
    default), "pocock" (Lan-DeMets Pocock type, spends early) or "obrien-fleming" (keeps nearly
    all alpha for late looks).
    """

    def __init__(
        self,
        target_rel_halfwidth: float | None = None,
        max_starts: int = 6,
        min_starts: int = 2,
        alpha: float = 0.05,
        method: str = "linear",
        min_effect: float = 0.02,
    ) -> None:
        if not 0 < alpha < 1:
            raise InputError(f"stopping: alpha must be in (0, 1), got {alpha!r}")
        if min_starts < 2:
            raise InputError(f"stopping: min_starts must be >= 2 (an interval needs two starts), got {min_starts}")
        if max_starts < min_starts:
            raise InputError(f"stopping: max_starts ({max_starts}) must be >= min_starts ({min_starts})")
        if method not in SPENDING_FUNCTIONS:
            raise InputError(f"stopping: method must be one of {', '.join(SPENDING_FUNCTIONS)}, got {method!r}")
        if target_rel_halfwidth is not None and not target_rel_halfwidth > 0:
            raise InputError(f"stopping: target_rel_halfwidth must be > 0, got {target_rel_halfwidth!r}")
        if not 0 < min_effect < 1:
            raise InputError(f"stopping: min_effect must be in (0, 1), got {min_effect!r}")
        self.target_rel_halfwidth = None if target_rel_halfwidth is None else float(target_rel_halfwidth)
        self.max_starts = int(max_starts)
        self.min_starts = int(min_starts)
        self.alpha = float(alpha)
        self.method = method
        self.min_effect = float(min_effect)

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

    def clamp(self, look: int) -> int:
        return min(max(look, self.min_starts), self.max_starts)

    def confidence_at(self, look: int, n_comparisons: int = 1) -> float:
        """Per-comparison confidence level of an interval reported at ``look`` (Bonferroni)."""
        return 1.0 - self.look_alpha(self.clamp(look)) / max(1, n_comparisons)

    def describe(self) -> str:
        goal = "every comparison decided (a change, or equivalence within +-" + f"{self.min_effect:.0%})"
        if self.target_rel_halfwidth is not None:
            goal += f" or every interval within +-{self.target_rel_halfwidth:.1%}"
        return (
            f"sequential: stop when {goal}, or at {self.max_starts} server starts per variant; alpha={self.alpha:g} "
            f"spent over looks {self.min_starts}..{self.max_starts} with the {self.method} spending function, union "
            "bound over looks and Holm over the run's comparisons, so a wrong claim at any look has probability "
            f"<= {self.alpha:g}"
        )

    # -- decision -------------------------------------------------------------------------
    def decide_estimates(
        self,
        estimates: Mapping[ComparisonKey, RatioEstimate],
        look: int,
        elapsed_s: float | None = None,
        budget_s: float | None = None,
    ) -> tuple[str, dict[ComparisonKey, Decision], float]:
        """(reason, decisions, look alpha) for raw estimates of the whole family at ``look``."""
        alpha_k = self.look_alpha(self.clamp(look))
        decisions = decide_family(estimates, alpha_k, self.min_effect,
                                  describe=f"look {look} of {self.min_starts}..{self.max_starts}, alpha {alpha_k:.4g} "
                                  f"({self.method} spending)") if estimates else {}
        ds = list(decisions.values())
        return self.reason(look, [d.decided for d in ds], [d.estimate.rel_halfwidth for d in ds],
                           elapsed_s, budget_s), decisions, alpha_k

    def reason(self, look: int, decided: Sequence[bool], halfwidths: Sequence[float],
               elapsed_s: float | None = None, budget_s: float | None = None) -> str:
        """Why to stop after ``look`` (or CONTINUE), given each comparison's decision and the
        relative half-width of its interval."""
        if look >= self.min_starts and decided:
            t = self.target_rel_halfwidth
            if t is not None and all(h <= t for h in halfwidths):
                return PRECISION
            if all(d or (t is not None and h <= t) for d, h in zip(decided, halfwidths, strict=True)):
                return DECISION
        if look >= self.max_starts:
            return MAX_STARTS
        if budget_s is not None and elapsed_s is not None and elapsed_s >= budget_s:
            return BUDGET
        return CONTINUE

    def decide(
        self,
        cells: Cells,
        baseline: str,
        elapsed_s: float | None = None,
        budget_s: float | None = None,
        look: int | None = None,
        rounds: Mapping[Hashable, Sequence[int]] | None = None,
    ) -> StopDecision:
        """Decide after a round of starts.

        ``cells`` is keyed by variant name, or by (variant, concurrency); every comparison in it
        is one family.  ``look`` is the round number (server starts per variant attempted so far);
        by default the largest number of successful starts in any cell.
        """
        if look is None:
            look = max((len(clean_starts(d)) for d in cells.values()), default=0)
        estimates = family_estimates(cells, baseline, rounds)
        reason, decisions, alpha_k = self.decide_estimates(estimates, look, elapsed_s, budget_s)
        labels = {k: comparison_label(k.variant, None if k.level == -1 else k.level) for k in decisions}
        return StopDecision(reason != CONTINUE, reason, {labels[k]: d.estimate for k, d in decisions.items()},
                            look, alpha_k, self.describe(), {labels[k]: d for k, d in decisions.items()})

    def simulate(
        self,
        true_ratios: Sequence[float],
        sd_between: float,
        sd_within: float,
        trials_per_start: int = 3,
        n_experiments: int = 1000,
        seed: int = 0,
    ) -> SequentialSimulation:
        """Run this rule on synthetic experiments: one baseline and one variant per entry of
        ``true_ratios``, start effects ~ N(0, sd_between) and trial noise ~ N(0, sd_within) on log
        tok/s, one level.  Same decisions as ``decide`` (it calls it).  For `truthput plan` and tests."""
        rng = np.random.default_rng(seed)
        arms = [1.0, *true_ratios]

        def draw(_: np.random.Generator) -> Cells:
            return {f"a{i}": (r * np.exp(rng.normal(0.0, sd_between, (self.max_starts, 1))
                                         + rng.normal(0.0, sd_within, (self.max_starts, trials_per_start)))).tolist()
                    for i, r in enumerate(arms)}

        truth = {f"a{i}": r for i, r in enumerate(arms) if i}
        return simulate_rule(self, draw, truth, "a0", n_experiments, rng)


@dataclass(frozen=True)
class SequentialSimulation:
    """Operating characteristics of a StoppingRule on synthetic experiments (simulated, not
    measured): known true ratios."""

    n_experiments: int
    mean_starts: float
    """Mean server starts per variant at the stop."""
    starts_histogram: dict[int, int]
    reasons: dict[str, int]
    false_winner_rate: float
    """Fraction of experiments with a wrong claim anywhere: a change in the wrong direction or
    where there is none, or equivalence where the true change exceeds the margin."""
    power: float
    """Fraction where every comparison with a true change beyond the margin was decided in the
    right direction (NaN when there is none)."""
    decided: float
    """Fraction where every comparison ended decided."""
    coverage: float
    """Fraction where every interval at the stop covered its true ratio."""


def simulate_rule(
    rule: StoppingRule,
    draw: Callable[[np.random.Generator], Cells],
    truth: Mapping[Any, float],
    baseline: str,
    n_experiments: int,
    rng: np.random.Generator,
    rounds: Mapping[Hashable, Sequence[int]] | None = None,
) -> SequentialSimulation:
    """Look after every round as the runner does. `draw` makes one experiment's cells with
    max_starts starts each; `truth` maps a cell key to its true ratio against the baseline's cell
    at the same level."""
    margin = math.log1p(rule.min_effect)
    used, reasons = [], []
    wrong = right_all = covered_all = decided_all = 0
    needs = [k for k, r in truth.items() if abs(math.log(r)) > margin]
    for _ in range(n_experiments):
        full = draw(rng)
        for look in range(rule.min_starts, rule.max_starts + 1):
            cells = {k: v[:look] for k, v in full.items()}
            rr = None if rounds is None else {k: list(r)[:look] for k, r in rounds.items()}
            d = rule.decide(cells, baseline, look=look, rounds=rr)
            if d.stop:
                break
        used.append(look)
        reasons.append(d.reason)
        ok_wrong = False
        right = covered = True
        by_label = {}
        for key, r in truth.items():
            variant, conc = _cell_key(key)
            by_label[key] = d.decisions[comparison_label(variant, conc)]
        for key, dec in by_label.items():
            t = math.log(truth[key])
            e = dec.estimate
            if math.isfinite(e.lo) and not (math.log(e.lo) <= t <= math.log(e.hi)):
                covered = False
            if dec.kind == "different":
                if t == 0 or np.sign(e.diff_log) != np.sign(t):
                    ok_wrong = True
            elif dec.kind == "equivalent" and abs(t) > margin:
                ok_wrong = True
            if key in needs and not (dec.kind == "different" and np.sign(e.diff_log) == np.sign(t)):
                right = False
        wrong += ok_wrong
        right_all += right
        covered_all += covered
        decided_all += all(dec.decided for dec in by_label.values())
    looks, counts = np.unique(used, return_counts=True)
    rs, rcounts = np.unique(reasons, return_counts=True)
    n = n_experiments
    return SequentialSimulation(
        n_experiments=n, mean_starts=float(np.mean(used)),
        starts_histogram={int(a): int(b) for a, b in zip(looks, counts, strict=True)},
        reasons={str(a): int(b) for a, b in zip(rs, rcounts, strict=True)},
        false_winner_rate=wrong / n, power=right_all / n if needs else float("nan"),
        decided=decided_all / n, coverage=covered_all / n)


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
    groups: dict[Level | None, dict[str, Sequence[Sequence[float]]]] = {}
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
