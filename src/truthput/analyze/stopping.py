"""When to stop starting servers: a sequential rule that stays honest under repeated looks.

Why: server starts are the expensive unit (minutes each for a 27B model).  Looking at the data
after every round of starts and stopping when the answer is clear saves hours -- but naive
repeated looks at a 95% interval name false winners far more often than 5%.

Method (stated in every decision): *an exact group-sequential boundary*. The planned looks are
the rounds ``min_starts .. max_starts`` (one start per variant per round, in an order the design
fixes: rounds alternate A B, B A). A spending function F(t), t = look / max_starts (O'Brien-Fleming
by default: little error early, nearly all of it at the last look, so the last look keeps almost
the power of a plain fixed design), gives look k its share F(t_k) - F(t_{k-1}); `nominal_levels`
turns the shares into the per-look levels at which exactly that share of null experiments would
first cross, found by a seeded simulation of the verdict's own test (Welch's t on per-start log
means), so the correlation between looks is counted and not thrown away as by a union bound. At
each look every comparison of the run is decided together (Hochberg, `truthput.analyze.decide`):
a step's share alpha / (m - i) is tested at that share's boundary. A wrong claim anywhere, at any
look, has probability <= alpha whatever the reason the run stopped. The model is fixed by the
design, never chosen from the data (no pre-test picks pairing or pooling).

Futility: the run also stops when every comparison is decided or beyond reach (`beyond_reach`:
the interval max_starts could reach would still include no change and could not show
equivalence); such a comparison ends "not decided", which never adds a false claim.

The default goal is a decision: stop when every comparison is decided (a change, or equivalence
within +-min_effect).  A precision target (``[measure] target``) also stops the run once every
interval is that narrow.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from truthput.analyze.decide import ComparisonKey, Decision, decide_family
from truthput.analyze.stats import (DF_SHAPE_FIRST, DF_SHAPE_LAST, RatioEstimate, clean_starts, decision_df,
                                   ratio_estimate, start_log_means)
from truthput.errors import MeasurementError, InputError
from truthput.experiment.levels import Level, level_label

SPENDING_FUNCTIONS = ("decide-early", "linear", "quadratic", "pocock", "obrien-fleming")
DEFAULT_SPENDING = "decide-early"

FIRST_LOOK_SHARE = 0.62
MIDDLE_LOOKS_SHARE = 0.0
"""The default spending ("decide-early"): 62% of alpha at the first look (a large effect is decided
there), none at the looks between (they can still stop a run for futility), the rest (38%) at
the last look (where the small effects are decided). Issue 47 (benchmarks/RESULTS.md): the first
look's share buys decisions at 3 starts (2x at 10% start noise by 3 starts in at least 95% of
runs, one level and two), the last look's the power a fixed 6-start design has; 60/40 and 55/45
were tried before."""

BOUNDARY_SIMULATIONS = 100_000
"""Simulated null experiments per SD ratio behind a boundary computed at run time (seeded); the
shipped tables (`boundaries.json`) use SHIPPED_SIMULATIONS."""
SHIPPED_SIMULATIONS = 400_000
CALIBRATION_Z = 3.0
"""Each look is calibrated to spend its share less CALIBRATION_Z Monte-Carlo standard errors of
the count (share * N - z * sqrt(share * N) crossings of N), so the simulation's own error cannot
push the boundary's real size over its share."""

FUTILITY_SHARE = 0.5
"""An undecided comparison is beyond reach when its estimate is under half the half-width its
interval would still have at max_starts (and that interval could not show equivalence either),
and the change is small (FUTILITY_SMALL)."""
FUTILITY_SMALL = 2.5
FUTILITY_CONFIDENCE = 0.8
"""... and small: its one-sided FUTILITY_CONFIDENCE upper bound on the size of the change is
under FUTILITY_SMALL x min_effect (5% at the default 2%). Without it the rule gave up on a +10%
change under 10% start noise after 3 or 4 starts as often as on no change at all (the two look
alike in units of their noise there), and kept 83% of a fixed design's power; a large change
under heavy noise is what max_starts is for (issue 47, benchmarks/RESULTS.md)."""

