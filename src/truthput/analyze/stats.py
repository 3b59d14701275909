"""Two-level statistics for throughput cells: the server start is the unit of replication.

Why two levels: a server start fixes things a trial cannot change (memory layout, CUDA graph
capture, kernel autotuning, which GPU ran hot), so trials within one start are correlated.
Treating every trial as independent would shrink intervals dishonestly.  We therefore reduce
each start to one number (its mean) and do the inference on the start means; the trials only
sharpen each start's mean.

Data shape everywhere: ``per_start: Sequence[Sequence[float]]`` -- outer = server starts,
inner = steady-state tok/s (counter-based) of each trial in that start.  Starts may have
unequal numbers of trials; an empty start (a failed start) contributes nothing.

No I/O here: the runner and the verdict call these pure functions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import BeforeValidator

from truthput.errors import MeasurementError, InputError

DEFAULT_CV_THRESHOLD = 0.05
"""Coefficient of variation above which a cell is called noisy (pyperf warns from ~10%,
hyperfine flags outliers; 5% is a deliberate, stricter line for A/B tests of a few percent)."""


def clean_starts(per_start: Sequence[Sequence[float]], where: str = "cell") -> list[np.ndarray]:
    """Validate and return the non-empty starts as float arrays.

    A failed start contributes nothing (empty inner list).  A non-finite or non-positive
    throughput is a measurement bug upstream, not noise, so it raises instead of being dropped.
    """
    starts: list[np.ndarray] = []
    for s_idx, trials in enumerate(per_start):
        arr = np.asarray(list(trials), dtype=float)
        if arr.size == 0:
            continue
        bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
        if bad.size:
            t_idx = int(bad[0])
            raise MeasurementError(
                f"{where}: throughput {arr[t_idx]!r} at start {s_idx} trial {t_idx} is not a positive "
                "finite tok/s"
            )
        starts.append(arr)
    return starts


@dataclass(frozen=True)
class CellEstimate:
    """Mean steady-state tok/s of one (variant, concurrency) cell with its interval."""

    mean: float
    lo: float
    hi: float
    n_starts: int
    n_trials: int
    cv_between: float
    cv_within: float
    method: str
    noisy: bool
    warning: str | None


def _within_sd(starts: list[np.ndarray]) -> float:
    """Pooled within-start standard deviation (NaN when no start has two trials)."""
    ss = sum(float(((s - s.mean()) ** 2).sum()) for s in starts if s.size >= 2)
    dof = sum(s.size - 1 for s in starts if s.size >= 2)
    return math.sqrt(ss / dof) if dof > 0 else float("nan")


def cell_estimate(
    per_start: Sequence[Sequence[float]],
    confidence: float = 0.95,
    cv_threshold: float = DEFAULT_CV_THRESHOLD,
) -> CellEstimate:
    """Geometric mean over server starts with a Student-t interval on the log scale
    (n_starts-1 degrees of freedom): throughput is positive and its noise multiplicative, so the
    interval is exp(mean log +- t * sd / sqrt(n)) and never goes below zero.

    With one start the between-start variance is unknown: the interval is NaN and the warning
    says so (trial-to-trial spread within one start would understate the real uncertainty).
    """
    _check_confidence(confidence)
    starts = clean_starts(per_start)
    if not starts:
        raise MeasurementError("cell has no successful trials: every server start failed or was empty")
    means = np.array([s.mean() for s in starts])
    logs = start_log_means(starts)
    n = means.size
    n_trials = int(sum(s.size for s in starts))
    mean = float(np.exp(logs.mean()))
    within = _within_sd(starts)
    cv_within = within / float(means.mean()) if math.isfinite(within) else float("nan")
    warnings = noise_warnings(per_start, cv_threshold=cv_threshold)
    if n == 1:
        cv_between = float("nan")
        lo = hi = float("nan")
        warnings.insert(0, "one server start: no between-start variance, so no interval")
        method = (
            "geometric mean of 1 server start's trials; no interval because the unit of replication is "
            "the server start"
        )
    else:
        sd_log = float(logs.std(ddof=1))
        cv_between = float(means.std(ddof=1)) / float(means.mean())
        if sd_log == 0.0:
            lo = hi = mean
        else:
            half = t_quantile(1.0 - confidence, n - 1) * sd_log / math.sqrt(n)
            lo, hi = float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
        method = (
            f"geometric mean of {n} per-start geometric means (log tok/s averaged within each start), "
            f"Student-t {confidence:.0%} interval on the log scale with {n - 1} df (never below zero)"
        )
    noisy = bool(
        (math.isfinite(cv_between) and cv_between > cv_threshold)
        or (math.isfinite(cv_within) and cv_within > cv_threshold)
    )
    return CellEstimate(
        mean=mean,
        lo=lo,
        hi=hi,
        n_starts=n,
        n_trials=n_trials,
        cv_between=cv_between,
        cv_within=cv_within,
        method=method,
        noisy=noisy,
        warning="; ".join(warnings) if warnings else None,
    )


NanFloat = Annotated[float, BeforeValidator(lambda v: math.nan if v is None else v)]
"""A float that may be NaN (no interval): strict JSON writes it null, and null reads back NaN."""


@dataclass(frozen=True)
class RatioEstimate:
    """variant / baseline throughput ratio with a (corrected) interval and p-value.

    ``pct`` etc. are (ratio - 1) * 100.  ``p_value`` is already corrected for the comparisons
    (and looks, when a stopping rule made it); ``significant`` == the interval excludes 1.
    """

    ratio: NanFloat
    lo: NanFloat
    hi: NanFloat
    pct: NanFloat
    pct_lo: NanFloat
    pct_hi: NanFloat
    p_value: NanFloat
    method: str
    correction: str
    significant: bool
    level: NanFloat = 0.95
    """The per-comparison confidence level actually used for lo..hi (after correction)."""
    n_starts_variant: int = 0
    n_starts_baseline: int = 0
    n_trials_variant: int = 0
    n_trials_baseline: int = 0
    df: NanFloat = float("nan")
    se_log: NanFloat = float("nan")
    diff_log: NanFloat = float("nan")
    """Difference of the arms' mean per-start log values (log of the ratio)."""
    warning: str | None = None

    @property
    def rel_halfwidth(self) -> float:
        """Half-width of the interval relative to the ratio (log scale ~ relative): max distance."""
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return float("inf")
        return max(self.hi / self.ratio - 1.0, 1.0 - self.lo / self.ratio)


