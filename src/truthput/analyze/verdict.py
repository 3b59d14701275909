"""The verdict: per load level, which variant (if any) beats the baseline, in plain text.

Rules (why they exist):
- every comparison of the run (each variant against the baseline, at each level, on each verdict
  metric) is decided in one family (`truthput.analyze.decide`: Hochberg, plus the look's share of the
  error when a sequential StoppingRule decides when to stop): a change, equivalence within
  +-min_effect, or "not decided" with the starts that would likely decide it;
- a winner is named only when its interval for tok/s variant/baseline lies entirely above 1;
- the output guard can veto: a variant whose greedy outputs differ from the baseline's is
  flagged and not named a winner, unless its divergence is expected (e.g. a quantised KV cache);
  speculative decoding must never change greedy output;
- ``simulated=True`` makes every line say "simulated" (principle 1: simulated figures are never
  presented as measurements).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Annotated, Any
from dataclasses import dataclass, field

from pydantic import BeforeValidator, PlainSerializer

from truthput.analyze.decide import ComparisonKey, Decision, decide_family, metric, more_starts_to_decide
from truthput.analyze.guard import GuardResult
from truthput.text import percent
from truthput.analyze.stats import RatioEstimate, cell_estimate, clean_starts, ratio_estimate, shared_noise
from truthput.analyze.stopping import StoppingRule
from truthput.experiment.levels import Level, level_from_json, level_json, level_label
from truthput.text import plural

VerdictLevel = Annotated[Level, BeforeValidator(lambda d: level_from_json(d) if isinstance(d, Mapping) and "level" in d
                                                else d),
                         PlainSerializer(level_json)]
"""A level in the verdict: the document's form (concurrency, rate and the label, as every row has
them) when written, either form when read back."""


@dataclass(frozen=True)
class FlaggedArm:
    """A validity flag on the tok/s figure of one arm of a comparison: the comparison rests on it."""

    variant: str
    """The arm whose figure is flagged (the variant or the baseline)."""
    code: str
    """The flag's code (`!stale_counter`, `!load_not_reached`, ...: see the flags)."""


@dataclass(frozen=True)
class Caution:
    """Why a comparison's outcome may not carry over to the user's server (not a flag on a figure:
    the figures are right, what they measured may not be the user's case); the verdict's notes say
    why once."""

    code: str
    reason: str


@dataclass
class ComparisonVerdict:
    """One variant against the baseline at one load level: the decision and what it rests on. Its
    `line` is rendered from these fields, never patched."""

    variant: str
    outcome: str
    """"faster" | "slower" (tok/s), "higher" | "lower" (goodput, latency) | "equivalent" (the
    interval lies inside +-min_effect) | "not decided" (too wide for either) | "undetermined" (one
    start in an arm: no interval)."""
    estimate: RatioEstimate
    """variant / baseline: the ratio, its interval at the level decided, p, the starts of each arm."""
    guard: str | None
    """The output guard's verdict on the variant's greedy outputs (None: no guard ran)."""
    vetoed: bool
    """Its outputs differ from the baseline's where that is not expected: never named a winner."""
    statement: str
    """The decision in a sentence (outcome, interval, starts), without what `line` adds to it."""
    baseline: str = ""
    """The arm it is compared with."""
    flagged: list[FlaggedArm] = field(default_factory=list)
    """Flags on either arm's tok/s figure: the comparison rests on flagged figures."""
    level_label: str = ""
    """Its level as every view names it ("c=4", "2 req/s")."""
    more_starts: int | None = None
    """For "not decided": about how many more starts per arm would decide it, if the effect and the
    noise stay as observed."""
    metric: str = "tok/s"
    step: int | None = None
    """Its place in the family's order by p (1 = the smallest, tested at alpha / family)."""
    better: bool | None = None
    """Whether the variant is decided better than the baseline on this metric (None: no change
    decided)."""
    beyond_reach_at: int | None = None
    """Not decided, and beyond reach: this many starts per arm (max_starts) would most likely not
    decide it either (the stopping rule's futility stop)."""
    cautions: list[Caution] = field(default_factory=list)
    """Why its outcome may not carry over (e.g. `synthetic_text`: speculation judged on made-up text)."""

    @property
    def decided(self) -> bool:
        return self.outcome not in ("not decided", "undetermined")

    @property
    def futile(self) -> bool:
        return self.beyond_reach_at is not None

    @property
    def line(self) -> str:
        """The comparison as every view says it: the statement, then whether it is beyond reach,
        the output guard, a veto, the estimate's warning and the flags it rests on."""
        out = self.statement
        if self.beyond_reach_at is not None:
            out += (f"; beyond reach: {self.beyond_reach_at} starts per arm would most likely not decide it "
                    "either (the starts differ too much for a change this small)")
        if self.guard is not None and self.metric == "tok/s":
            out += f"; output guard: {self.guard}"
        if self.vetoed and self.outcome == "faster":
            out += f"; NOT named a winner: greedy outputs differ from {self.baseline}'s"
        if self.estimate.warning and self.outcome != "undetermined":
            out += f"; {self.estimate.warning}"
        if self.flagged:
            said = ", ".join(dict.fromkeys(f"{f.variant} {self.level_label}: {f.code}" for f in self.flagged))
            out += f"; rests on flagged figures ({said}: see the flags)"
        return out + "".join(f"; !{c.code} (see the notes)" for c in self.cautions)