CONTINUE = "continue"
FUTILE = "the rest cannot be decided within max_starts"
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
        for i, v in enumerate(names[1:], start=1):  # Welch on the two arms: the design fixes the model
            key = ComparisonKey(metric, -1 if conc is None else conc, v)
            out[key] = ratio_estimate(cells[keys[i]], cells[keys[0]], calibrated=True)
    return out


class StoppingRule:
    """Alpha-spending stopping rule over server starts (see the module docstring).

    ``target_rel_halfwidth``: optional precision goal (0.02 = every interval within +-2%).
    ``min_effect``: the equivalence margin (default 2%).  ``alpha``: family-wise error over all
    looks and all comparisons.  ``method``: the spending function, "obrien-fleming" (the default:
    keeps nearly all alpha for late looks), "linear" (F = alpha*t) or "pocock" (Lan-DeMets Pocock
    type, spends early).
    """

    def __init__(
        self,
        target_rel_halfwidth: float | None = None,
        max_starts: int = 8,
        min_starts: int = 2,
        alpha: float = 0.05,
        method: str = DEFAULT_SPENDING,
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
        """Cumulative alpha spent by information fraction t in [0, 1] (t = look / max_starts)."""
        if self.method == "decide-early":
            look = int(round(t * self.max_starts))
            shares = look_shares(self.min_starts, self.max_starts, self.alpha, self.method)
            return sum(shares[: max(0, look - self.min_starts + 1)])
        return _spend(self.method, self.alpha, t)

    def look_alpha(self, look: int, alpha: float | None = None) -> float:
        """The nominal per-comparison level of look ``look`` (= server starts per variant so far)
        for a family-wise ``alpha`` (default the rule's): the exact group-sequential boundary of
        the planned looks (`nominal_levels`), not the union bound; 0 outside the plan."""
        if look < self.min_starts or look > self.max_starts:
            return 0.0
        levels = nominal_levels(self.min_starts, self.max_starts, round(self.alpha if alpha is None else alpha, 12),
                                self.method)
        return levels[look - self.min_starts]

    def beyond_reach(self, est: RatioEstimate, look: int, share: float) -> bool:
        """Futility: at ``look`` an undecided comparison whose interval at ``max_starts`` (the same
        start-to-start noise, the boundary's last level for its ``share`` of alpha) would still be
        too wide to show equivalence, whose estimate is under FUTILITY_SHARE of that interval's
        half-width (more starts would most likely end "not decided" too), and whose change is small
        (under FUTILITY_SMALL x min_effect at FUTILITY_CONFIDENCE). Stopping for it never adds a
        false claim (it only gives up chances to decide), so the error rate holds."""
        if look >= self.max_starts or not (math.isfinite(est.se_log) and math.isfinite(est.df) and est.df > 0):
            return False
        from truthput.analyze.stats import t_quantile

        grow = (self.max_starts - 1) / max(look - 1, 1)
        se_max = est.se_log * math.sqrt(look / self.max_starts)
        half = t_quantile(self.look_alpha(self.max_starts, share), est.df * grow) * se_max
        upper = abs(est.diff_log) + t_quantile(2.0 * (1.0 - FUTILITY_CONFIDENCE), est.df) * est.se_log
        return half > math.log1p(self.min_effect) and abs(est.diff_log) < FUTILITY_SHARE * half and \
            upper < math.log1p(FUTILITY_SMALL * self.min_effect)

    def nominal(self, look: int) -> Callable[[float], float]:
        """Family share -> that share's nominal level at ``look`` (what the family's steps test at)."""
        return lambda share: self.look_alpha(self.clamp(look), share)

    def clamp(self, look: int) -> int:
        return min(max(look, self.min_starts), self.max_starts)

    def describe(self) -> str:
        goal = "every comparison decided (a change, or equivalence within +-" + f"{self.min_effect:.0%})"
        if self.target_rel_halfwidth is not None:
            goal += f" or every interval within +-{self.target_rel_halfwidth:.1%}"
        return (
            f"sequential: stop when {goal} (or beyond reach), or at {self.max_starts} server starts per variant; "
            f"alpha={self.alpha:g} spent over looks {self.min_starts}..{self.max_starts} with the {self.method} "
            "spending function on an exact boundary (the looks' correlation counted) and Hochberg over the run's "
            f"comparisons, so a wrong claim at any look has probability <= {self.alpha:g}"
        )

    # -- decision -------------------------------------------------------------------------
    def decide_estimates(
        self,
        estimates: Mapping[ComparisonKey, RatioEstimate],
        look: int,
        elapsed_s: float | None = None,
        budget_s: float | None = None,
        estimates_at: Callable[[int], Mapping[ComparisonKey, RatioEstimate]] | None = None,
    ) -> tuple[str, dict[ComparisonKey, Decision], float]:
        """(reason, decisions, look alpha) for raw estimates of the whole family at ``look``;
        with ``estimates_at`` (the estimates at each earlier look) decisions reached earlier are
        kept (`decide_looks`)."""
        alpha_k = self.look_alpha(self.clamp(look))
        if not estimates:
            decisions: dict[ComparisonKey, Decision] = {}
        elif estimates_at is not None:
            decisions = self.decide_looks(estimates_at, look, estimates)
        else:  # no history given: this look alone
            decisions = decide_family(estimates, self.alpha, self.min_effect,
                                      describe=f"look {look} of {self.min_starts}..{self.max_starts}, nominal level "
                                      f"{alpha_k:.4g} ({self.method} spending, exact boundary)",
                                      nominal=self.nominal(look))
        ds = list(decisions.values())
        futile = [not d.decided and self.beyond_reach(d.estimate, look, self.alpha / max(d.family, 1)) for d in ds]
        return self.reason(look, [d.decided for d in ds], [d.estimate.rel_halfwidth for d in ds],
                           elapsed_s, budget_s, futile), decisions, alpha_k

    def decide_looks(
        self,
        estimates_at: Callable[[int], Mapping[ComparisonKey, RatioEstimate]],
        look: int,
        now: Mapping[ComparisonKey, RatioEstimate] | None = None,
    ) -> dict[ComparisonKey, Decision]:
        """The family's decisions at ``look``, every decision an earlier look reached kept as it
        was reached: the looks min_starts..look are replayed on the values as they stood
        (`estimates_at(j)`), and at each look only the comparisons still open are tested, Hochberg
        over those alone (a decided comparison's share of alpha passes to the rest: the
        sequentially rejective procedure for group-sequential designs, which holds the
        family-wise error at alpha). Replayed from the values, so the same values always give
        the same decisions, whoever computes them. ``now``: the estimates at ``look`` when the
        caller has them already."""
        kept: dict[ComparisonKey, Decision] = {}
        first = min(self.min_starts, look)
        for j in range(first, look + 1):
            est = now if (j == look and now is not None) else estimates_at(j)
            open_ = {k: e for k, e in est.items() if k not in kept}
            alpha_j = self.look_alpha(self.clamp(j))
            dec = decide_family(open_, self.alpha, self.min_effect,
                                describe=f"look {j} of {self.min_starts}..{self.max_starts}, nominal level "
                                f"{alpha_j:.4g} ({self.method} spending, exact boundary)"
                                + (f"; {len(kept)} decided earlier" if kept else ""),
                                nominal=self.nominal(j)) if open_ else {}
            if j == look:
                return {k: kept.get(k) or dec[k] for k in est if k in kept or k in dec}
            kept.update({k: d for k, d in dec.items() if d.decided})
        return kept

    def reason(self, look: int, decided: Sequence[bool], halfwidths: Sequence[float],
               elapsed_s: float | None = None, budget_s: float | None = None,
               futile: Sequence[bool] | None = None) -> str:
        """Why to stop after ``look`` (or CONTINUE), given each comparison's decision, the
        relative half-width of its interval and whether it is beyond reach (`beyond_reach`)."""
        if look >= self.min_starts and decided:
            t = self.target_rel_halfwidth
            if t is not None and all(h <= t for h in halfwidths):
                return PRECISION
            if all(d or (t is not None and h <= t) for d, h in zip(decided, halfwidths, strict=True)):
                return DECISION
            if futile is not None and t is None and look < self.max_starts and \
                    all(d or f for d, f in zip(decided, futile, strict=True)):
                return FUTILE
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

        def estimates_at(j: int) -> dict[ComparisonKey, RatioEstimate]:
            cut = {k: list(v)[:j] for k, v in cells.items()}
            try:
                return family_estimates(cut, baseline, None if rounds is None else {k: list(r)[:j]
                                                                                    for k, r in rounds.items()})
            except MeasurementError:  # the baseline had no start yet at that look: nothing decided there
                return {}

        reason, decisions, alpha_k = self.decide_estimates(estimates, look, elapsed_s, budget_s, estimates_at)
        labels = {k: comparison_label(k.variant, None if k.level == -1 else k.level) for k in decisions}
        return StopDecision(reason != CONTINUE, reason, {labels[k]: d.estimate for k, d in decisions.items()},
                            look, alpha_k, self.describe(), {labels[k]: d for k, d in decisions.items()})


def look_shares(min_starts: int, max_starts: int, alpha: float, method: str) -> list[float]:
    """Each planned look's share of alpha, looks min_starts..max_starts (they sum to alpha)."""
    looks = max_starts - min_starts + 1
    if method == "decide-early":
        if looks == 1:
            return [alpha]
        middle = looks - 2
        first = FIRST_LOOK_SHARE * alpha
        mid = (MIDDLE_LOOKS_SHARE * alpha / middle) if middle else 0.0
        return [first, *([mid] * middle), alpha - first - mid * middle]
    out, before = [], 0.0
    for n in range(min_starts, max_starts + 1):
        now = _spend(method, alpha, n / max_starts)
        out.append(now - before)
        before = now
    out[-1] += alpha - sum(out)  # the last look takes what rounding left
    return out


def _spend(method: str, alpha: float, t: float) -> float:
    from scipy import special

    t = min(max(t, 0.0), 1.0)
    if t == 0.0:
        return 0.0
    if method == "linear":
        return alpha * t
    if method == "quadratic":
        return alpha * t * t
    if method == "pocock":
        return alpha * math.log(1.0 + (math.e - 1.0) * t)
    z = -float(special.ndtri(alpha / 2.0))
    return float(2.0 * special.ndtr(-z / math.sqrt(t)))


@functools.lru_cache(maxsize=256)
def nominal_levels(min_starts: int, max_starts: int, alpha: float, method: str) -> tuple[float, ...]:
    """Per-look nominal two-sided levels for looks min_starts..max_starts (n starts per arm at
    look n) whose chance of any false claim over all looks is at most ``alpha``, spent as
    ``method`` says (`look_shares`).

    Exact for the test the verdict uses (Welch's t on per-start log means) under Gaussian start
    effects, for any ratio of the two arms' start-to-start SDs: each ratio of SD_RATIOS (1 to 100;
    Welch's size at 2-7 df peaks between 4 and 16) gives its own boundary, found by simulation --
    at each look the level below which the still-undecided null experiments spend that look's
    share less CALIBRATION_Z Monte-Carlo SEs -- and each look takes the lowest level over the
    ratios (a boundary pointwise below a valid one is valid). Successive looks share their first
    starts, so they are strongly correlated: these levels are well above the shares a union bound
    would test at. The default designs come precomputed (`boundaries.json`, SHIPPED_SIMULATIONS
    a ratio); others are computed once per process (BOUNDARY_SIMULATIONS a ratio).
    """
    if min_starts == max_starts:
        method = "linear"  # one look takes all of alpha whatever the spending: one table serves them all
    shipped = _shipped().get(boundary_key(min_starts, max_starts, alpha, method))
    if shipped is not None:
        return tuple(shipped)
    return compute_levels(min_starts, max_starts, alpha, method, BOUNDARY_SIMULATIONS)


def boundary_key(min_starts: int, max_starts: int, alpha: float, method: str) -> str:
    return f"{min_starts},{max_starts},{alpha:.10g},{method}"


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, list[float]]:
    import json
    from importlib import resources

    try:
        text = resources.files("truthput.analyze").joinpath("boundaries.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    doc = json.loads(text)
    if doc.get("sd_ratios") != list(SD_RATIOS) or doc.get("z") != CALIBRATION_Z or \
            doc.get("first_look_share") != FIRST_LOOK_SHARE or doc.get("middle_looks_share") != MIDDLE_LOOKS_SHARE \
            or doc.get("df_shape") != [DF_SHAPE_FIRST, DF_SHAPE_LAST]:
        return {}  # tables of another calibration: compute instead
    return dict(doc["levels"])


def compute_levels(min_starts: int, max_starts: int, alpha: float, method: str, sims: int) -> tuple[float, ...]:
    """`nominal_levels` computed now with `sims` null experiments a ratio."""
    shares = look_shares(min_starts, max_starts, alpha, method)
    per_ratio = [_levels_for(min_starts, max_starts, shares, ratio, sims) for ratio in SD_RATIOS]
    return tuple(min(levels) for levels in zip(*per_ratio, strict=True))


SD_RATIOS = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0, 64.0, 100.0)
"""Start-to-start SD of one arm over the other's that the boundary holds under (Welch's t with
equal starts per arm is symmetric in the two arms, so ratios below 1 are these)."""