def start_log_means(starts: list[np.ndarray]) -> np.ndarray:
    """Per-start mean of log tok/s (the geometric mean of a start's trials, on the log scale)."""
    return np.array([np.log(s).mean() for s in starts])


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise InputError(f"confidence must be in (0, 1), got {confidence!r}")


HETEROGENEITY_P = 0.4
"""Bartlett's test p-value at or below which the arms' between-start variances are not shrunk
toward each other at all (each comparison uses its own arms: Welch). Between this and 1 the prior's
weight rises linearly to full pooling. Deliberately liberal: pooling unequal variances narrows the
noisy arm's interval, so the weight must fall readily when starts are few
(benchmarks/stats_coverage.py prints the coverage this gives)."""

DRIFT_P = 0.10
"""Two-way analysis of variance (arms x rounds of starts): a round effect with p below this is drift
in time, and comparisons then pair each start with the other arm's start of the same round."""


@dataclass(frozen=True)
class SharedNoise:
    """How between-start noise of log values is estimated for the comparisons of one family (the
    arms measured at one concurrency level, on one metric).

    A start's effect (memory layout, graph capture, a hot GPU) is noise every arm has; with few
    starts per arm one arm's own variance has 1-3 degrees of freedom and Welch intervals are very
    wide (t = 12.7 at 1 df). Each arm's variance is therefore shrunk toward the variance pooled over
    the other arms (empirical Bayes, as limma's moderated t): the prior carries `prior_weight` x the
    other arms' degrees of freedom, where the weight falls from 1 (Bartlett's test finds no sign of
    unequal variances: full pooling) to 0 (clearly unequal: each comparison uses its own arms, and
    the intervals widen by themselves). Degrees of freedom are counted per server start, never per
    cell or trial: every concurrency level measured on one start shares that start's effect.
    Within-start trials estimate the within-start noise separately (`within_sd_log`).
    When the starts' values move together by round (drift in time), `paired` is set and each
    comparison uses the differences between starts of the same round.
    """

    pooled: bool
    sd_log: float | None
    df: int
    arms: int
    bartlett_p: float | None
    note: str
    prior_weight: float = 1.0
    paired: bool = False
    drift_p: float | None = None
    resid_sd_log: float | None = None
    """Two-way residual SD (rounds removed), used by paired comparisons when variances are equal."""
    resid_df: int = 0
    within_sd_log: float | None = None
    within_df: int = 0

    @property
    def kind(self) -> str:
        if self.paired:
            return "paired"
        if self.df == 0:
            return "none"
        return "pooled" if self.pooled else ("shrunk" if self.prior_weight > 0 else "separate")


