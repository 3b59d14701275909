"""Check users' claims against a run's measurements and against physics.

Verdicts:
- impossible: physics forbids it (a speculative gain above (k+1)x per step, i.e. +100% for k = 1;
  a throughput above a given roofline ceiling);
- contradicted: the run's counter disagrees beyond noise (the likely cause is named: words
  undercount tokens, a log line's peak is not a window mean, drafts are not output, ...), or the
  claim's own physics disagrees with it (a "wall" far below the weight-streaming ceiling);
- plausible: consistent with the measurement (or at least with every bound when there is none);
- untestable: nothing in the run or the bounds speaks to it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import mean
from collections.abc import Sequence
from typing import Any

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass as pydantic_dataclass

import math

from truthput.analyze.cells import TrialLike, build_cells, source_label
from truthput.experiment.claims import Claim
from truthput.experiment.levels import Level, level_value

NOISE_FLOOR_PCT = 3.0  # below this a difference vs the counter is noise even with one trial
WORDS_PER_TOKEN = 0.75  # English prose, typical BPE tokenizers

METHOD_ROWS = {
    "counter": ("counter (window)",),
    "usage": ("usage placed in time (window)", "usage whole trial"),
    "words": ("whitespace words (window)", "word probe per request"),
    "log_line": ("log line mean (window)", "log line peak (window)", "log line peak (trial)"),
}

CAUSE_TEXT = {
    "words": "words are not tokens: whitespace words undercount tokens (~0.75 words/token in English), "
             "and a per-request word probe divides by each request's active time, not the wall-clock window",
    "log_line": "a log line covers the engine's own interval (a peak or a ramp), not the timed window",
    "usage": "usage placed in time over a different window (ramp-up, drain)",
    "counter": "a counter delta over a different window or configuration",
}


@pydantic_dataclass(config=ConfigDict(extra="forbid"))
class ClaimResult:
    """What a claim was checked against and the verdict; the report document holds it as it is."""

    text: str
    verdict: str  # plausible | contradicted | impossible | untestable
    reason: str
    claimed: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] | None = None
    bound: dict[str, Any] | None = None
    likely_cause: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Cell:
    """Pooled trials of one variant x load level."""

    variant: str
    concurrency: Level
    """Streams; a `Rate` for an open loop (never equal to a claim's concurrency)."""
    spec_tokens: int
    counter: float | None
    """The cell's headline tok/s: the mean of its server starts' means, as the verdict's."""
    counter_cv_pct: float
    """Start-to-start spread (within a start's trials where there is one start), in %."""
    source: str
    """Where the headline came from (the server counter, or usage where no counter was read)."""
    methods: dict[str, float]
    mean_acceptance_length: float | None
    simulated: bool


def _cells(measurements: Sequence[TrialLike] | None, simulated: bool) -> list[_Cell]:
    cells = []
    for cell in build_cells(measurements or []):
        trials = [t.results for t in cell.trials if t.status == "ok" and t.results.methods]
        if not trials:
            continue
        spec = trials[0].speculative or {}
        k = int(spec.get("num_speculative_tokens") or 0)
        methods: dict[str, list[float]] = {}
        for t in trials:
            for r in t.methods:
                if r.tokps is not None:
                    methods.setdefault(r.method, []).append(r.tokps)
        mal = []
        for t in trials:
            w = t.spec_decode.window if t.spec_decode is not None else None
            v = w.mean_acceptance_length.number() if w is not None and w.mean_acceptance_length is not None else None
            if v:
                mal.append(v)
        est = cell.estimate
        spread = est.cv_between if est is not None and math.isfinite(est.cv_between) else \
            est.cv_within if est is not None and math.isfinite(est.cv_within) else 0.0
        cells.append(_Cell(cell.variant, cell.level, k, est.mean if est is not None else None, spread * 100,
                           cell.source, {m: mean(v) for m, v in methods.items()}, mean(mal) if mal else None,
                           simulated))
    return cells


def _match(cells: list[_Cell], variant: str | None, concurrency: int | None, spec_tokens: int | None) -> list[_Cell]:
    return [c for c in cells
            if (variant is None or c.variant == variant)
            and (concurrency is None or c.concurrency == concurrency)
            and (spec_tokens is None or c.spec_tokens == spec_tokens)]


def _ceiling(bounds: dict[str, Any], concurrency: int | None) -> float | None:
    """A roofline ceiling (tok/s, no speculation) for a concurrency from `bounds['ceiling_tps']`."""
    ceil = (bounds or {}).get("ceiling_tps")
    if ceil is None:
        return None
    if isinstance(ceil, (int, float)):
        return float(ceil)
    if concurrency is None:
        return None
    v = ceil.get(concurrency, ceil.get(str(concurrency)))
    return float(v) if v is not None else None


def _pct(a: float | None, b: float | None) -> float:
    """(a - b) / b in percent; callers have checked that both figures exist."""
    assert a is not None and b is not None
    return (a - b) / b * 100.0


def _tag(cell: _Cell) -> str:
    return " (SIMULATED run)" if cell.simulated else ""


def _source(cell: _Cell) -> str:
    """The headline's source as the claim results name it, e.g. `server_counter (SIMULATED run)`."""
    return cell.source + _tag(cell)


def _check_speedup(claim: Claim, cells: list[_Cell]) -> ClaimResult:
    cond = claim.conditions
    gain_pct = claim.figure.value if claim.figure.unit == "%" else (claim.figure.value - 1.0) * 100.0
    claimed = {"gain_pct": gain_pct, "spec_tokens": cond.spec_tokens, "baseline_spec_tokens": cond.baseline_spec_tokens}
    k = cond.spec_tokens
    base_k = cond.baseline_spec_tokens or 0
    if k is not None and base_k == 0:
        max_gain = k * 100.0
        bound: dict[str, Any] | None = {
            "max_gain_pct": max_gain, "source": "model",
            "rule": f"k = {k}: a step emits at most k+1 = {k + 1} tokens and costs at least a plain step, so the "
                    "gain over no speculation is at most (k+1)x"}
        if gain_pct > max_gain + 1e-9:
            return ClaimResult(claim.text, "impossible",
                               f"+{gain_pct:g}% exceeds the physical bound of +{max_gain:g}% for {k} speculative "
                               f"token(s) (at most {k + 1} tokens per step, each step at least as slow as without "
                               "speculation): the baseline or the variant was measured differently "
                               "(e.g. different window or counting method)",
                               claimed, None, bound, "window")
    else:
        bound = None
    variant = _match(cells, cond.variant, cond.concurrency, k)
    base = _match(cells, cond.baseline, cond.concurrency, base_k if cond.baseline is None else None)
    if variant and base and variant[0].counter and base[0].counter:
        v, b = variant[0], base[0]
        measured_gain = _pct(v.counter, b.counter)
        noise = max(NOISE_FLOOR_PCT, 2 * (v.counter_cv_pct + b.counter_cv_pct))
        measured = {"gain_pct": measured_gain, "variant": v.variant, "baseline": b.variant,
                    "variant_tps": v.counter, "baseline_tps": b.counter, "source": _source(v)}
        if abs(measured_gain - gain_pct) <= noise:
            return ClaimResult(claim.text, "plausible", f"measured {measured_gain:+.1f}% ({source_label(v.source)}){_tag(v)}",
                               claimed, measured, bound)
        return _from_run(ClaimResult(claim.text, "contradicted",
                                     f"claimed {gain_pct:+.1f}% but the counters give {measured_gain:+.1f}% "
                                     f"({v.variant} {v.counter:.1f} vs {b.variant} {b.counter:.1f} tok/s){_tag(v)}",
                                     claimed, measured, bound, "window"), v)
    if bound:
        return ClaimResult(claim.text, "plausible" if gain_pct <= bound["max_gain_pct"] else "impossible",
                           f"within the physical bound of +{bound['max_gain_pct']:g}%; no run to compare with",
                           claimed, None, bound)
    return ClaimResult(claim.text, "untestable", "no spec_tokens given and no matching variants in the run", claimed)


def _physics_ceiling(claim: Claim, bounds: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    cond = claim.conditions
    k = cond.spec_tokens or 0
    if cond.weights_gb and cond.bandwidth_tb_s and cond.concurrency:
        steps = cond.bandwidth_tb_s * 1000.0 / cond.weights_gb
        ceil = steps * cond.concurrency
        return ceil, {"ceiling_tps_no_spec": ceil, "ceiling_tps": ceil * (k + 1), "steps_per_s": steps,
                      "rule": f"{cond.bandwidth_tb_s:g} TB/s / {cond.weights_gb:g} GB = {steps:.1f} weight passes/s; "
                              f"x {cond.concurrency} streams = {ceil:.0f} tok/s without speculation"
                              + (f", up to x{k + 1} with k = {k}" if k else ""),
                      "source": "model"}
    c = _ceiling(bounds, cond.concurrency)
    if c is None:
        return None, None
    return c, {"ceiling_tps_no_spec": c, "ceiling_tps": c * (k + 1), "rule": "given roofline ceiling", "source": "model"}


def _check_ceiling(claim: Claim, cells: list[_Cell], bounds: dict[str, Any]) -> ClaimResult:
    cond = claim.conditions
    value = claim.figure.value
    claimed = {"ceiling_tps": value, "concurrency": cond.concurrency}
    phys, bound = _physics_ceiling(claim, bounds)
    matches = _match(cells, cond.variant, cond.concurrency, cond.spec_tokens)
    measured = None
    if matches and matches[0].counter:
        m = matches[0]
        measured = {"tps": m.counter, "variant": m.variant, "source": _source(m)}
        if (m.counter or 0.0) > value * (1 + NOISE_FLOOR_PCT / 100):
            return _from_run(ClaimResult(claim.text, "contradicted",
                                         f"the run measured {m.counter:.1f} tok/s, above the claimed wall of "
                                         f"{value:g}{_tag(m)}", claimed, measured, bound), m)
    if phys is not None:
        if value > bound["ceiling_tps"] * (1 + 1e-9):  # type: ignore[index]
            return ClaimResult(claim.text, "impossible",
                               f"{value:g} tok/s is above the physical ceiling {bound['ceiling_tps']:.0f} tok/s "  # type: ignore[index]
                               f"({bound['rule']})", claimed, measured, bound)  # type: ignore[index]
        share = value / phys * 100
        if share < 70:
            return ClaimResult(claim.text, "contradicted",
                               f"not the bandwidth wall: weight streaming allows {phys:.0f} tok/s ({bound['rule']}); "  # type: ignore[index]
                               f"{value:g} is {share:.0f}% of it, so something else binds (all-reduce latency over "
                               "PCIe, kernel efficiency, CPU overhead)",
                               claimed, measured, bound, "definition")
        return ClaimResult(claim.text, "plausible", f"{share:.0f}% of the weight-streaming ceiling {phys:.0f} tok/s",
                           claimed, measured, bound)
    if measured:
        return ClaimResult(claim.text, "plausible", "the run did not exceed it; no physics given to test the 'wall'",
                           claimed, measured)
    return ClaimResult(claim.text, "untestable", "no ceiling (roofline or weights_gb/bandwidth_tb_s) and no run",
                       claimed)


def _check_log_overcount(claim: Claim, cells: list[_Cell]) -> ClaimResult:
    k = claim.conditions.spec_tokens
    claimed = {"log_line_tps": claim.figure.value, "spec_tokens": k}
    why = ("vLLM's 'Avg generation throughput' is fed by the same per-step count of emitted tokens as "
           "vllm:generation_tokens_total; it differs from a counter delta only by its interval")
    if k == 1:
        why += ("; with k = 1 every draft is one token, so emitted = drafts + accepted + undrafted steps "
                "~= drafted + accepted: the sum matching the log line is what a CORRECT log line shows")
    matches = [c for c in _match(cells, claim.conditions.variant, claim.conditions.concurrency, k)
               if c.counter and "log line mean (window)" in c.methods]
    measured = None
    closer_to_counter = None
    if matches:
        m = matches[0]
        log = m.methods["log line mean (window)"]
        da = m.methods.get("drafted + accepted (counters)")
        measured = {"log_line_mean_tps": log, "counter_tps": m.counter, "error_pct": _pct(log, m.counter),
                    "drafted_plus_accepted_tps": da, "source": "log_line vs server_counter" + _tag(m)}
        if da is not None and m.counter is not None:
            closer_to_counter = abs(log - m.counter) <= abs(log - da)
            measured["error_pct_vs_drafted_plus_accepted"] = _pct(log, da)
    if k == 1:
        # drafted + accepted ~= emitted is an identity at k = 1: no measurement can tell them apart
        return ClaimResult(claim.text, "contradicted", why + " (an identity: the evidence cannot show an over-count)",
                           claimed, measured, {"identity": "emitted = drafts + accepted + undrafted", "source": "model"},
                           "definition")
    if closer_to_counter is not None and measured is not None:
        if closer_to_counter:
            return _from_run(ClaimResult(
                claim.text, "contradicted",
                f"in this run (k = {k}) the log line's window mean is {measured['error_pct']:+.1f}% from the counter "
                f"and {measured['error_pct_vs_drafted_plus_accepted']:+.1f}% from drafted + accepted: " + why,
                claimed, measured, None, "definition"), matches[0])
        return ClaimResult(claim.text, "plausible", "the log line is closer to drafted + accepted than to the counter here",
                           claimed, measured)
    return ClaimResult(claim.text, "untestable", "no run with spec-decode counters and log lines to compare", claimed)


def _check_throughput(claim: Claim, cells: list[_Cell], bounds: dict[str, Any]) -> ClaimResult:
    cond = claim.conditions
    value = claim.figure.value
    claimed = {"tps": value, "method": claim.method, "concurrency": cond.concurrency, "stat": cond.stat}
    phys, bound = _physics_ceiling(claim, bounds)
    if bound and claim.method in ("counter", "usage") and value > bound["ceiling_tps"] * (1 + 1e-9):
        return ClaimResult(claim.text, "impossible",
                           f"{value:g} tok/s of output is above the physical ceiling {bound['ceiling_tps']:.0f} tok/s",
                           claimed, None, bound)
    matches = _match(cells, cond.variant, cond.concurrency, cond.spec_tokens)
    matches = [m for m in matches if m.counter]
    if not matches:
        if claim.method not in ("counter", "usage"):
            return ClaimResult(claim.text, "untestable",
                               f"no matching run to compare with; note: {CAUSE_TEXT.get(claim.method, 'method unknown')}",
                               claimed, None, bound, {"words": "unit", "log_line": "window"}.get(claim.method))
        if bound:
            return ClaimResult(claim.text, "plausible" if value <= bound["ceiling_tps"] else "untestable",
                               f"below the physical ceiling {bound['ceiling_tps']:.0f} tok/s; no run to compare with",
                               claimed, None, bound)
        return ClaimResult(claim.text, "untestable", "no matching variant x concurrency in the run and no bounds",
                           claimed)
    m = matches[0]
    err = _pct(value, m.counter)
    noise = max(NOISE_FLOOR_PCT, 2 * m.counter_cv_pct)
    measured = {"counter_tps": m.counter, "variant": m.variant, "concurrency": level_value(m.concurrency),
                "error_pct_vs_counter": err, "noise_pct": noise, "source": _source(m)}
    if abs(err) <= noise:
        return ClaimResult(claim.text, "plausible",
                           f"{value:g} vs {source_label(m.source)} {m.counter:.1f} tok/s ({err:+.1f}%, within noise {noise:.1f}%){_tag(m)}",
                           claimed, measured, bound)
    cause_text = CAUSE_TEXT.get(claim.method, "")
    likely = {"words": "unit", "log_line": "window", "usage": "window", "counter": "window"}.get(claim.method)
    if claim.method == "unknown":
        # no method named: the run's figure closest to the claim suggests how it was counted
        closest = min(m.methods.items(), key=lambda kv: abs(kv[1] - value), default=None)
        if closest is not None:
            likely = closest[0]
            cause_text = f"closest to this run's '{closest[0]}' figure ({closest[1]:.1f} tok/s)"
    else:
        # the claim is set beside the run's own figure by the method it names, nothing else
        rows = [r for r in METHOD_ROWS.get(claim.method, ()) if r in m.methods]
        if cond.stat == "peak":
            rows = [r for r in rows if "peak" in r] or rows
        named = [f"'{r}' {m.methods[r]:.1f}" for r in rows]
        if named:
            cause_text += f"; this run's figures by that method: {', '.join(named)} tok/s"
    if claim.method == "words":
        cause_text += f" (words x 1/{WORDS_PER_TOKEN:g} = {value / WORDS_PER_TOKEN:.1f} token-equivalent)"
    if cond.stat == "peak":
        cause_text += "; a peak is not a mean over a window"
    return _from_run(ClaimResult(claim.text, "contradicted",
                                 f"{value:g} vs {source_label(m.source)} {m.counter:.1f} tok/s ({err:+.1f}%, beyond noise "
                                 f"{noise:.1f}%){_tag(m)}: " + cause_text, claimed, measured, bound, likely), m)


def _from_run(result: ClaimResult, cell: _Cell) -> ClaimResult:
    """A contradiction drawn from a run's figures. A simulated run shows what the model predicts;
    it cannot contradict a measurement, so there the claim is "untestable" and the reason is kept as
    the model's prediction (contradictions by physics alone do not come through here)."""
    if result.verdict != "contradicted" or not cell.simulated:
        return result
    return ClaimResult(result.text, "untestable",
                       "a simulated run cannot contradict a measurement; the simulator predicts: " + result.reason,
                       result.claimed, result.measured, result.bound, result.likely_cause)


def check_claims(claims: list[Claim], measurements: Sequence[TrialLike] | None = None,
                 physical_bounds: dict[str, Any] | None = None, simulated: bool = False) -> list[ClaimResult]:
    """One ClaimResult per claim. `measurements`: stored trials (Store.trial_results);
    `physical_bounds`: {"ceiling_tps": float | {concurrency: tok/s}} (roofline,
    no speculation)."""
    cells = _cells(measurements, simulated)
    bounds = physical_bounds or {}
    out = []
    for claim in claims:
        kind = claim.conditions.kind
        if kind == "speedup":
            out.append(_check_speedup(claim, cells))
        elif kind == "ceiling":
            out.append(_check_ceiling(claim, cells, bounds))
        elif kind == "log_overcount":
            out.append(_check_log_overcount(claim, cells))
        else:
            out.append(_check_throughput(claim, cells, bounds))
    return out