@functools.lru_cache(maxsize=16)
def _null_pvalues(max_starts: int, sd_ratio: float, sims: int) -> np.ndarray:
    """Welch's two-sided p-values (read at `decision_df`, as the verdict reads them) of `sims`
    seeded null experiments at every n = 2..max_starts starts per arm (the first n of the same
    starts): shape (sims, max_starts - 1), float32."""
    from scipy import special

    rng = np.random.default_rng(20261204)
    x = rng.standard_normal((sims, max_starts))
    y = sd_ratio * rng.standard_normal((sims, max_starts))
    out = np.empty((sims, max_starts - 1), dtype=np.float32)
    for n in range(2, max_starts + 1):
        a, b = x[:, :n], y[:, :n]
        va, vb = a.var(axis=1, ddof=1) / n, b.var(axis=1, ddof=1) / n
        se2 = va + vb
        df = decision_df(se2**2 / (va**2 / (n - 1) + vb**2 / (n - 1)), n)
        out[:, n - 2] = 2.0 * special.stdtr(df, -np.abs(a.mean(axis=1) - b.mean(axis=1)) / np.sqrt(se2))
    return out


NULL_STARTS = 10
"""Starts per arm every null experiment draws (more where a design asks): one draw serves every
design up to it, so the boundaries of different designs come from the same experiments."""