def _starts_and_rounds(per_start: Sequence[Sequence[float]], rounds: Sequence[int] | None,
                       where: str) -> tuple[list[np.ndarray], list[int]]:
    """Non-empty starts with their rounds (the round defaults to the start's position)."""
    ids = list(rounds) if rounds is not None else list(range(len(per_start)))
    if len(ids) != len(per_start):
        raise InputError(f"{where}: {len(ids)} rounds for {len(per_start)} starts")
    kept = [(arr, r) for arr, r in zip((list(t) for t in per_start), ids, strict=True) if arr]
    starts = clean_starts([k for k, _ in kept], where)
    return starts, [r for _, r in kept]


def _bartlett(s2: np.ndarray, n: np.ndarray) -> float | None:
    from scipy import special

    if s2.size < 2 or not (s2 > 0).all():
        return None
    k, df = s2.size, float((n - 1).sum())
    pooled = float(((n - 1) * s2).sum() / df)
    t_stat = (df * math.log(pooled) - float(((n - 1) * np.log(s2)).sum())) / (
        1 + (float((1 / (n - 1)).sum()) - 1 / df) / (3 * (k - 1)))
    return float(special.chdtrc(k - 1, t_stat))


def _drift(logs: list[np.ndarray], rounds: list[list[int]]) -> tuple[float | None, float | None, int]:
    """(p of the round effect, two-way residual SD, its df) over the rounds every arm has."""
    from scipy import special

    common = sorted(set.intersection(*(set(r) for r in rounds))) if rounds else []
    k, b = len(logs), len(common)
    if k < 2 or b < 3:
        return None, None, 0
    y = np.array([[lg[r.index(c)] for c in common] for lg, r in zip(logs, rounds, strict=True)])
    grand = y.mean()
    rows, cols = y.mean(axis=1, keepdims=True), y.mean(axis=0, keepdims=True)
    resid = y - rows - cols + grand
    df_res = (k - 1) * (b - 1)
    ss_res = float((resid**2).sum())
    ss_block = float(k * ((cols - grand) ** 2).sum())
    if ss_res <= 0:
        return (0.0 if ss_block > 0 else None), 0.0, df_res
    f = (ss_block / (b - 1)) / (ss_res / df_res)
    return float(special.fdtrc(b - 1, df_res, f)), math.sqrt(ss_res / df_res), df_res


