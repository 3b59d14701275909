"""Every comparison of a run decided together: which metric, which level, and what was decided.

A run asks many questions at once (each variant against the baseline, at each level, on each
verdict metric), so the family-wise error is held over all of them with Hochberg's step-up
procedure: sorted by p, the i-th (from 1) has the level of alpha / (m - i + 1), and the last one
within its level decides itself and every comparison before it, all at that level (one far from
deciding does not stop the others, as it would in Holm's step-down). Hochberg holds the family-wise
error where the tests are positively dependent, as a run's are: every variant is compared with the
same baseline, and every level of a variant on the same server starts. The group-sequential form
(decided comparisons kept, the rest tested at each look) is Tamhane et al., "Group sequential Holm
and Hochberg procedures", Stat. Med. 40 (2021) 5333-5350; the coverage benchmark's false-claim rows
check it on this rule. A comparison is decided when its interval at that level excludes no change
(faster / slower, higher / lower), or lies inside +-min_effect (equivalent: the two one-sided
tests); a wrong claim of either kind needs the interval to miss the truth, so both share the
comparison's error. Otherwise it is "not decided", with an estimate of the starts that would decide
it. With a sequential rule alpha is the look's share of the error budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from truthput.analyze.stats import RatioEstimate, at_level, difference_p, equivalence_p
from truthput.errors import InputError
from truthput.experiment.file import VERDICT_METRICS
from truthput.experiment.levels import Level


@dataclass(frozen=True)
class MetricSpec:
    """A figure a verdict can be taken on."""

    key: str
    label: str
    """How lines name it: "tok/s", "p99 ITL"."""
    higher_is_better: bool
    up: str
    """The word for a ratio above 1: "faster", "higher"."""
    down: str


METRICS: dict[str, MetricSpec] = {
    "tok/s": MetricSpec("tok/s", "tok/s", True, "faster", "slower"),
    "goodput": MetricSpec("goodput", "goodput", True, "higher", "lower"),
    "tok/s/W": MetricSpec("tok/s/W", "tok/s per W", True, "higher", "lower"),
    **{k: MetricSpec(k, f"{k.split('_')[1]} {k.split('_')[0].upper()}", False, "higher", "lower")
       for k in VERDICT_METRICS if "_" in k},
}
"""Closed-loop throughput (the server counter), goodput under the SLOs (good output tokens per
second, open loop), tok/s per watt (counter tokens per joule of GPU energy), and client-clock
latency quantiles per trial (lower is better)."""


def metric(key: str) -> MetricSpec:
    try:
        return METRICS[key]
    except KeyError:
        raise InputError(f"unknown verdict metric {key!r}; known: {', '.join(METRICS)}") from None


@dataclass(frozen=True)
class ComparisonKey:
    metric: str
    level: Level
    """Streams, or a `Rate` (-1 where the cells are keyed by variant alone)."""
    variant: str


DECIDED = ("different", "equivalent")


@dataclass(frozen=True)
class Decision:
    """One comparison's decision, with its interval at the level the family's procedure used."""

    estimate: RatioEstimate
    kind: str
    """"different" | "equivalent" | "not decided" | "undetermined" (an arm with one start)."""
    p_decide: float
    """The smallest per-comparison alpha at which it would be decided (uncorrected)."""
    step: int | None
    """Its place in the family's order by p (1 = the smallest), None when it has no test."""
    family: int

    @property
    def decided(self) -> bool:
        return self.kind in DECIDED


def decide_family(
    estimates: Mapping[ComparisonKey, RatioEstimate],
    alpha: float,
    min_effect: float,
    describe: str = "",
    nominal: Callable[[float], float] | None = None,
) -> dict[ComparisonKey, Decision]:
    """Hochberg over `estimates` at family-wise `alpha` (see the module docstring). `nominal` turns a
    step's share of alpha into the level tested at this look (a sequential rule's boundary);
    without it the share is the level (one look).

    Each estimate's interval is recomputed at the level its decision used (the decided ones at the
    level of the last decided step; the rest at their own step's), so every view shows intervals
    that agree with the decision.
    """
    if not 0 < alpha < 1:
        raise InputError(f"alpha must be in (0, 1), got {alpha!r}")
    ps: dict[ComparisonKey, float] = {}
    for key, est in estimates.items():
        pd, pe = difference_p(est), equivalence_p(est, min_effect)
        if math.isfinite(pd):
            ps[key] = min(pd, pe) if math.isfinite(pe) else pd
    m = len(ps)
    order = sorted(ps, key=lambda k: ps[k])
    levels = [nominal(alpha / (m - i)) if nominal is not None else alpha / (m - i) for i in range(m)]
    # step-up: the last place in the order whose p is within its level decides it and every
    # comparison before it, at that place's level
    top = max((i for i, key in enumerate(order) if ps[key] <= levels[i]), default=-1)
    out: dict[ComparisonKey, Decision] = {}
    for i, key in enumerate(order):
        a_i = levels[top] if i <= top else levels[i]
        corr = (f"Hochberg step {i + 1} of {m} at family-wise {1 - alpha:.4g}: interval at {1 - a_i:.2%}"
                if m > 1 else f"interval at {1 - a_i:.2%}") + (f"; {describe}" if describe else "")
        est = at_level(estimates[key], 1.0 - a_i, corr)
        if i <= top:
            # inside the margin is "equivalent" even when the interval also excludes 1: a change
            # smaller than min_effect is not one to act on
            kind = "equivalent" if equivalence_p(est, min_effect) <= a_i else "different"
        else:
            kind = "not decided"
        out[key] = Decision(est, kind, ps[key], i + 1, m)
    for key, est in estimates.items():
        if key not in out:
            out[key] = Decision(est, "undetermined", float("nan"), None, m)
    return out


def more_starts_to_decide(e: RatioEstimate, min_effect: float) -> int | None:
    """About how many more server starts per arm would make the interval exclude 1 or fit inside
    +-min_effect, if the effect and the noise stay as observed (the half-width shrinks as
    1/sqrt(starts); the change of the t quantile with more df is ignored, so it errs high)."""
    if not (math.isfinite(e.lo) and math.isfinite(e.hi)) or e.ratio <= 0:
        return None
    d = abs(math.log(e.ratio))
    half = (math.log(e.hi) - math.log(e.lo)) / 2
    n = min(e.n_starts_variant, e.n_starts_baseline)
    if half <= 0 or n < 1:
        return None
    need = []
    if d > 0:
        need.append(n * (half / d) ** 2)
    margin = math.log1p(min_effect)
    if d < margin:
        need.append(n * (half / (margin - d)) ** 2)
    if not need:
        return None
    return max(1, math.ceil(min(need)) - n)
