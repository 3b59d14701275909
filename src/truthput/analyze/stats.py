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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from truthput.errors import MeasurementError, SpecError

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
    from scipy import stats

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
            half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd_log / math.sqrt(n)
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


@dataclass(frozen=True)
class RatioEstimate:
    """variant / baseline throughput ratio with a (corrected) interval and p-value.

    ``pct`` etc. are (ratio - 1) * 100.  ``p_value`` is already corrected for the comparisons
    (and looks, when a stopping rule made it); ``significant`` == the interval excludes 1.
    """

    ratio: float
    lo: float
    hi: float
    pct: float
    pct_lo: float
    pct_hi: float
    p_value: float
    method: str
    correction: str
    significant: bool
    level: float = 0.95
    """The per-comparison confidence level actually used for lo..hi (after correction)."""
    n_starts_variant: int = 0
    n_starts_baseline: int = 0
    n_trials_variant: int = 0
    n_trials_baseline: int = 0
    df: float = float("nan")
    se_log: float = float("nan")
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
        raise SpecError(f"confidence must be in (0, 1), got {confidence!r}")


HETEROGENEITY_P = 0.4
"""Bartlett's test p-value below which the arms' between-start variances are taken as unequal.
Deliberately liberal: pooling unequal variances narrows the noisy arm's interval, so the test
must reject readily when starts are few (benchmarks/stats_coverage.py, table 3: at 0.4 the
unadjusted 95% intervals cover >= 0.94 with equal noise and >= 0.90 with one arm 4x noisier,
from 2 starts per arm)."""


@dataclass(frozen=True)
class SharedNoise:
    """The between-start variance of log tok/s, pooled over the arms of one comparison family.

    A start's effect (memory layout, graph capture, a hot GPU) is the noise every arm shares
    the nature of; with few starts per arm, one arm's own variance has 1-3 degrees of freedom
    and Welch intervals are very wide (t = 12.7 at 1 df). Pooled over k arms the estimate has
    sum(n_arm - 1) degrees of freedom -- counted per server start, never per cell or trial.
    When Bartlett's test says the variances differ, nothing is pooled (`pooled` False): each
    comparison uses its own two arms (Welch), and the intervals widen by themselves.
    """

    pooled: bool
    sd_log: float | None
    df: int
    arms: int
    bartlett_p: float | None
    note: str


def shared_noise(arms: Sequence[Sequence[Sequence[float]]], het_p: float = HETEROGENEITY_P) -> SharedNoise:
    """Pool the between-start variance of per-start mean log tok/s over `arms` (see SharedNoise)."""
    from scipy import stats

    logs = [start_log_means(clean_starts(a)) for a in arms]
    with_var = [x for x in logs if x.size >= 2]
    df = int(sum(x.size - 1 for x in with_var))
    if df == 0:
        return SharedNoise(False, None, 0, len(with_var), None, "no arm has two server starts: no variance to share")
    s2 = np.array([x.var(ddof=1) for x in with_var])
    n = np.array([x.size for x in with_var])
    pooled_var = float(((n - 1) * s2).sum() / df)
    p = None
    if len(with_var) >= 2 and (s2 > 0).all():
        k = len(with_var)
        t_stat = (df * math.log(pooled_var) - float(((n - 1) * np.log(s2)).sum())) / (
            1 + (float((1 / (n - 1)).sum()) - 1 / df) / (3 * (k - 1)))
        p = float(stats.chi2.sf(t_stat, k - 1))
    if p is not None and p < het_p:
        return SharedNoise(False, math.sqrt(pooled_var), df, len(with_var), p,
                           f"between-start variances differ across arms (Bartlett p = {p:.2f}): not pooled, "
                           "each comparison uses its own arms (Welch)")
    return SharedNoise(True, math.sqrt(pooled_var), df, len(with_var), p,
                       f"between-start variance pooled over {len(with_var)} arms ({df} df, counted per server start"
                       + (f"; Bartlett p = {p:.2f}" if p is not None else "") + ")")