def shared_noise(arms: Sequence[Sequence[Sequence[float]]], het_p: float = HETEROGENEITY_P,
                 rounds: Sequence[Sequence[int]] | None = None, drift_p: float = DRIFT_P) -> SharedNoise:
    """The noise model of one comparison family (see SharedNoise). `rounds[i][j]` is the round (the
    interleaved block) of arm i's start j; without it no pairing in time is attempted."""
    pairs = [_starts_and_rounds(a, None if rounds is None else rounds[i], f"arm {i}") for i, a in enumerate(arms)]
    logs = [start_log_means(st) for st, _ in pairs]
    all_starts = [s for st, _ in pairs for s in st]
    within = _within_sd([np.log(s) for s in all_starts])
    within_df = int(sum(s.size - 1 for s in all_starts if s.size >= 2))
    within_sd = within if math.isfinite(within) else None
    w_note = (f"; within-start trials: SD {within:.1%} of log values ({within_df} df), estimated separately"
              if math.isfinite(within) else "")
    with_var = [x for x in logs if x.size >= 2]
    df = int(sum(x.size - 1 for x in with_var))
    if df == 0:
        return SharedNoise(False, None, 0, len(with_var), None,
                           "no arm has two server starts: no variance to share" + w_note, 0.0,
                           within_sd_log=within_sd, within_df=within_df)
    s2 = np.array([x.var(ddof=1) for x in with_var])
    n = np.array([x.size for x in with_var])
    pooled_var = float(((n - 1) * s2).sum() / df)
    p = _bartlett(s2, n)
    weight = prior_weight(p, het_p)
    drift, resid_sd, resid_df = (None, None, 0)
    if rounds is not None:
        drift, resid_sd, resid_df = _drift(logs, [r for _, r in pairs])
    # Diagnostics only: the design, not these tests, fixes the comparison (Welch's t on each
    # comparison's two arms). Choosing pairing or pooling from the same data the verdict uses
    # breaks the verdict's error rate (the pre-test selects the looks whose differences look tight).
    paired = False
    bp = f"Bartlett p = {p:.2f}" if p is not None else "Bartlett p: -"
    note = (f"between-start SD {math.sqrt(pooled_var):.1%} of log values pooled over {len(with_var)} arms "
            f"({df} df, per server start); {bp} for unequal variances")
    if drift is not None:
        note += (f"; round effect p = {drift:.3f}" + (" (the starts move together in time: the alternating order "
                                                       "spreads that drift over the arms)" if drift < drift_p else ""))
    note += "; each comparison is Welch's t on its own two arms whatever these show"
    return SharedNoise(weight >= 1.0, math.sqrt(pooled_var), df, len(with_var), p, note + w_note, weight,
                       paired, drift, resid_sd, resid_df, within_sd_log=within_sd, within_df=within_df)


DF_SHAPE_FIRST, DF_SHAPE_LAST = 0.6, 2.0
"""The exponents of `decision_df` at 3 and at 8 starts per arm (linear in between, held beyond)."""


def decision_df(df: float | np.ndarray, n: int) -> np.ndarray:
    """The degrees of freedom the verdict's test reads Welch's t at, with ``n`` starts in the smaller
    arm: lo * (df / lo) ** k, lo = n - 1 (Welch's df lies between lo and 2 lo), k = DF_SHAPE_FIRST
    at 3 starts rising linearly to DF_SHAPE_LAST at 8.

    Why: every verdict level is calibrated by simulation to hold its error at the worst ratio of
    the arms' start-to-start SDs (`stopping.nominal_levels`), so the df only shapes where the
    rejection region lies, never the error rate. Welch's own df wastes error at equal SDs, where
    it is conservative, to be exact where they differ: with this shape the worst case and equal SDs
    spend nearly alike, which at 8 starts gives the same error rate about 4% more power at equal
    SDs, and at 3 starts decides a large effect a little more often (benchmarks/RESULTS.md, issue
    47). Used only where the level is calibrated for it (the verdict and the stopping rule)."""
    lo = max(n - 1, 1)
    k = min(DF_SHAPE_LAST, max(DF_SHAPE_FIRST, DF_SHAPE_FIRST + (DF_SHAPE_LAST - DF_SHAPE_FIRST) * (n - 3) / 5))
    return np.asarray(lo * (np.maximum(df, lo) / lo) ** k, dtype=float)


def t_quantile(alpha: float, df: float) -> float:
    """The two-sided Student-t critical value at level 1 - alpha (scipy.special, fast enough for
    the stopping rule's simulations)."""
    from scipy import special

    return float(special.stdtrit(df, 1.0 - alpha / 2.0))


def t_two_sided_p(t: float, df: float) -> float:
    from scipy import special

    return float(2.0 * special.stdtr(df, -abs(t)))


POOL_P = 0.8
"""Bartlett's p at or above which the variances are fully pooled."""


def prior_weight(p: float | None, het_p: float = HETEROGENEITY_P, pool_p: float | None = None) -> float:
    """The prior's weight in the shrinkage: 0 at Bartlett p <= het_p, 1 at p >= pool_p, linear between."""
    top = POOL_P if pool_p is None else pool_p
    if p is None or p >= top:
        return 1.0
    return max(0.0, min(1.0, (p - het_p) / (top - het_p)))