@dataclass
class ConcurrencyVerdict:
    """The comparisons at one level on one metric."""

    level: VerdictLevel
    """Streams (closed loop) or a `Rate` (open loop); in JSON `{concurrency, rate, level}` as every
    row's level."""
    baseline: str
    baseline_mean: float | None
    """The baseline's mean tok/s at this level (tok/s only)."""
    comparisons: list[ComparisonVerdict]
    winner: str | None
    """The variant named the winner, or None.  With several qualifying variants the one with
    the highest ratio is named only if its interval lies above every other qualifier's ratio."""
    metric: str = "tok/s"
    """What is compared: "tok/s", or another verdict metric ("goodput", "itl_p99", ...)."""
    noise: str = ""
    """The noise model's note for this level's arms."""
    decision: list[str] = field(default_factory=list)
    """The level's outcome in a line (winner / no winner / several beat the baseline): what the
    terminal says first."""
    diagnostics: list[str] = field(default_factory=list)
    """How the data looked (noise, a noisy baseline): the method's evidence, not a decision."""

    @property
    def label(self) -> str:
        return level_label(self.level)

    @property
    def lines(self) -> list[str]:
        """Its comparisons' lines, then its decision and diagnostics."""
        return [c.line for c in self.comparisons] + self.decision + self.diagnostics


@dataclass
class Verdict:
    per_concurrency: list[ConcurrencyVerdict]
    """One entry per level and metric, each with its comparisons."""
    failed: dict[str, str]
    """Variant -> why it produced no measurement."""
    method_notes: list[str]
    """How the comparisons were made and decided (the method section)."""
    simulated: bool = False
    """Every figure came from the simulator: every line says so."""
    confidence: float = 0.95
    notes: list[str] = field(default_factory=list)
    """What the run rests on (cells left out and why, the nodes it ran on)."""
    family: int = 0
    """How many comparisons were decided together."""
    nothing: str | None = None
    """Why no comparison was made, where none was (one variant, the baseline failed, no figure)."""

    def comparisons(self) -> list[ComparisonVerdict]:
        return [c for cv in self.per_concurrency for c in cv.comparisons]

    def winners(self) -> dict[str, list[Level]]:
        """Each variant the verdict names the winner somewhere, with the levels where it does."""
        out: dict[str, list[Level]] = {}
        for cv in self.per_concurrency:
            if cv.winner:
                out.setdefault(cv.winner, []).append(cv.level)
        return out

    def decision_lines(self) -> list[str]:
        """One line per level: its outcome, then the run's own lines."""
        return [line for cv in self.per_concurrency for line in cv.decision] + self.run_lines()

    def run_lines(self) -> list[str]:
        """What happened to variants that failed, and what the run rests on (its notes: cells left
        out, where it was placed)."""
        tag = "simulated: " if self.simulated else ""
        out = [f"{tag}{variant}: failed, no measurements ({why})" for variant, why in self.failed.items()]
        return out + [f"{tag}{n}" for n in self.notes] + ([f"{tag}{self.nothing}"] if self.nothing else [])

    def comparison_lines(self) -> list[str]:
        return [c.line for cv in self.per_concurrency for c in cv.comparisons]

    def diagnostic_lines(self) -> list[str]:
        return [line for cv in self.per_concurrency for line in cv.diagnostics]

    def lines(self) -> list[str]:
        """Everything the verdict says: each level's comparisons, decision and diagnostics, then the
        run's own lines."""
        return [line for cv in self.per_concurrency for line in cv.lines] + self.run_lines()


