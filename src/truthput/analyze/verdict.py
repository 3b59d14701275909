"""The verdict: per concurrency, which variant (if any) beats the baseline, in plain text.

Rules (why they exist):
- a winner is named only when its corrected interval for variant/baseline lies entirely above 1
  (Bonferroni over the variants compared with the baseline at that concurrency, plus the
  look adjustment when a sequential StoppingRule decided when to stop);
- the output guard can veto: a variant whose greedy outputs differ from the baseline's is
  flagged and not named a winner, unless its divergence is expected (e.g. a quantised KV cache);
  speculative decoding must never change greedy output;
- ``simulated=True`` makes every line say "simulated" (principle 1: simulated figures are never
  presented as measurements).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from truthput.analyze.guard import GuardResult
from truthput.analyze.stats import RatioEstimate, cell_estimate, clean_starts, ratio_estimate, shared_noise
from truthput.analyze.stopping import StoppingRule


@dataclass
class ComparisonVerdict:
    """One variant against the baseline at one concurrency."""

    variant: str
    outcome: str
    """"faster" | "slower" | "equivalent" (the interval lies inside +-min_effect) | "not decided"
    (too wide for either) | "undetermined" (one start in an arm: no interval)."""
    estimate: RatioEstimate
    guard: str | None
    vetoed: bool
    line: str
    flagged: list[str] = field(default_factory=list)
    more_starts: int | None = None
    """For "not decided": about how many more starts per arm would decide it, if the effect and the
    noise stay as observed."""
    """Validity flags on the figures this comparison rests on ("<variant> c=<n>: <code>")."""


@dataclass
class ConcurrencyVerdict:
    concurrency: int
    baseline: str
    baseline_mean: float | None
    comparisons: list[ComparisonVerdict]
    winner: str | None
    """The variant named the winner, or None.  With several qualifying variants the one with
    the highest ratio is named only if its interval lies above every other qualifier's ratio."""
    lines: list[str]