def _moderated(s2: float, d: int, noise: SharedNoise) -> tuple[float, float]:
    """(moderated variance, its df) of one arm: its own variance shrunk toward the other arms'."""
    total = noise.df
    pooled = float(noise.sd_log or 0.0) ** 2
    others_df = total - d
    s0 = (total * pooled - d * s2) / others_df if others_df > 0 else pooled
    d0 = noise.prior_weight * others_df
    if d0 + d <= 0:
        return float("nan"), 0.0
    return ((d0 * max(s0, 0.0) + d * s2) / (d0 + d)), d0 + d


def ratio_estimate(
    variant: Sequence[Sequence[float]],
    baseline: Sequence[Sequence[float]],
    confidence: float = 0.95,
    n_comparisons: int = 1,
    noise: SharedNoise | None = None,
    rounds_variant: Sequence[int] | None = None,
    rounds_baseline: Sequence[int] | None = None,
    calibrated: bool = False,
) -> RatioEstimate:
    """Ratio of geometric means from per-start mean log values, at level
    1 - (1 - confidence) / n_comparisons (Bonferroni).

    ``calibrated``: for a verdict, whose levels are calibrated for Welch's t read at
    `decision_df` (the df recorded in the estimate, so intervals at other levels agree).

    Log scale because effects are multiplicative and the ratio's interval is then
    exp(difference interval). Without `noise`: Welch's t on the two arms alone. With `noise` (the
    family's SharedNoise): each arm's variance shrunk toward the family's, or, when the family
    drifts in time and rounds are given, the differences between starts of the same round.
    """
    _check_confidence(confidence)
    if n_comparisons < 1:
        raise InputError(f"n_comparisons must be >= 1, got {n_comparisons!r}")
    v_starts, v_rounds = _starts_and_rounds(variant, rounds_variant, "variant")
    b_starts, b_rounds = _starts_and_rounds(baseline, rounds_baseline, "baseline")
    if not v_starts or not b_starts:
        which = "variant" if not v_starts else "baseline"
        raise MeasurementError(f"{which} has no successful trials: cannot form a ratio")
    lv, lb = start_log_means(v_starts), start_log_means(b_starts)
    nv, nb = lv.size, lb.size
    diff = float(lv.mean() - lb.mean())
    alpha = (1.0 - confidence) / n_comparisons
    level = 1.0 - alpha
    correction = (
        "none (single comparison)"
        if n_comparisons == 1
        else f"Bonferroni over {n_comparisons} comparisons with the baseline (each interval at {level:.2%})"
    )
    counts = dict(
        n_starts_variant=nv,
        n_starts_baseline=nb,
        n_trials_variant=int(sum(s.size for s in v_starts)),
        n_trials_baseline=int(sum(s.size for s in b_starts)),
    )
    nan = float("nan")
    se, df, method = nan, nan, ""
    paired = None
    if noise is not None and noise.paired and rounds_variant is not None and rounds_baseline is not None:
        paired = _paired(lv, lb, v_rounds, b_rounds, noise)
    if paired is not None:
        diff, se, df, method = paired
    elif noise is not None and noise.df > 0 and noise.prior_weight > 0:
        se, df, method = _shared(lv, lb, noise)
    if not method:
        if nv < 2 or nb < 2:
            ratio = math.exp(diff)
            return RatioEstimate(
                ratio=ratio, lo=nan, hi=nan, pct=(ratio - 1.0) * 100.0, pct_lo=nan, pct_hi=nan, p_value=nan,
                method="Welch t on per-start mean log values", correction=correction, significant=False,
                level=level, warning="one server start in an arm: no between-start variance, so no interval",
                diff_log=diff, n_starts_variant=nv, n_starts_baseline=nb,
                n_trials_variant=counts["n_trials_variant"], n_trials_baseline=counts["n_trials_baseline"],
            )
        w = welch_log_diff(lv, lb, alpha)
        se, df = float(w.se), float(w.df)
        shape = ""
        if calibrated:
            welch_df, df = df, float(decision_df(df, min(nv, nb)))
            shape = f" read at {df:.1f} df for the verdict's calibrated levels (Welch-Satterthwaite {welch_df:.1f})"
        method = ("Welch t on per-start mean log values (server start = unit of replication), ratio = exp(difference "
                  f"of means), " + (shape.strip() if shape else f"Welch-Satterthwaite df = {df:.1f}"))
    ratio = math.exp(diff)
    if se == 0.0:
        lo = hi = ratio
        p_raw = 0.0 if diff != 0 else 1.0
    else:
        half = t_quantile(alpha, df) * se
        with np.errstate(over="ignore"):
            lo, hi = float(np.exp(diff - half)), float(np.exp(diff + half))
        p_raw = t_two_sided_p(abs(diff) / se, df)
    return RatioEstimate(
        ratio=ratio, lo=lo, hi=hi, pct=(ratio - 1.0) * 100.0, pct_lo=(lo - 1.0) * 100.0, pct_hi=(hi - 1.0) * 100.0,
        p_value=min(1.0, p_raw * n_comparisons), method=method, correction=correction,
        significant=bool(lo > 1.0 or hi < 1.0), level=level, df=df, se_log=se, diff_log=diff,
        **counts,  # type: ignore[arg-type]  # the four n_* counts
    )