MORE_STARTS_SHOWN = 100
"""Past this an estimate of the starts still needed is said as 'more than 100': a figure like
1,064,677 (from two starts that disagree) is not a plan anyone runs."""


def _pct(x: float) -> str:
    return percent(x, "{:+.1f}" if abs(x) < 10 else "{:+.0f}")


def _mag(x: float) -> str:
    """A magnitude in percent, without a sign: "29%", "4.4%"."""
    x = abs(x)
    # near 0 two decimals, so a decided interval's edge never reads as "0.0%"
    return percent(x, "{:.2f}" if x < 0.1 else "{:.1f}" if x < 10 else "{:.0f}")


def _change(e: RatioEstimate, up: str, down: str) -> tuple[str, str]:
    """("29% slower", "19%..37%"): the magnitude of a decided change and its interval."""
    if e.ratio >= 1:
        return f"{_mag(e.pct)} {up}", f"{_mag(e.pct_lo)}..{_mag(e.pct_hi)}"
    return f"{_mag(e.pct)} {down}", f"{_mag(-e.pct_hi)}..{_mag(-e.pct_lo)}"


def rests_on(e: RatioEstimate) -> str:
    """What an equivalence claim rests on: the starts an arm had. A slow start that comes one time
    in ten goes unseen in 3 starts 73% of the time (0.9 ** 3), and the starts seen then agree."""
    n = min(e.n_starts_variant, e.n_starts_baseline)
    unseen = 0.9 ** n
    return (f"rests on {plural(n, 'start')} an arm: a start 1 time in 10 unlike these would go unseen in "
            f"{plural(n, 'start')} {unseen:.0%} of the time")


def _counts(e: RatioEstimate) -> str:
    def arm(s: int, t: int) -> str:
        return (f"{plural(s, 'start')} x {plural(t // s, 'trial')}" if s and t % s == 0
                else f"{plural(s, 'start')}, {plural(t, 'trial')}")

    v = arm(e.n_starts_variant, e.n_trials_variant)
    b = arm(e.n_starts_baseline, e.n_trials_baseline)
    return v if v == b else f"{v} vs baseline {b}"


def _adjustments(family: int, sequential: bool) -> str:
    adj = []
    if family > 1:
        adj.append(f"Hochberg over {family}")
    if sequential:
        adj.append("sequential-adjusted")
    return "".join(f", {a}" for a in adj)


Cells = Mapping[tuple[str, Level], Sequence[Sequence[float]]]
Rounds = Mapping[tuple[str, Level], Sequence[int]]


def one_look_levels(starts: int) -> Callable[[float], float] | None:
    """A single look at `starts` starts per arm (`sequential = false`): Welch's t there is tested at
    the level that holds its error with one arm 4x noisier (`nominal_levels` with one look), never
    above the share itself (where Welch is conservative anyway the interval stays the one it says)."""
    if starts < 2:
        return None
    from truthput.analyze.stopping import nominal_levels

    return lambda share: min(share, nominal_levels(starts, starts, round(share, 12), "linear")[0])