def _levels_for(min_starts: int, max_starts: int, shares: Sequence[float], sd_ratio: float, sims: int) -> list[float]:
    p = _null_pvalues(max(max_starts, NULL_STARTS), sd_ratio, sims)
    alive = np.ones(sims, dtype=bool)
    levels: list[float] = []
    for n, share in zip(range(min_starts, max_starts + 1), shares, strict=True):
        target = int(share * sims - CALIBRATION_Z * math.sqrt(max(share * sims, 0.0)))
        col = p[:, n - 2]
        live = col[alive]
        if target < 1 or live.size == 0:
            levels.append(0.0)  # too small a share to place with this many experiments: spend none
            continue
        # the target-th smallest p-value of those still alive: `target` of them cross it
        k = min(target, live.size) - 1
        level = float(np.partition(live, k)[k])
        levels.append(level)
        alive &= ~(col <= level)
    return levels


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
            if math.isfinite(e.lo) and not (e.lo <= truth[key] <= e.hi):
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


def fixed_design_starts_from_sd(sd_log_variant: float, sd_log_baseline: float, target_rel_halfwidth: float,
                                confidence: float = 0.95, n_comparisons: int = 1, max_n: int = 10_000) -> int:
    """Starts per arm a fixed (non-sequential) design needs for a Welch interval on the log
    ratio of relative half-width <= target, given per-start SDs of mean log tok/s."""
    from scipy import special

    sv2, sb2 = sd_log_variant**2, sd_log_baseline**2
    if sv2 + sb2 == 0.0:
        return 2
    n = np.arange(2, max_n + 1, dtype=float)
    df = (sv2 + sb2) ** 2 / ((sv2**2 + sb2**2) / (n - 1))
    alpha = (1.0 - confidence) / n_comparisons
    half = special.stdtrit(df, 1.0 - alpha / 2.0) * np.sqrt((sv2 + sb2) / n)
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