def _paired(lv: np.ndarray, lb: np.ndarray, v_rounds: list[int], b_rounds: list[int],
            noise: SharedNoise) -> tuple[float, float, float, str] | None:
    """(difference, its SE, df, method) from the differences between starts of the same round
    (the family drifts in time); None with fewer than two rounds in common."""
    common = sorted(set(v_rounds) & set(b_rounds))
    d = np.array([lv[v_rounds.index(r)] - lb[b_rounds.index(r)] for r in common])
    if d.size < 2:
        return None
    if noise.pooled and noise.resid_sd_log is not None and noise.resid_df > 0:
        se, df = noise.resid_sd_log * math.sqrt(2.0 / d.size), float(noise.resid_df)
    else:
        se, df = float(d.std(ddof=1)) / math.sqrt(d.size), float(d.size - 1)
    return float(d.mean()), se, df, (f"paired by round: mean of {d.size} same-round differences of per-start mean "
                                     f"log values, {df:.0f} df, ratio = exp(mean difference)")


def _shared(lv: np.ndarray, lb: np.ndarray, noise: SharedNoise) -> tuple[float, float, str]:
    """(SE of the difference, df, method) with the family's between-start variance: pooled over its
    arms, or each arm's shrunk toward it (moderated t)."""
    nv, nb = lv.size, lb.size
    if noise.pooled:
        return (float(noise.sd_log or 0.0) * math.sqrt(1.0 / nv + 1.0 / nb), float(noise.df),
                "t on per-start mean log values with the between-start variance shared by the family's arms "
                f"({noise.df} df, per server start), ratio = exp(difference of means)")
    mv, fv = _moderated(float(lv.var(ddof=1)) if nv >= 2 else 0.0, nv - 1, noise)
    mb, fb = _moderated(float(lb.var(ddof=1)) if nb >= 2 else 0.0, nb - 1, noise)
    a, b = mv / nv, mb / nb
    df = min(float(noise.df), (a + b) ** 2 / (a**2 / fv + b**2 / fb)) if a + b > 0 else float(noise.df)
    return math.sqrt(a + b), df, (f"moderated t: each arm's between-start variance shrunk toward the family's (prior "
                                  f"weight {noise.prior_weight:.2f}), Satterthwaite df = {df:.1f}, ratio = exp("
                                  "difference of means)")


def at_level(est: RatioEstimate, level: float, correction: str) -> RatioEstimate:
    """The same comparison with its interval at another per-comparison level (same difference,
    standard error and df): how a step-down correction reports each comparison."""
    if not (math.isfinite(est.se_log) and math.isfinite(est.df)):
        return dataclasses.replace(est, level=level, correction=correction)
    if est.se_log == 0.0:
        lo = hi = est.ratio
    else:
        half = t_quantile(1.0 - level, est.df) * est.se_log
        with np.errstate(over="ignore"):
            lo, hi = float(np.exp(est.diff_log - half)), float(np.exp(est.diff_log + half))
    return dataclasses.replace(est, lo=lo, hi=hi, pct_lo=(lo - 1.0) * 100.0, pct_hi=(hi - 1.0) * 100.0,
                               level=level, correction=correction, significant=bool(lo > 1.0 or hi < 1.0))