def make_verdict(
    cells: Cells,
    baseline: str,
    failed: Mapping[str, str] | None = None,
    guard: Mapping[str, GuardResult] | None = None,
    confidence: float = 0.95,
    simulated: bool = False,
    stopping_rule: StoppingRule | None = None,
    look: int | None = None,
    expected_divergence: Collection[str] = (),
    min_effect: float = 0.02,
    rounds: Rounds | None = None,
    metrics: Mapping[str, tuple[Cells, Rounds | None]] | None = None,
    decide_throughput: bool = True,
) -> Verdict:
    """Build the verdict from per-cell per-start values.

    ``cells[(variant, level)]`` = per-start lists of trial tok/s; ``rounds`` the round of
    each of those starts (for pairing in time); ``metrics`` more verdict metrics, each with its
    own cells and rounds; ``decide_throughput=False`` leaves tok/s out of the family (an open loop
    at a set rate, where tok/s follows the offered rate). ``failed`` maps a variant to why it produced nothing.
    ``guard[variant]`` is that variant's output comparison with the baseline. With
    ``stopping_rule`` the family's error is the look's share (the look = ``look`` or the largest
    number of starts in any cell), so ``confidence`` is then the rule's 1 - alpha.
    ``expected_divergence`` names variants allowed to change outputs.
    """
    failed = dict(failed or {})
    guard = dict(guard or {})
    tag = "simulated: " if simulated else ""
    nominal: Callable[[float], float] | None
    if stopping_rule is not None:
        confidence = 1.0 - stopping_rule.alpha
        min_effect = stopping_rule.min_effect
        if look is None:
            look = max((len(clean_starts(d)) for d in cells.values()), default=0)
        alpha = stopping_rule.alpha
        nominal = stopping_rule.nominal(look)
    else:
        alpha = 1.0 - confidence
        nominal = one_look_levels(max((len(clean_starts(d)) for d in cells.values()), default=0))
    by_metric: dict[str, tuple[Cells, Rounds | None]] = {
        **({"tok/s": (cells, rounds)} if decide_throughput else {}), **dict(metrics or {})}
    raw, groups, notes = _estimates(by_metric, baseline, failed)
    if stopping_rule is not None and look is not None:
        rule = stopping_rule

        def raw_at(j: int) -> dict[ComparisonKey, RatioEstimate]:
            return _estimates(_up_to_round(by_metric, j), baseline, failed)[0]

        decisions = rule.decide_looks(raw_at, look, raw)
    else:
        decisions = decide_family(raw, alpha, min_effect, nominal=nominal) if raw else {}
    family = sum(1 for d in decisions.values() if d.step is not None)
    out: list[ConcurrencyVerdict] = []
    sequential = stopping_rule is not None
    for mkey, conc, group, others, noise_note in groups:
        spec = metric(mkey)
        comps = [_comparison(decisions[ComparisonKey(mkey, conc, v)], v, baseline, conc, spec, guard,
                             expected_divergence, confidence, family, sequential, min_effect, tag)
                 for v in others]
        if stopping_rule is not None and look is not None:
            for c in comps:
                if c.outcome == "not decided" and stopping_rule.beyond_reach(c.estimate, look,
                                                                             stopping_rule.alpha / max(family, 1)):
                    c.beyond_reach_at = stopping_rule.max_starts
        out.append(_level_verdict(mkey, conc, group, comps, baseline, noise_note, confidence, tag))
    return Verdict(per_concurrency=out, failed=failed, method_notes=_method_notes(family, min_effect, stopping_rule, look,
                                                                              simulated),
                   simulated=simulated, confidence=confidence, notes=notes, family=family,
                   nothing=None if raw else _why_nothing(by_metric, baseline, failed))


def _why_nothing(by_metric: Mapping[str, tuple[Cells, Rounds | None]], baseline: str, failed: Mapping[str, str]) -> str:
    """One sentence: why a run compared nothing."""
    measured = {v for mcells, _r in by_metric.values() for (v, _c), data in mcells.items() if _positive(data)}
    named = {v for mcells, _r in by_metric.values() for (v, _c) in mcells} | set(failed)
    if not named:
        return "nothing decided: no start of any variant has a measured figure"
    if baseline in failed:
        return f"nothing decided: the baseline {baseline} failed, so no variant has anything to be compared with"
    if baseline not in measured:
        return f"nothing decided: the baseline {baseline} has no measured figure"
    if len(named) == 1:
        return f"nothing compared: one variant ({baseline}) was measured; add a [[variant]] that changes a flag to compare"
    return "nothing decided: no variant other than the baseline has a measured figure"