@dataclass
class Verdict:
    per_concurrency: list[ConcurrencyVerdict]
    failed: dict[str, str]
    method_notes: list[str]
    simulated: bool = False
    confidence: float = 0.95
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready dict (NaN becomes None)."""

        def clean(x):
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, list):
                return [clean(v) for v in x]
            return x

        return clean(asdict(self))

    def lines(self) -> list[str]:
        out: list[str] = []
        for cv in self.per_concurrency:
            out.extend(cv.lines)
        tag = "simulated: " if self.simulated else ""
        for variant, why in self.failed.items():
            out.append(f"{tag}{variant}: failed, no measurements ({why})")
        out.extend(f"{tag}{n}" for n in self.notes)
        return out


def _pct(x: float) -> str:
    return f"{x:+.1f}%" if abs(x) < 10 else f"{x:+.0f}%"


def _mag(x: float) -> str:
    """A magnitude in percent, without a sign: "29%", "4.4%"."""
    x = abs(x)
    return f"{x:.1f}%" if x < 10 else f"{x:.0f}%"


def _change(e: RatioEstimate) -> tuple[str, str]:
    """("29% slower than", "19%..37%"): the magnitude of a decided change and its interval."""
    if e.ratio >= 1:
        return f"{_mag(e.pct)} faster than", f"{_mag(e.pct_lo)}..{_mag(e.pct_hi)}"
    return f"{_mag(e.pct)} slower than", f"{_mag(-e.pct_hi)}..{_mag(-e.pct_lo)}"


def more_starts_to_decide(e: RatioEstimate, min_effect: float) -> int | None:
    """About how many more server starts per arm would make the interval exclude 1 or fit inside
    +-min_effect, if the effect and the noise stay as observed (the half-width shrinks as
    1/sqrt(starts))."""
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


def _counts(e: RatioEstimate) -> str:
    def arm(s: int, t: int) -> str:
        return f"{s} starts x {t // s} trials" if s and t % s == 0 else f"{s} starts, {t} trials"

    v = arm(e.n_starts_variant, e.n_trials_variant)
    b = arm(e.n_starts_baseline, e.n_trials_baseline)
    return v if v == b else f"{v} vs baseline {b}"


def _adjustments(n_comparisons: int, sequential: bool) -> str:
    adj = []
    if n_comparisons > 1:
        adj.append(f"Bonferroni over {n_comparisons}")
    if sequential:
        adj.append("sequential-adjusted")
    return "".join(f", {a}" for a in adj)


def _ci(e: RatioEstimate, confidence: float, n_comparisons: int, sequential: bool) -> str:
    return f"{confidence:.0%} CI {_pct(e.pct_lo)}..{_pct(e.pct_hi)}" + _adjustments(n_comparisons, sequential)


def make_verdict(
    cells: Mapping[tuple[str, int], Sequence[Sequence[float]]],
    baseline: str,
    failed: Mapping[str, str] | None = None,
    guard: Mapping[str, GuardResult] | None = None,
    confidence: float = 0.95,
    simulated: bool = False,
    stopping_rule: StoppingRule | None = None,
    look: int | None = None,
    expected_divergence: Collection[str] = (),
    min_effect: float = 0.02,
) -> Verdict:
    """Build the verdict from per-cell per-start tok/s.

    ``cells[(variant, concurrency)]`` = per-start lists of trial tok/s.  ``failed`` maps a
    variant to why it produced nothing.  ``guard[variant]`` is that variant's output comparison
    with the baseline.  With ``stopping_rule`` the intervals use its look-adjusted level (the
    look = ``look`` or the largest number of starts in any cell), so ``confidence`` is then the
    rule's 1 - alpha.  ``expected_divergence`` names variants allowed to change outputs.
    """
    failed = dict(failed or {})
    guard = dict(guard or {})
    tag = "simulated: " if simulated else ""
    if stopping_rule is not None:
        confidence = 1.0 - stopping_rule.alpha
        if look is None:
            look = max((len(clean_starts(d)) for d in cells.values()), default=0)
    by_conc: dict[int, dict[str, Sequence[Sequence[float]]]] = {}
    for (variant, conc), data in cells.items():
        if clean_starts(data):
            by_conc.setdefault(conc, {})[variant] = data
    notes: list[str] = []
    out: list[ConcurrencyVerdict] = []
    for conc in sorted(by_conc):
        group = by_conc[conc]
        if baseline not in group:
            notes.append(f"c={conc}: baseline {baseline} has no measurements; no comparison possible")
            continue
        base_est = cell_estimate(group[baseline], confidence=confidence)
        others = sorted(v for v in group if v != baseline and v not in failed)
        m = len(others)
        noise = shared_noise([group[v] for v in [baseline, *others]])
        comps: list[ComparisonVerdict] = []
        for v in others:
            if stopping_rule is not None:
                level = stopping_rule.confidence_at(look or 0, 1)
                est = ratio_estimate(group[v], group[baseline], confidence=level, n_comparisons=m, noise=noise)
            else:
                est = ratio_estimate(group[v], group[baseline], confidence=confidence, n_comparisons=m,
                                     noise=noise)
            g = guard.get(v)
            diverges = g is not None and not g.identical
            expected = v in expected_divergence
            guard_txt = None if g is None else (g.verdict + (" (expected for this variant)" if diverges and expected else ""))
            ci = _ci(est, confidence, m, stopping_rule is not None)
            counts = _counts(est)
            head = f"{tag}c={conc}: "
            more = None
            margin = 1.0 + min_effect
            if not math.isfinite(est.lo):
                outcome = "undetermined"
                line = (
                    f"{head}{v} vs {baseline}: {_pct(est.pct)} but undetermined: one server start in an arm, "
                    f"no between-start variance ({counts})"
                )
            elif est.significant:
                outcome = "faster" if est.ratio > 1 else "slower"
                change, interval = _change(est)
                line = (f"{head}{v} is {change} {baseline} ({confidence:.0%} CI {interval}"
                        f"{_adjustments(m, stopping_rule is not None)}, {counts})")
            elif est.lo >= 1.0 / margin and est.hi <= margin:
                outcome = "equivalent"
                line = (f"{head}{v} is equivalent to {baseline} within +-{min_effect:.0%} ({_pct(est.pct)}, {ci}, "
                        f"{counts})")
            else:
                outcome = "not decided"
                more = more_starts_to_decide(est, min_effect)
                why = f"; about {more} more start{'s' if more != 1 else ''} per arm would likely decide it" \
                    if more is not None else ""
                line = f"{head}{v} vs {baseline}: not decided ({_pct(est.pct)}, {ci}, {counts}){why}"
            vetoed = diverges and not expected
            if g is not None:
                line += f"; output guard: {guard_txt}"
            if vetoed and outcome == "faster":
                line += f"; NOT named a winner: greedy outputs differ from {baseline}'s"
            if est.warning and outcome != "undetermined":
                line += f"; {est.warning}"
            comps.append(ComparisonVerdict(v, outcome, est, guard_txt, vetoed, line, more_starts=more))
        qualifiers = [c for c in comps if c.outcome == "faster" and not c.vetoed]
        winner = None
        lines = [c.line for c in comps]
        if qualifiers:
            best = max(qualifiers, key=lambda c: c.estimate.ratio)
            rivals = [c for c in qualifiers if c is not best]
            # Head-to-head: best must beat every other qualifier at the same corrected level.
            level = 1.0 - (1.0 - confidence) / m if stopping_rule is None else (
                1.0 - (1.0 - stopping_rule.confidence_at(look or 0, 1)) / m)
            if all(
                ratio_estimate(group[best.variant], group[c.variant], confidence=level, noise=noise).significant
                for c in rivals
            ):
                winner = best.variant
                lines.append(f"{tag}c={conc}: winner {winner}")
            else:
                names = ", ".join(c.variant for c in qualifiers)
                lines.append(
                    f"{tag}c={conc}: {names} all beat {baseline}; their intervals overlap, so no single winner"
                )
        elif comps:
            lines.append(f"{tag}c={conc}: no winner: {baseline} stays")
        if comps and noise.df:
            lines.append(f"{tag}c={conc}: noise: {noise.note}")
        if base_est.noisy and base_est.warning:
            lines.append(f"{tag}c={conc}: {baseline} is noisy: {base_est.warning}")
        out.append(
            ConcurrencyVerdict(
                concurrency=conc,
                baseline=baseline,
                baseline_mean=base_est.mean,
                comparisons=comps,
                winner=winner,
                lines=lines,
            )
        )
    method_notes = [
        "unit of replication: the server start; each start's trials are averaged (mean log tok/s)",
        "ratio = exp(difference of mean per-start log tok/s); t interval with the between-start variance pooled "
        "over the arms at that concurrency (df counted per server start), or Welch per comparison when Bartlett's "
        "test says the arms' variances differ",
        "multiple comparisons: Bonferroni over the variants compared with the baseline at each concurrency",
        "a winner must have its whole interval above 1 and identical greedy outputs (unless divergence is expected)",
        f"equivalent: the whole interval lies within +-{min_effect:.0%} (two one-sided tests at the same level)",
        "intervals of tok/s and of ratios are on the log scale (geometric): never below zero",
    ]
    if stopping_rule is not None:
        method_notes.append(stopping_rule.describe() + f"; intervals reported at look {look}")
    if simulated:
        method_notes.insert(0, "SIMULATED: every figure comes from the simulator, not a real server")
    return Verdict(
        per_concurrency=out,
        failed=failed,
        method_notes=method_notes,
        simulated=simulated,
        confidence=confidence,
        notes=notes,
    )