def difference_p(est: RatioEstimate) -> float:
    """Two-sided p of 'no difference' (uncorrected)."""
    if not (math.isfinite(est.se_log) and math.isfinite(est.df)):
        return float("nan")
    if est.se_log == 0.0:
        return 0.0 if est.diff_log != 0 else 1.0
    return t_two_sided_p(abs(est.diff_log) / est.se_log, est.df)


def equivalence_p(est: RatioEstimate, min_effect: float) -> float:
    """The smallest alpha at which the 1 - alpha interval lies inside +-min_effect (on the log
    scale): both one-sided tests of the two one-sided tests procedure at alpha / 2."""
    if not (math.isfinite(est.se_log) and math.isfinite(est.df)):
        return float("nan")
    margin = math.log1p(min_effect) - abs(est.diff_log)
    if margin <= 0:
        return 1.0
    if est.se_log == 0.0:
        return 0.0
    return min(1.0, t_two_sided_p(margin / est.se_log, est.df))


@dataclass(frozen=True)
class WelchArrays:
    """Welch comparison of two samples of per-start mean log tok/s, arrays over leading axes."""

    diff: np.ndarray
    se: np.ndarray
    df: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    p: np.ndarray


def welch_log_diff(log_variant: np.ndarray, log_baseline: np.ndarray, alpha: float) -> WelchArrays:
    """Welch t interval (two-sided, level 1 - alpha) and p-value for mean(variant) - mean(baseline).

    Vectorised over leading axes (the last axis holds the starts) so simulations of thousands
    of experiments run as array operations; ``ratio_estimate`` calls it with one experiment.
    The t quantiles are Student's t with Welch-Satterthwaite degrees of freedom (scipy.special:
    the same figures as scipy.stats.t without its per-call overhead, which dominated `plan`).
    A zero standard error (identical start means) gives a degenerate interval at the estimate.
    """
    from scipy import special

    lv = np.asarray(log_variant, dtype=float)
    lb = np.asarray(log_baseline, dtype=float)
    nv, nb = lv.shape[-1], lb.shape[-1]
    diff = lv.mean(axis=-1) - lb.mean(axis=-1)
    a = lv.var(axis=-1, ddof=1) / nv
    b = lb.var(axis=-1, ddof=1) / nb
    se2 = a + b
    se = np.sqrt(se2)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(se2 > 0, se2**2 / (a**2 / (nv - 1) + b**2 / (nb - 1)), float(nv + nb - 2))
        half = special.stdtrit(df, 1.0 - alpha / 2.0) * se
        tstat = np.where(se > 0, np.abs(diff) / se, np.where(diff == 0, 0.0, np.inf))
    p = 2.0 * special.stdtr(df, -tstat)
    return WelchArrays(diff=diff, se=se, df=df, lo=diff - half, hi=diff + half, p=p)