def _up_to_round(by_metric: Mapping[str, tuple[Cells, Rounds | None]], look: int,
                 ) -> dict[str, tuple[Cells, Rounds | None]]:
    """The values as they stood at ``look``: the starts of rounds 0..look-1 (by their round where
    known, else the first ``look`` starts of each cell)."""
    out: dict[str, tuple[Cells, Rounds | None]] = {}
    for mkey, (mcells, mrounds) in by_metric.items():
        if mrounds is None:
            out[mkey] = ({k: list(v)[:look] for k, v in mcells.items()}, None)
            continue
        cut: dict[Any, list[Sequence[float]]] = {}
        cut_rounds: dict[tuple[str, Level], list[int]] = {}
        for k, v in mcells.items():
            rs = list(mrounds.get(k, range(len(v))))
            keep = [i for i, r in enumerate(rs) if r < look]
            cut[k] = [v[i] for i in keep]
            cut_rounds[k] = [rs[i] for i in keep]
        out[mkey] = (cut, cut_rounds)
    return out


Group = tuple[str, Level, dict[str, Sequence[Sequence[float]]], list[str], str]
"""(metric, level, variant -> per-start values, the variants compared with the baseline, noise note)."""


def _estimates(by_metric: Mapping[str, tuple[Cells, Rounds | None]], baseline: str, failed: Mapping[str, str],
               ) -> tuple[dict[ComparisonKey, RatioEstimate], list[Group], list[str]]:
    """Every comparison's ratio estimate (each level's arms sharing one noise model), the groups
    compared, and notes on cells left out (a zero figure, no baseline)."""
    notes: list[str] = []
    raw: dict[ComparisonKey, RatioEstimate] = {}
    groups: list[Group] = []
    for mkey, (mcells, mrounds) in by_metric.items():
        by_conc: dict[Level, dict[str, Sequence[Sequence[float]]]] = {}
        zeros: dict[Level, dict[str, Sequence[Sequence[float]]]] = {}
        for (variant, conc), data in mcells.items():
            if _positive(data):
                by_conc.setdefault(conc, {})[variant] = data
            elif any(x == 0 for s in data for x in s):
                zeros.setdefault(conc, {})[variant] = data
        for conc, group in zeros.items():
            notes.extend(_zero_notes(metric(mkey), conc, group, by_conc.get(conc, {}), baseline))
        for conc in sorted(by_conc):
            group = by_conc[conc]
            if baseline not in group:
                if mkey == "tok/s":
                    notes.append(f"{level_label(conc)}: baseline {baseline} has no measurements; no comparison possible")
                continue
            others = sorted(v for v in group if v != baseline and v not in failed)
            names = [baseline, *others]
            rr = None
            if mrounds is not None and all((n, conc) in mrounds for n in names):
                rr = [list(mrounds[(n, conc)]) for n in names]
            noise = shared_noise([group[n] for n in names], rounds=rr)  # diagnostics for the method section
            for v in others:
                raw[ComparisonKey(mkey, conc, v)] = ratio_estimate(group[v], group[baseline], calibrated=True)
            groups.append((mkey, conc, group, others, noise.note if noise.df or noise.paired else ""))
    return raw, groups, notes