def ratio_estimate(
    variant: Sequence[Sequence[float]],
    baseline: Sequence[Sequence[float]],
    confidence: float = 0.95,
    n_comparisons: int = 1,
    noise: SharedNoise | None = None,
) -> RatioEstimate:
    """Ratio of geometric means via Welch's t on per-start mean log tok/s, Bonferroni-corrected.

    Log scale because throughput effects are multiplicative and the ratio's interval is then
    exp(difference interval).  Welch because a variant may be noisier than the baseline.
    With ``n_comparisons`` = k variants compared with one baseline, each interval is built at
    level 1 - (1 - confidence) / k (Bonferroni), so all k intervals hold together at
    ``confidence`` and a winner named from them keeps the family-wise error at 1 - confidence.
    """
    _check_confidence(confidence)
    if n_comparisons < 1:
        raise SpecError(f"n_comparisons must be >= 1, got {n_comparisons!r}")
    v_starts = clean_starts(variant, "variant")
    b_starts = clean_starts(baseline, "baseline")
    if not v_starts or not b_starts:
        which = "variant" if not v_starts else "baseline"
        raise MeasurementError(f"{which} has no successful trials: cannot form a ratio")
    lv, lb = start_log_means(v_starts), start_log_means(b_starts)
    nv, nb = lv.size, lb.size
    diff = float(lv.mean() - lb.mean())
    ratio = math.exp(diff)
    alpha = (1.0 - confidence) / n_comparisons
    level = 1.0 - alpha
    correction = (
        "none (single comparison)"
        if n_comparisons == 1
        else f"Bonferroni over {n_comparisons} comparisons with the baseline (each interval at {level:.2%})"
    )
    method = (
        "Welch t on per-start mean log tok/s (server start = unit of replication), "
        "ratio = exp(difference of means)"
    )
    counts = dict(
        n_starts_variant=nv,
        n_starts_baseline=nb,
        n_trials_variant=int(sum(s.size for s in v_starts)),
        n_trials_baseline=int(sum(s.size for s in b_starts)),
    )
    pct = (ratio - 1.0) * 100.0
    if noise is not None and noise.pooled and noise.sd_log is not None and noise.df > 0:
        from scipy import stats

        se = noise.sd_log * math.sqrt(1.0 / nv + 1.0 / nb)
        if se == 0.0:
            lo = hi = ratio
            p_raw = 0.0 if diff != 0 else 1.0
        else:
            half = float(stats.t.isf(alpha / 2.0, noise.df)) * se
            lo, hi = math.exp(diff - half), math.exp(diff + half)
            p_raw = float(2.0 * stats.t.sf(abs(diff) / se, noise.df))
        return RatioEstimate(
            ratio=ratio, lo=lo, hi=hi, pct=pct, pct_lo=(lo - 1.0) * 100.0, pct_hi=(hi - 1.0) * 100.0,
            p_value=min(1.0, p_raw * n_comparisons),
            method=("t on per-start mean log tok/s with the between-start variance shared by the run's arms "
                    f"({noise.df} df), ratio = exp(difference of means)"),
            correction=correction, significant=bool(lo > 1.0 or hi < 1.0), level=level, df=float(noise.df),
            se_log=se, **counts,  # type: ignore[arg-type]  # the four n_* counts
        )
    if nv < 2 or nb < 2:
        nan = float("nan")
        return RatioEstimate(
            ratio=ratio, lo=nan, hi=nan, pct=pct, pct_lo=nan, pct_hi=nan, p_value=nan,
            method=method, correction=correction, significant=False, level=level,
            warning="one server start in an arm: no between-start variance, so no interval",
            **counts,
        )
    w = welch_log_diff(lv, lb, alpha)
    df, se = float(w.df), float(w.se)
    with np.errstate(over="ignore"):
        lo, hi = float(np.exp(w.lo)), float(np.exp(w.hi))
    p_raw = float(w.p)
    p_adj = min(1.0, p_raw * n_comparisons)
    significant = bool(lo > 1.0 or hi < 1.0)
    return RatioEstimate(
        ratio=ratio,
        lo=lo,
        hi=hi,
        pct=pct,
        pct_lo=(lo - 1.0) * 100.0,
        pct_hi=(hi - 1.0) * 100.0,
        p_value=p_adj,
        method=method + f", Welch-Satterthwaite df = {df:.1f}",
        correction=correction,
        significant=significant,
        level=level,
        df=df,
        se_log=se,
        **counts,  # type: ignore[arg-type]  # the four n_* counts
    )


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
    The t quantiles come from scipy.stats.t with Welch-Satterthwaite degrees of freedom.
    A zero standard error (identical start means) gives a degenerate interval at the estimate.
    """
    from scipy import stats

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
        half = stats.t.isf(alpha / 2.0, df) * se
        tstat = np.where(se > 0, np.abs(diff) / se, np.where(diff == 0, 0.0, np.inf))
    p = 2.0 * stats.t.sf(tstat, df)
    return WelchArrays(diff=diff, se=se, df=df, lo=diff - half, hi=diff + half, p=p)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (for reporting; intervals use Bonferroni so they agree
    with the decision)."""
    p = np.asarray(p_values, dtype=float)
    m = p.size
    order = np.argsort(p)
    adj = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adj
    return out.tolist()


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
    """
    from scipy import stats

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
            p = 2.0 * float(stats.t.sf(abs(tstat), dof))
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
            p = 2.0 * float(stats.t.sf(abs(tstat), rest.size - 1))
            if p < outlier_alpha / means.size and abs(r) / rest.mean() > min_rel_outlier:
                flagged_starts.append(f"start {i} ({r / rest.mean():+.1%})")
        if flagged_starts:
            out.append(f"{len(flagged_starts)} outlier start(s): {', '.join(flagged_starts[:5])}")
    if means.size >= 4:
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
            res = stats.ttest_1samp(g, 0.0)
            if res.pvalue < drift_p and abs(g.mean()) > cv_threshold / 5:
                kind = "slower" if g.mean() < 0 else "faster"
                out.append(
                    f"first trial of each start is {kind} than the rest by {g.mean():+.1%} on average "
                    f"(p={res.pvalue:.3f}): warm-up may be too short"
                )
    return out