def noise_warnings(
    per_start: Sequence[Sequence[float]],
    cv_threshold: float = DEFAULT_CV_THRESHOLD,
    outlier_alpha: float = 0.01,
    drift_p: float = 0.05,
    min_rel_outlier: float = 0.01,
) -> list[str]:
    """Plain-text warnings in the spirit of hyperfine/pyperf: high CV, outliers, drift.

    - start-to-start and trial-to-trial coefficient of variation above ``cv_threshold``;
    - outlier trials (modified z-score of a trial against the median of the other trials of
      its start, pooled normal-scaled MAD, and at least ``min_rel_outlier`` away) and outlier starts (same score on the start means, >= 3 starts);
    - drift of start means with start order (Kendall tau, >= 4 starts) and a warm-up effect
      (first trial of each start differs from the rest, one-sample t on relative gaps, >= 3 starts).

    Student-t tails from `t_two_sided_p` (scipy.special): scipy.stats costs a second of start-up
    to every command that reads a run, and is imported only for Kendall's tau (four or more starts).
    """
    starts = clean_starts(per_start)
    out: list[str] = []
    if not starts:
        return out
    means = np.array([s.mean() for s in starts])
    grand = float(means.mean())
    if means.size >= 2:
        cv_b = float(means.std(ddof=1)) / grand
        if cv_b > cv_threshold:
            out.append(
                f"start-to-start CV {cv_b:.1%} > {cv_threshold:.0%}: server starts differ; "
                "add starts or find the cause"
            )
    within = _within_sd(starts)
    if math.isfinite(within) and within / grand > cv_threshold:
        out.append(f"trial-to-trial CV {within / grand:.1%} > {cv_threshold:.0%} within starts")

    # Outliers: externally studentised (leave-one-out) residuals, which follow Student's t
    # under normal noise, tested two-sided at outlier_alpha with Bonferroni over the candidates.
    # (A MAD-based modified z-score on 3 trials or 5 starts flags a quarter of clean cells.)
    n_trials = sum(s.size for s in starts)
    flagged_trials: list[str] = []
    for s_idx, s in enumerate(starts):
        if s.size < 3:
            continue
        for t in range(s.size):
            rest = np.delete(s, t)
            ss = float(((rest - rest.mean()) ** 2).sum()) + sum(
                float(((o - o.mean()) ** 2).sum()) for j, o in enumerate(starts) if j != s_idx and o.size >= 2
            )
            dof = rest.size - 1 + sum(o.size - 1 for j, o in enumerate(starts) if j != s_idx and o.size >= 2)
            if dof < 2 or ss == 0.0:
                continue
            r = float(s[t] - rest.mean())
            tstat = r / math.sqrt(ss / dof * (1.0 + 1.0 / rest.size))
            p = t_two_sided_p(tstat, dof)
            if p < outlier_alpha / n_trials and abs(r) / rest.mean() > min_rel_outlier:
                flagged_trials.append(f"start {s_idx} trial {t} ({r / rest.mean():+.1%})")
    if flagged_trials:
        out.append(f"{len(flagged_trials)} outlier trial(s): {', '.join(flagged_trials[:5])}")
    if means.size >= 4:
        flagged_starts: list[str] = []
        for i in range(means.size):
            rest = np.delete(means, i)
            sd = float(rest.std(ddof=1))
            if sd == 0.0:
                continue
            r = float(means[i] - rest.mean())
            tstat = r / (sd * math.sqrt(1.0 + 1.0 / rest.size))
            p = t_two_sided_p(tstat, rest.size - 1)
            if p < outlier_alpha / means.size and abs(r) / rest.mean() > min_rel_outlier:
                flagged_starts.append(f"start {i} ({r / rest.mean():+.1%})")
        if flagged_starts:
            out.append(f"{len(flagged_starts)} outlier start(s): {', '.join(flagged_starts[:5])}")
    if means.size >= 4:
        from scipy import stats

        tau = stats.kendalltau(np.arange(means.size), means)
        if np.isfinite(tau.pvalue) and tau.pvalue < drift_p:
            direction = "upward" if tau.statistic > 0 else "downward"
            out.append(
                f"start means drift {direction} with start order (Kendall tau={tau.statistic:+.2f}, "
                f"p={tau.pvalue:.3f}): thermal state or background load?"
            )
    gaps = [s[0] / s[1:].mean() - 1.0 for s in starts if s.size >= 2]
    if len(gaps) >= 3:
        g = np.asarray(gaps)
        if np.ptp(g) > 0:
            # one-sample t against no gap (ptp > 0: the SD is positive)
            pvalue = t_two_sided_p(float(g.mean()) / (float(g.std(ddof=1)) / math.sqrt(g.size)), g.size - 1)
            if pvalue < drift_p and abs(g.mean()) > cv_threshold / 5:
                kind = "slower" if g.mean() < 0 else "faster"
                out.append(
                    f"first trial of each start is {kind} than the rest by {g.mean():+.1%} on average "
                    f"(p={pvalue:.3f}): warm-up may be too short"
                )
    return out