def _level_verdict(mkey: str, conc: Level, group: dict[str, Sequence[Sequence[float]]],
                   comps: list[ComparisonVerdict], baseline: str, noise_note: str, confidence: float,
                   tag: str) -> ConcurrencyVerdict:
    """One level's decision lines: its comparisons, the winner (tok/s: best of the faster, and
    head-to-head better than every other faster one), the baseline's noise."""
    spec = metric(mkey)
    decision: list[str] = []
    diagnostics: list[str] = []
    winner = None
    base_mean = None
    if mkey == "tok/s":
        base_est = cell_estimate(group[baseline], confidence=confidence)
        base_mean = base_est.mean
        qualifiers = [c for c in comps if c.outcome == "faster" and not c.vetoed]
        if qualifiers:
            best = max(qualifiers, key=lambda c: c.estimate.ratio)
            rivals = [c for c in qualifiers if c is not best]
            # Head-to-head: best must beat every other qualifier at its own decision level.
            if all(ratio_estimate(group[best.variant], group[c.variant], confidence=best.estimate.level).significant
                   for c in rivals):
                winner = best.variant
                decision.append(f"{tag}{level_label(conc)}: winner {winner} "
                                f"({_change(best.estimate, 'faster', 'slower')[0]} than {baseline})")
            else:
                beat = ", ".join(c.variant for c in qualifiers)
                decision.append(
                    f"{tag}{level_label(conc)}: {beat} all beat {baseline}; their intervals overlap, so no single winner")
        elif comps:
            open_ = [c for c in comps if not c.decided]
            slower = [c.variant for c in comps if c.outcome == "slower"]
            same = [c.variant for c in comps if c.outcome == "equivalent"]
            vetoed = [c.variant for c in comps if c.outcome == "faster" and c.vetoed]
            decision.append(f"{tag}{level_label(conc)}: no winner: {baseline} stays"
                            + (f"; decided slower: {', '.join(slower)}" if slower else "")
                            + (f"; equivalent: {', '.join(same)}" if same else "")
                            + (f"; faster but its outputs differ: {', '.join(vetoed)}" if vetoed else "")
                            + (f"; not decided: {', '.join(_starts_to_go(c) for c in open_)}" if open_ else ""))
        if base_est.noisy and base_est.warning:
            diagnostics.append(f"{tag}{level_label(conc)}: {baseline} is noisy: {base_est.warning}")
    if comps and noise_note:
        where = level_label(conc) if mkey == "tok/s" else f"{level_label(conc)} {spec.label}"
        diagnostics.append(f"{tag}{where}: noise: {noise_note}")
    return ConcurrencyVerdict(level=conc, baseline=baseline, baseline_mean=base_mean,
                              comparisons=comps, winner=winner, metric=mkey, noise=noise_note,
                              decision=decision, diagnostics=diagnostics)


def _starts_to_go(c: ComparisonVerdict) -> str:
    """'spec1 (about 12 more starts per arm)' from the comparison's own estimate."""
    if c.futile:
        return f"{c.variant} (beyond reach of the planned starts)"
    if c.more_starts is None:
        return c.variant
    return f"{c.variant} ({_more_starts(c.more_starts)})"


def _more_starts(n: int) -> str:
    """'about 12 more starts per arm', or 'more than 100 more starts per arm' past reading."""
    if n > MORE_STARTS_SHOWN:
        return f"more than {MORE_STARTS_SHOWN} more starts per arm"
    return f"about {n} more start{'s' if n != 1 else ''} per arm"


def _method_notes(family: int, min_effect: float, stopping_rule: StoppingRule | None, look: int | None,
                  simulated: bool) -> list[str]:
    method_notes = [
        "unit of replication: the server start; each start's trials are averaged (mean log value)",
        "ratio = exp(difference of mean per-start log values); Welch's t on the two arms' per-start values, read "
        "at a shaped df (between the smaller arm's starts - 1 and Welch's), each level calibrated for the worst "
        "ratio of the arms' SDs",
        f"the family: every comparison of the run ({family}), decided together with Hochberg's step-up procedure",
        "a winner must have its whole tok/s interval above 1 and identical greedy outputs (unless divergence is "
        "expected)",
        f"equivalent: the whole interval lies within +-{min_effect:.0%} (two one-sided tests at the same level)",
        "intervals of tok/s, latency and of ratios are on the log scale (geometric): never below zero",
    ]
    if stopping_rule is not None:
        method_notes.append(stopping_rule.describe() + f"; intervals reported at look {look}")
    if simulated:
        method_notes.insert(0, "SIMULATED: every figure comes from the simulator, not a real server")
    return method_notes


def _zero_notes(spec: Any, level: Level, zeroed: Mapping[str, Sequence[Sequence[float]]],
                measured: Mapping[str, Sequence[Sequence[float]]], baseline: str) -> list[str]:
    """Cells with a zero (goodput when no request met the SLOs): no ratio exists on the log scale,
    so say what was seen instead of leaving the comparison out without a word."""
    out = []
    for v, data in zeroed.items():
        vals = [x for s in data for x in s]
        n0 = sum(1 for x in vals if x == 0)
        head = f"{level_label(level)}: {v}'s {spec.label}"
        base = measured.get(baseline)
        if n0 == len(vals) and base is not None and v != baseline:
            bvals = [x for s in base for x in s]
            word = spec.down if spec.higher_is_better else spec.up
            out.append(f"{head} is 0 in all {plural(len(vals), 'trial')}, {baseline}'s above 0 in every start (mean "
                       f"{sum(bvals) / len(bvals):.3g}): {word} than {baseline}'s, with no interval (a ratio to zero "
                       "has none)")
        else:
            out.append(f"{head} is 0 in {n0} of {len(vals)} trials: not compared (a ratio to zero has no interval "
                       "on the log scale)")
    return out


def _positive(data: Sequence[Sequence[float]]) -> bool:
    """Whether a cell can enter a ratio: some start with values, all positive and finite."""
    vals = [x for s in data for x in s]
    return bool(vals) and all(math.isfinite(x) and x > 0 for x in vals)


def _comparison(d: Decision, v: str, baseline: str, conc: Level, spec: Any, guard: Mapping[str, GuardResult],
                expected_divergence: Collection[str], confidence: float, family: int, sequential: bool,
                min_effect: float, tag: str) -> ComparisonVerdict:
    est = d.estimate
    g = guard.get(v)
    diverges = g is not None and not g.identical
    expected = v in expected_divergence
    guard_txt = None if g is None else (g.verdict + (" (expected for this variant)" if diverges and expected else ""))
    adj = _adjustments(family, sequential)
    ci = f"{confidence:.0%} CI {_pct(est.pct_lo)}..{_pct(est.pct_hi)}{adj}"
    counts = _counts(est)
    head = f"{tag}{level_label(conc)}: "
    throughput = spec.key == "tok/s"
    subject = v if throughput else f"{v}'s {spec.label}"
    other = baseline if throughput else f"{baseline}'s"
    what = "" if throughput else f"{spec.label} "
    more = None
    better = None
    if d.kind == "undetermined":
        outcome = "undetermined"
        line = (f"{head}{what}{v} vs {baseline}: {_pct(est.pct)} but undetermined: one server start in an arm, "
                f"no between-start variance ({counts})")
    elif d.kind == "different":
        up = est.ratio > 1
        outcome = spec.up if up else spec.down
        better = up == spec.higher_is_better
        change, interval = _change(est, spec.up, spec.down)
        line = f"{head}{subject} is {change} than {other} ({confidence:.0%} CI {interval}{adj}, {counts})"
    elif d.kind == "equivalent":
        outcome = "equivalent"
        real = "; a change this small is real but inside the margin" if est.significant else ""
        line = (f"{head}{subject} is equivalent to {other} within +-{min_effect:.0%} ({_pct(est.pct)}, {ci}, "
                f"{counts}){real}; {rests_on(est)}")
    else:
        outcome = "not decided"
        more = more_starts_to_decide(est, min_effect)
        if more is not None and more > MORE_STARTS_SHOWN:
            why = f"; {_more_starts(more)} would be needed to decide it"
        elif more is not None:
            why = f"; {_more_starts(more)} would likely decide it"
        else:
            why = ""
        line = f"{head}{what}{v} vs {baseline}: not decided ({_pct(est.pct)}, {ci}, {counts}){why}"
    return ComparisonVerdict(v, outcome, est, guard_txt, diverges and not expected, line, baseline=baseline,
                             level_label=level_label(conc), more_starts=more, metric=spec.key, step=d.step,
                             better=better)
