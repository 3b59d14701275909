"""Calibrate the physics model's efficiency knobs to measured throughput.

The physics model (truthput.hardware.physics) has a few constants no datasheet gives: achieved
bandwidth and FLOP fractions, a fixed per-step overhead, and the per-collective TP latency. Given
measured tok/s (from server counters) at a few configurations, fit() finds the constants by least
squares on log tok/s, with uncertainties, and predict() turns them into tok/s with a band.

Only constants the data can identify are fitted: fewer points than constants, no TP > 1 point for
the TP latency, or a flat direction in the Jacobian drop a constant (kept at its prior) and say so;
a constant that is fitted but not pinned to 5% (95% band) is reported as weakly identified.
The profile JSON written by save_profile() is what the simulator reads with --sim-profile; its
metadata keeps the covariance and each prediction with its band.

What a point's model figure is (model_tokps), one physics (decode_step, the simulator's pricer):
a measured closed-loop window is priced step by step from the steps it held (observed_steps
rebuilds them from the streamed chunks and the counter cut: decodes, prefills of requests that
started in the window, streams sitting out); a steady-state closed loop (input/output lengths,
for predictions) prices a request's cycle with its prefill; a bare point prices steady decode.
Points of one server start share that start's offset (fit(start_sigma=...)): generalized least
squares, so start-to-start noise is not read as physics.

Imports hardware/ only (sim/ layering rule). scipy is imported inside functions.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from truthput.errors import InputError
from truthput.hardware.gpus import GPU, get_gpu
from truthput.hardware.models import ModelProfile, get_model
from truthput.hardware.physics import Efficiency, decode_step, prior_efficiency

PROFILE_FORMAT = "truthput-sim-profile/1"
DEFAULT_FREE = ("step_overhead_s", "bw_frac", "flops_frac", "tp_latency_s")
# fitted in this order of preference when the data supports fewer constants than asked for:
# a fixed per-step time is what one point can pin down; bandwidth next; TP latency; compute last.
# Speculation's per-step cost comes before its per-sequence cost: points at one concurrency cannot
# tell them apart, and a per-step cost extrapolates to larger batches without multiplying an error.
PRIORITY = ("step_overhead_s", "bw_frac", "tp_latency_s", "flops_frac", "spec_step_s", "per_seq_overhead_s",
            "ngram_s_per_seq")
BOUNDS = {
    "bw_frac": (0.05, 1.0),
    "flops_frac": (0.01, 1.0),
    "step_overhead_s": (0.0, 1.0),
    "tp_latency_s": (0.0, 0.01),
    "per_seq_overhead_s": (0.0, 0.1),
    "ngram_s_per_seq": (0.0, 0.1),
    "spec_step_s": (0.0, 0.1),
}
ASSUMED_REL_NOISE = 0.05  # used for bands when no degrees of freedom are left to estimate noise
# How closely the window model reproduces a window's served tok/s when everything else is known:
# two 2 s pure-decode windows of one simulated start agree to 0.06-0.27% (client timing at the
# windows' edges; the per-step jitter averages out over ~150 steps). A few within-start points
# cannot estimate their scatter below that, so it is the floor of the point noise in start-effect
# fits. Why not higher: an overstated point noise lets the start-effect prior (sigma_u) pull each
# start's bandwidth toward the mean at the expense of the residuals, which biases the constants
# the within-start lever identifies (at 0.5% the TP latency came back 3% off with exact data).
WINDOW_MODEL_FLOOR = 0.0015
Z95 = 1.959963984540054


@dataclass(frozen=True)
class CalibrationPoint:
    """One measured configuration. context_tokens is the mean context per running stream;
    acceptance_length the measured mean acceptance length (needed when spec_k > 0)."""

    tp: int
    concurrency: int
    spec_k: int
    spec_method: str | None
    acceptance_length: float | None
    context_tokens: float
    measured_tokps: float | None = None
    kv_dtype_bytes: float = 2.0
    # Closed-loop trial (steady state): the workload's mean prompt and output lengths. With these
    # the model prices a request's whole cycle (prefill step, decode steps, the step a finished
    # stream sits out), not decode steps alone.
    input_tokens: float | None = None
    output_tokens: float | None = None
    # A measured window: the step shapes (decode seqs, their context tokens, prefill tokens) of
    # every engine step that ended inside it, and the window time after the last of them.
    steps: tuple[tuple[int, float, float], ...] | None = None
    window_s: float | None = None
    tail_s: float = 0.0
    idle_s: float = 0.0
    # with a counter cut: how far the start scrape fell into the first step, the end scrape after
    # the last, and the shape of the step the end scrape fell in (client clock; clipped by the model)
    head_s: float | None = None
    following_step: tuple[int, float, float] | None = None
    label: str = ""
    group: str = ""  # the server start it was measured on: points of one start share its offset
    # CPU seconds the server's front end (the process serving HTTP: detokenising, streaming) used
    # in the window, measured from /proc; None where not measured (or a simulated server)
    front_cpu_s: float | None = None
    # draft tokens verified per sequence-step (server counters: draft tokens / (drafts + steps that
    # drafted nothing)); None: spec_k, every sequence drafting k every step. An n-gram proposer
    # drafts only where the text repeats, and often fewer than k: the rows a step verifies follow.
    draft_tokens_per_step: float | None = None

    def tokens_per_step(self) -> float:
        if self.spec_k <= 0:
            return 1.0
        if self.acceptance_length is None:
            raise InputError(f"calibration point tp={self.tp} concurrency={self.concurrency} spec_k={self.spec_k}: "
                            "acceptance_length is needed with speculation (1 + accepted/drafts from counters)")
        return self.acceptance_length


def _step_time(gpu: GPU, model: ModelProfile, point: CalibrationPoint, eff: Efficiency,
               decodes: float, context: float, prefill: float) -> float:
    """One engine step priced by the simulator's own physics (decode_step), nothing added."""
    return decode_step(gpu, model, point.tp, decodes, context, spec_k=point.spec_k if decodes else 0,
                       spec_method=point.spec_method if decodes else None,
                       kv_dtype_bytes=point.kv_dtype_bytes, prefill_tokens=prefill, eff=eff,
                       draft_tokens=_drafted(point, decodes)).total


def _drafted(point: CalibrationPoint, decodes: float) -> float | None:
    """Draft tokens a step of `decodes` sequences verifies, where the counters said (else None:
    k each)."""
    return None if point.draft_tokens_per_step is None else point.draft_tokens_per_step * decodes


_GROUPS: dict[int, dict] = {}


def _grouped(point: CalibrationPoint) -> dict[tuple[int, float], tuple[int, float]]:
    """Observed steps folded by (decode seqs, prefill tokens) into (count, mean context): the step
    time is linear in context on either side of the memory/compute kink, so this prices the sum
    exactly unless a group straddles the kink, and a fit evaluates a few shapes, not every step."""
    key = id(point.steps)
    cached = _GROUPS.get(key)
    if cached is not None and cached["steps"] is point.steps:
        return cached["groups"]
    sums: dict[tuple[int, float], list[float]] = {}
    for d, ctx, pf in point.steps or ():
        acc = sums.setdefault((d, pf), [0, 0.0])
        acc[0] += 1
        acc[1] += ctx
    groups = {k: (int(n), c / n) for k, (n, c) in sums.items()}
    if len(_GROUPS) > 4096:
        _GROUPS.clear()
    _GROUPS[key] = {"steps": point.steps, "groups": groups}
    return groups


def closed_loop_cycle(point: CalibrationPoint) -> tuple[float, float, float, float]:
    """Steady state of a closed loop with C desynchronised streams, per engine step on average:
    (decoding seqs, prefills, emitted tokens, share of steps that carry a prefill).

    A stream's request cycle: one step whose prefill emits the first token, (O-1)/E decode steps,
    and, when other streams keep the engine busy (C > 1), one step it sits out (its next request
    arrives while that step runs, and joins the one after). Requests that finish apart are prefilled
    apart, so each prefill rides in its own step while there are fewer prefills than steps.
    """
    c, o = point.concurrency, point.output_tokens
    if o is None:
        raise InputError("a closed loop's cycle needs the point's output_tokens")
    decode_steps = max(o - 1.0, 0.0) / point.tokens_per_step()
    cycle = decode_steps + 1.0 + (1.0 if c > 1 else 0.0)
    prefills = c / cycle
    return c * decode_steps / cycle, prefills, c * o / cycle, min(1.0, prefills)


def model_tokps(gpu: GPU, model: ModelProfile, point: CalibrationPoint, eff: Efficiency) -> float:
    """The output tok/s the physics model gives for what the point measured, with these constants.

    Three cases, one physics (decode_step, the simulator's pricer):
    - observed steps (a window from the store): the window's tokens over the priced steps that
      ended in it plus the measured tail after the last one;
    - input/output lengths: a closed loop's steady state (closed_loop_cycle), prefill included;
    - neither: steady decode of `concurrency` streams (a hand-given point).
    """
    if point.steps is not None and point.window_s and point.measured_tokps:
        tokens = point.measured_tokps * point.window_s
        busy = sum(n * _step_time(gpu, model, point, eff, d, ctx, pf) for (d, pf), (n, ctx) in _grouped(point).items())
        total = busy + point.idle_s
        if point.head_s is None:
            total += point.tail_s
        else:
            first = _step_time(gpu, model, point, eff, *point.steps[0]) if point.steps else 0.0
            total -= min(max(point.head_s, 0.0), first)
            after = (_step_time(gpu, model, point, eff, *point.following_step) if point.following_step
                     else point.tail_s)
            total += min(max(point.tail_s, 0.0), after)
        return tokens / total if total > 0 else 0.0
    if point.output_tokens is not None:
        decodes, prefills, emitted, share = closed_loop_cycle(point)
        inp = point.input_tokens or 0.0
        ctx = inp + point.output_tokens / 2.0
        t_plain = _step_time(gpu, model, point, eff, decodes, decodes * ctx, 0.0)
        t_prefill = _step_time(gpu, model, point, eff, decodes, decodes * ctx, inp * prefills / share)
        return emitted / ((1.0 - share) * t_plain + share * t_prefill)
    step = decode_step(gpu, model, point.tp, point.concurrency, point.concurrency * point.context_tokens,
                       spec_k=point.spec_k, spec_method=point.spec_method,
                       kv_dtype_bytes=point.kv_dtype_bytes, eff=eff,
                       draft_tokens=_drafted(point, point.concurrency))
    return point.concurrency * point.tokens_per_step() / step.total


def _step_timeline(requests: list[list[tuple[float, float, float, float]]],
                   ) -> tuple[list[float], list[tuple[int, list[tuple[float, float, float, float]]]]]:
    """The engine's step times, and each request's first step on them (`observed_steps`: requests
    in order of their first chunk, each where its chunk times best match the timeline so far)."""
    import bisect
    import statistics

    timeline: list[float] = []
    placed: list[tuple[int, list[tuple[float, float, float, float]]]] = []
    for req in requests:
        times = [c[0] for c in req]
        gaps = [b - a for a, b in zip(timeline[-64:], timeline[-63:])]
        typical = statistics.median(gaps) if gaps else 0.0
        if not timeline:
            s0 = 0
        else:
            lo = max(0, bisect.bisect_left(timeline, times[0] - 3 * typical) - 1)
            hi = min(len(timeline), bisect.bisect_right(timeline, times[0] + 3 * typical) + 1)
            best: tuple[float, int] | None = None
            for cand in range(lo, hi):
                dist = [abs(t - timeline[cand + j]) for j, t in enumerate(times) if cand + j < len(timeline)]
                score = statistics.median(dist)
                if best is None or score < best[0]:
                    best = (score, cand)
            if best is None or times[0] - timeline[-1] > 0.5 * typical:
                s0 = len(timeline) if best is None or best[0] > 0.5 * typical else best[1]
            else:
                s0 = best[1]
        timeline.extend(times[len(timeline) - s0:] if s0 + len(times) > len(timeline) else [])
        placed.append((s0, req))
    return timeline, placed


def observed_steps(chunks: Sequence[tuple[float, int, float, float, float]], window: tuple[float, float],
                   sent: dict[int, float] | None = None, counter_cut: tuple[float, float] | None = None,
                   ) -> tuple[list[tuple[int, float, float]], float, Any, float]:
    """Engine steps rebuilt from streamed chunks: (the steps of the window as (decode seqs, their
    context tokens, prefill tokens), tokens they emitted, window time not covered by them (may be
    negative), idle time among them).

    Which steps are the window's: with counter_cut = (emitted-token counter at the window's start
    and end scrapes, minus its value before the trial's first request), exactly the steps whose
    tokens the counter delta holds: cut by cumulative tokens in step order, the server's own
    cut. The window then spans those steps' time, minus the part of the first one before the
    start scrape, plus the time after the last one: both read on the client clock, whose delay
    cancels between the two. Without counter_cut, the steps whose chunks arrived in the window.

    Idle time: moments in the window when no request was in the engine (sent, by `sent`, the
    request's send time, and not yet finished): the engine waits for the client's next request,
    as at concurrency 1 between requests. That is measured (client clock), not modelled.

    chunks: (client arrival time, request index, prompt tokens, tokens emitted before, tokens in
    this chunk). Why not just group chunks by arrival time: a client starved of CPU reads two
    steps' chunks at once, so times alone merge and split steps. What holds regardless: a running
    request gets exactly one chunk per engine step (its first from the step that finished its
    prefill), so a request's chunks sit on consecutive steps. Requests are laid on one step
    timeline in order of their first chunk, each at the offset where its chunk times best match
    (median distance) the timeline built so far; chunks past its end extend it. Assumes no
    preemption in the window (a preempted request pauses and would be misplaced).
    """
    by_request: dict[int, list[tuple[float, float, float, float]]] = {}
    for t, rid, prompt, before, tokens in chunks:
        by_request.setdefault(rid, []).append((t, prompt, before, tokens))
    for req in by_request.values():
        req.sort(key=lambda c: (c[2], c[0]))  # token order: a lagging client's times may not be monotonic
    timeline, placed = _step_timeline(sorted(by_request.values(), key=lambda r: r[0][0]))
    decodes = [0] * len(timeline)
    context = [0.0] * len(timeline)
    prefill = [0.0] * len(timeline)
    tokens_at = [0.0] * len(timeline)
    for s0, req in placed:
        for j, (_, prompt, before, tokens) in enumerate(req):
            i = s0 + j
            if before > 0:
                decodes[i] += 1
                context[i] += prompt + before - 1  # KV already cached: the last sampled token is this step's input
            else:
                prefill[i] += prompt
            tokens_at[i] += tokens
    start, end = window
    if counter_cut is not None and timeline:
        cumulative, total = [], 0.0
        for x in tokens_at:
            total += x
            cumulative.append(total)

        def cut(count: float) -> int:
            """Index of the last step whose tokens the counter had seen (-1: none)."""
            return max((i for i, c in enumerate(cumulative) if c <= count + 0.5), default=-1)

        first, last_i = cut(counter_cut[0]), cut(counter_cut[1])
        chosen = range(first + 1, last_i + 1)
        steps = [(decodes[i], context[i], prefill[i]) for i in chosen]
        tokens = sum(tokens_at[i] for i in chosen)
        # the start scrape was served during the first chosen step, the end scrape during the step
        # after the last: how far into them, the client clock says (clipped to the step by the model)
        head = start - timeline[first] if first >= 0 else 0.0
        tail = end - timeline[last_i] if last_i >= 0 else end - start
        following = (decodes[last_i + 1], context[last_i + 1], prefill[last_i + 1]) if last_i + 1 < len(timeline) else None
        last = timeline[last_i] if last_i >= 0 else start
        return steps, tokens, (head, tail, following), _idle(by_request, sent, start, last)
    else:
        steps = []
        tokens = 0.0
        last = start
        for i, t in enumerate(timeline):
            if start < t <= end:
                steps.append((decodes[i], context[i], prefill[i]))
                tokens += tokens_at[i]
                last = t
        uncovered = max(end - last, 0.0)
    return steps, tokens, uncovered, _idle(by_request, sent, start, last)


def _idle(by_request: dict, sent: dict[int, float] | None, start: float, last: float) -> float:
    """Time in (start, last] when no request was in the engine (sent and not yet finished)."""
    idle = 0.0
    if sent:
        spans = sorted((max(sent.get(rid, req[0][0]), start), req[-1][0]) for rid, req in by_request.items())
        cursor = start
        for a, b in spans:
            if a > cursor and cursor < last:
                idle += min(a, last) - cursor
            cursor = max(cursor, b)
    return max(idle, 0.0)


MIN_BATCH_SPREAD = 0.5
"""Mean running sequences per step must differ by this much across the windows for the front
end's per-sequence CPU to be told from its per-step CPU."""


def front_end_cost(points: Sequence[CalibrationPoint]) -> float | None:
    """The server front end's CPU seconds per running sequence per engine step, measured: the
    slope of its CPU time per step (from /proc, over each window) against the sequences each step
    ran, fitted across the windows. None where the windows do not span two batch sizes.

    Why: on a CPU host the front end (vLLM's API server) runs on the cores the engine computes on,
    so its CPU time is taken from the engine's steps. Part of it comes once per step (one pass
    over the step's outputs) and is already in the fitted per-step cost; the part that comes per
    sequence (each stream's chunk: detokenising, serialising, writing) grows with the batch, and
    points at one or two concurrencies barely tell it from a per-step cost by fitting (freed, the
    whole per-sequence cost came out at zero on one host, at +-40% on another). Measured, this
    share of it is an input, not a constant to identify."""
    xs, ys, ws = [], [], []
    for p in points:
        if p.front_cpu_s is None or not p.steps:
            continue
        n = len(p.steps)
        xs.append(sum(d for d, _ctx, _pf in p.steps) / n)
        ys.append(p.front_cpu_s / n)
        ws.append(float(n))
    if len(xs) < 2 or max(xs) - min(xs) < MIN_BATCH_SPREAD:
        return None
    import numpy as np

    # each window weighs by its steps (polyfit's weights multiply the residuals)
    slope, _per_step = np.polyfit(xs, ys, 1, w=np.sqrt(ws))
    return max(float(slope), 0.0)


def _resolved(eff: Efficiency, gpu: GPU) -> Efficiency:
    """Efficiency with tp_latency_s made explicit (the interconnect alpha) so it can be fitted."""
    if eff.tp_latency_s is None:
        return replace(eff, tp_latency_s=gpu.interconnect.latency_s)
    return eff


@dataclass
class CalibrationResult:
    gpu: GPU
    model: ModelProfile
    efficiency: Efficiency
    fitted: tuple[str, ...]
    dropped: dict[str, str]
    std: dict[str, float]
    covariance: list[list[float]]
    points: list[CalibrationPoint]
    residuals_log: list[float]
    noise_log: float
    noise_basis: str
    notes: list[str] = field(default_factory=list)
    rejected: list[tuple[CalibrationPoint, float]] = field(default_factory=list)  # (point, its log residual)

    def _grad_log(self, point: CalibrationPoint) -> list[float]:
        base = math.log(model_tokps(self.gpu, self.model, point, self.efficiency))
        grad = []
        for name in self.fitted:
            value = getattr(self.efficiency, name)
            h = max(abs(value) * 1e-4, 1e-9)
            lo_b, hi_b = BOUNDS[name]
            step = -h if value + h > hi_b else h
            bumped = replace(self.efficiency, **{name: value + step})
            grad.append((math.log(model_tokps(self.gpu, self.model, point, bumped)) - base) / step)
        return grad

    def predict(self, config: CalibrationPoint) -> tuple[float, float, float]:
        """(tok/s, low, high): the model's figure and a ~95% band from the constants' uncertainty."""
        value = model_tokps(self.gpu, self.model, config, self.efficiency)
        if not self.fitted:
            return value, value, value
        g = self._grad_log(config)
        var = sum(g[i] * self.covariance[i][j] * g[j] for i in range(len(g)) for j in range(len(g)))
        sd = math.sqrt(max(var, 0.0))
        return value, value * math.exp(-Z95 * sd), value * math.exp(Z95 * sd)

    def predict_measurement(self, config: CalibrationPoint, starts: int = 1,
                            replicate_spread: float | None = None) -> tuple[float, float, float]:
        """(tok/s, low, high) for what a measurement of `config` averaged over `starts` server
        starts (one window each) will read. This is the band a measured value is checked against;
        `predict`'s is the model's figure alone.

        replicate_spread: the spread of log tok/s of one window from one start to the next,
        measured on repeated starts of the same configuration. It holds the start's own offset and
        the window's noise together, so when given it replaces the fit's residual scatter (adding
        both would count the window's noise twice). Noise shrinks with the starts averaged; the
        constants' uncertainty does not."""
        value, lo, hi = self.predict(config)
        sd_model = math.log(hi / value) / Z95 if value > 0 and hi > value else 0.0
        noise = self.noise_log if replicate_spread is None else replicate_spread
        sd = math.sqrt(sd_model ** 2 + noise ** 2 / max(1, starts))
        return value, value * math.exp(-Z95 * sd), value * math.exp(Z95 * sd)

    @property
    def interior(self) -> tuple[str, ...]:
        """The fitted constants off their bounds: each took a degree of freedom from the data (one
        pinned at a bound took none)."""
        return tuple(n for n in self.fitted if not _at_bound(self.efficiency, n))

    def band_95(self, name: str) -> float:
        """Half-width of a constant's ~95% band, relative to its value (inf at 0)."""
        value = getattr(self.efficiency, name)
        return Z95 * self.std.get(name, 0.0) / abs(value) if value else float("inf")

    def identified(self, rel: float = 0.05) -> dict[str, bool]:
        """Per fitted constant: do the data pin it to within +-rel (95%)? A constant that is fitted
        but not pinned is reported as weakly identified, with its band, never as a recovered value."""
        return {name: self.band_95(name) <= rel for name in self.fitted}

    def prediction(self, config: CalibrationPoint) -> dict:
        """One prediction as stored in the profile's metadata: the figure, its band, and its source."""
        value, lo, hi = self.predict(config)
        return {"config": _point_summary(config), "tokps": value, "low_95": lo, "high_95": hi,
                "unit": "tok/s", "source": "model",
                "note": "physics model with the fitted constants; band from the fit's covariance"}

    def metadata(self, predictions: Sequence[CalibrationPoint] = ()) -> dict:
        return {
            "gpu": self.gpu.name, "model": self.model.name, "model_source": self.model.source,
            "fitted": list(self.fitted), "dropped": self.dropped, "std": self.std,
            "band_95_rel": {name: self.band_95(name) for name in self.fitted},
            "identified_5pct": self.identified(0.05),
            "covariance": self.covariance, "covariance_order": list(self.fitted),
            "noise_log": self.noise_log, "noise_basis": self.noise_basis,
            "points": [_point_summary(p) for p in self.points], "residuals_log": self.residuals_log,
            "rejected": [{"point": _point_summary(p), "residual_log": r} for p, r in self.rejected],
            "predictions": [self.prediction(c) for c in predictions],
            "notes": self.notes, "source": "model (calibrated to measured tok/s)",
        }

    def to_dict(self, predictions: Sequence[CalibrationPoint] = ()) -> dict:
        return {"format": PROFILE_FORMAT, "efficiency": self.efficiency.to_dict(),
                "metadata": self.metadata(predictions)}

    def save_profile(self, path: str | Path, predictions: Sequence[CalibrationPoint] = ()) -> Path:
        """Write the profile JSON the simulator reads with --sim-profile (metadata: the fit, its
        covariance, and each prediction with its band)."""
        target = Path(path)
        try:
            target.write_text(json.dumps(self.to_dict(predictions), indent=2))
        except OSError as exc:
            raise InputError(f"{target}: cannot write calibration profile ({exc.strerror})") from exc
        return target


def _point_summary(point: CalibrationPoint) -> dict:
    """A point as JSON, its observed steps folded into a count (they are in the store)."""
    data = asdict(point)
    steps = data.pop("steps")
    data["observed_steps"] = len(steps) if steps is not None else None
    return data


def load_profile(path: str | Path) -> tuple[Efficiency, dict]:
    """(Efficiency, metadata) from a profile written by save_profile()."""
    source = Path(path)
    try:
        data = json.loads(source.read_text())
    except OSError as exc:
        raise InputError(f"{source}: cannot read calibration profile ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: calibration profile is not JSON (line {exc.lineno})") from exc
    if not isinstance(data, dict):
        raise InputError(f"{source}: not a truthput simulator profile (expected a JSON object)")
    known = set(Efficiency.__dataclass_fields__)
    if data.get("format") == PROFILE_FORMAT:
        raw, meta = data.get("efficiency") or {}, dict(data.get("metadata") or {})
    elif "format" not in data and set(data.get("efficiency", data)) <= known:
        # a hand-written profile: {"bw_frac": 0.7, ...} or {"efficiency": {...}}
        raw, meta = data.get("efficiency", data), {"note": "hand-written profile, not calibrated"}
    else:
        raise InputError(f"{source}: not a truthput simulator profile (expected format {PROFILE_FORMAT!r})")
    unknown = set(raw) - known
    if unknown:
        raise InputError(f"{source}: unknown efficiency keys {sorted(unknown)}")
    try:
        eff = Efficiency(**raw)
    except TypeError as exc:
        raise InputError(f"{source}: bad efficiency values ({exc})") from exc
    meta.setdefault("path", str(source))
    return eff, meta


def _at_bound(eff: Efficiency, name: str) -> bool:
    lo_b, hi_b = BOUNDS[name]
    value = getattr(eff, name)
    return math.isclose(value, lo_b, abs_tol=1e-9) or math.isclose(value, hi_b, rel_tol=1e-6)


def _check_points(points: Sequence[CalibrationPoint]) -> None:
    if not points:
        raise InputError("calibration: no points to fit")
    for i, p in enumerate(points):
        if p.measured_tokps is None or not p.measured_tokps > 0:
            raise InputError(f"calibration point {i}: measured_tokps must be a positive number")
        if p.tp < 1 or p.concurrency < 1 or p.context_tokens < 0:
            raise InputError(f"calibration point {i}: bad tp/concurrency/context")
        p.tokens_per_step()


def fit(
    points: Sequence[CalibrationPoint],
    gpu: GPU | str,
    model: ModelProfile | str,
    free: Sequence[str] = DEFAULT_FREE,
    prior: Efficiency | None = None,
    reject_outliers: bool = False,
    start_sigma: float = 0.0,
) -> CalibrationResult:
    """Least squares on log tok/s for the identifiable subset of `free`; others stay at `prior`.

    reject_outliers: first fit robustly (soft-L1), then leave out points whose residual is far
    outside the others' scatter (over 4 robust sigmas and 3%) and fit the rest by plain least
    squares. Why: a window in which the host stalled (client or server starved of CPU, the engine
    idle for want of requests) measures the host, not the engine's physics. Left-out points are
    listed in `rejected` and the notes, never silently dropped.

    start_sigma: the relative spread of achieved bandwidth from one server start to the next (a few
    % on real boxes; the simulator's --noise draws exactly that). Points with the same `group`
    (start) share one factor on bw_frac, fitted as a nuisance with that prior, so start-to-start
    noise is not read as physics, while differences within a start (concurrency: KV bytes,
    prefills) still pin the constants. The within-start scatter is estimated from the residuals.

    With no `prior` given, the constants start at the hardware's (prior_efficiency); on a CPU host
    whose points carry the front end's measured CPU time, per_seq_overhead_s starts at that
    measurement (front_end_cost): it stays there unless `free` names it and the data identify it.
    """
    front = None
    if prior is None:
        hw = get_gpu(gpu) if isinstance(gpu, str) else gpu
        prior = prior_efficiency(hw)
        front = front_end_cost(points) if hw.kind == "cpu" else None
        if front is not None:
            prior = replace(prior, per_seq_overhead_s=front)
    result = _fit_with_start_effects(points, gpu, model, free, prior, reject_outliers, start_sigma)
    if front is not None and "per_seq_overhead_s" not in result.fitted:
        result.notes.append(f"per_seq_overhead_s = {front * 1e3:.3f} ms per running sequence per step: measured, the "
                            "server front end's CPU per step on the engine's cores against the sequences the step "
                            "ran (not fitted)")
    return result


def _fit_with_start_effects(points: Sequence[CalibrationPoint], gpu: GPU | str, model: ModelProfile | str,
                            free: Sequence[str], prior: Efficiency, reject_outliers: bool,
                            start_sigma: float) -> CalibrationResult:
    if reject_outliers:
        first = _fit_rejecting_outliers(points, gpu, model, free, prior)
    else:
        first = _fit(points, gpu, model, free, prior)
    kept = first.points
    groups = [p.group for p in kept]
    if not start_sigma or not any(groups) or len(set(groups)) == len(groups):
        return first
    by_group: dict[str, list[float]] = {}
    for p, r in zip(kept, first.residuals_log):
        by_group.setdefault(p.group, []).append(r)
    within = sum((r - sum(rs) / len(rs)) ** 2 for rs in by_group.values() for r in rs)
    # the constants took up to one degree of freedom each from what is left within the starts: an
    # exact fit (as many points as starts plus constants) says nothing about the scatter
    dof = len(kept) - len(by_group) - len(first.fitted)
    sigma_e = max(math.sqrt(within / dof) if dof > 0 else ASSUMED_REL_NOISE, WINDOW_MODEL_FLOOR)
    rejected = list(first.rejected)
    notes = [n for n in first.notes if n.startswith("left out")]

    def with_starts(pts: list[CalibrationPoint], **kw) -> CalibrationResult:
        index = {g: i for i, g in enumerate(dict.fromkeys(p.group for p in pts))}
        return _fit(pts, gpu, model, free, prior, start_groups=[index[p.group] for p in pts],
                    sigma_u=start_sigma, sigma_e=sigma_e, **kw)

    if reject_outliers and len(kept) > 4:
        # with the start effects in the model, a window off its own start's other windows stands out
        import statistics

        robust = with_starts(kept, loss="soft_l1", f_scale=2.0)
        res = robust.residuals_log
        limit = max(4.0 * 1.4826 * statistics.median(abs(r) for r in res), 0.01)
        for p, r in zip(kept, res):
            if abs(r) > limit:
                rejected.append((p, r))
                notes.append(f"left out {p.label or f'tp={p.tp} c={p.concurrency} k={p.spec_k}'}: measured "
                             f"{math.expm1(-r):+.1%} off its start's fit (limit {limit:.1%}): a host stall or a "
                             "config the model does not describe")
        kept = [p for p, r in zip(kept, res) if abs(r) <= limit]
    result = with_starts(kept)
    result.rejected = rejected
    result.notes = notes + result.notes
    starts = len({p.group for p in kept})
    result.noise_basis = (f"within-start scatter {sigma_e:.2%} (from the residuals, at least the window model's "
                          f"{WINDOW_MODEL_FLOOR:.1%}) and a {start_sigma:.1%} "
                          f"per-start spread of achieved bandwidth (given), {starts} starts")
    result.noise_log = sigma_e
    return result


def _fit_rejecting_outliers(points, gpu, model, free, prior) -> CalibrationResult:
    import statistics

    points = list(points)
    robust = _fit(points, gpu, model, free, prior, loss="soft_l1")
    k = len(robust.fitted)
    if len(points) - k < 3:
        return _fit(points, gpu, model, free, prior)
    res = robust.residuals_log
    sigma = 1.4826 * statistics.median(abs(r) for r in res)
    limit = max(4.0 * sigma, 0.03)
    keep = [p for p, r in zip(points, res) if abs(r) <= limit]
    out = [(p, r) for p, r in zip(points, res) if abs(r) > limit]
    result = _fit(keep, gpu, model, free, prior)
    result.rejected = out
    for p, r in out:
        result.notes.append(f"left out {p.label or f'tp={p.tp} c={p.concurrency} k={p.spec_k}'}: measured "
                            f"{math.expm1(-r):+.0%} off the robust fit (limit {limit:.1%}): a host stall or a "
                            "config the model does not describe")
    return result


def _fit_candidates(points: list[CalibrationPoint], free: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The constants a fit of `points` may free, in priority order, and those it cannot (and why)."""
    _check_points(points)
    for name in free:
        if name not in BOUNDS:
            raise InputError(f"calibration: cannot fit {name!r}; choose from {', '.join(BOUNDS)}")
    candidates = [n for n in PRIORITY if n in free]
    if "tp_latency_s" in candidates and all(p.tp == 1 for p in points):
        candidates.remove("tp_latency_s")
        return candidates, {"tp_latency_s": "no point has TP > 1"}
    return candidates, {}


def _fit(
    points: Sequence[CalibrationPoint],
    gpu: GPU | str,
    model: ModelProfile | str,
    free: Sequence[str],
    prior: Efficiency,
    loss: str = "linear",
    whiten: Any = None,
    start_groups: Sequence[int] | None = None,
    sigma_u: float = 0.0,
    sigma_e: float = 1.0,
    f_scale: float = 0.02,
) -> CalibrationResult:
    """The fit itself. start_groups (a start index per point) adds one nuisance factor per server
    start on the achieved bandwidth, bw_frac x (1 + u_start), u ~ N(0, sigma_u), point scatter
    sigma_e: the simulator's (and a real box's) start-to-start noise, modelled where it acts."""
    import numpy as np

    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    model = get_model(model) if isinstance(model, str) else model
    points = list(points)
    prior = _resolved(prior, gpu)
    candidates, dropped = _fit_candidates(points, free)
    measured = np.log([p.measured_tokps or float("nan") for p in points])  # _check_points refused None

    def with_values(names: Sequence[str], x: Any) -> Efficiency:
        return replace(prior, **dict(zip(names, (float(v) for v in x))))

    n_starts = (max(start_groups) + 1) if start_groups else 0

    def raw_residuals(x: np.ndarray, names: Sequence[str]) -> np.ndarray:
        k = len(names)
        eff = with_values(names, x[:k])
        if not n_starts:
            return np.log([model_tokps(gpu, model, p, eff) for p in points]) - measured
        u = x[k:]
        return np.log([model_tokps(gpu, model, p, replace(eff, bw_frac=eff.bw_frac * (1.0 + u[g])))
                       for p, g in zip(points, start_groups or ())]) - measured

    def residuals(x: np.ndarray, names: Sequence[str]) -> np.ndarray:
        r = raw_residuals(x, names)
        if n_starts:
            return np.concatenate([r / sigma_e, x[len(names):] / sigma_u])
        return whiten @ r if whiten is not None else r

    start_values: list[np.ndarray] = [np.zeros(n_starts)]

    def identified_fit(names: list[str]) -> tuple[list[str], Efficiency, np.ndarray, np.ndarray, dict[str, str]]:
        """Fit `names`; drop flat or collinear constants and refit until the rest are identified."""
        names, lost = list(names), dict[str, str]()
        while True:
            if not names and not n_starts:
                return names, prior, np.zeros((len(points), 0)), residuals(np.array([]), []), lost
            k = len(names)
            sol, scale = _least_squares(residuals, names, prior, n_starts, loss, f_scale)
            if not names:
                start_values[0] = sol.x[k:]
                return names, prior, sol.jac, sol.fun, lost
            scaled = (sol.jac * scale)[:, :k]
            col = np.linalg.norm(scaled, axis=0)
            weakest = int(np.argmin(col))
            if col[weakest] < 1e-6:
                lost[names.pop(weakest)] = "the data are insensitive to it (that resource never binds at these points)"
                continue
            sv = np.linalg.svd(scaled, compute_uv=False)
            if len(names) > 1 and sv[-1] / sv[0] < 1e-4:
                lost[names.pop()] = "not separable from the other constants at these points"
                continue
            start_values[0] = sol.x[k:]
            return names, with_values(names, sol.x[:k]), sol.jac, sol.fun, lost

    if len(candidates) > len(points):
        names, eff, jac, res, lost = _best_subset(candidates, len(points), identified_fit)
        for name in candidates:
            if name not in names and name not in lost:
                dropped[name] = (f"{len(points)} point(s) identify at most {len(points)} constant(s); "
                                 f"{', '.join(names) or 'none'} explain the data best")
    else:
        names, eff, jac, res, lost = identified_fit(candidates)
    dropped.update(lost)
    candidates = names

    raw = raw_residuals(np.concatenate([[getattr(eff, name) for name in candidates], start_values[0]]), candidates)
    noise, basis = _fit_noise(res, len(points), len(candidates), bool(n_starts), whiten is not None)
    k = len(candidates)
    cov = (np.linalg.pinv(jac.T @ jac) * noise**2)[:k, :k] if k else np.zeros((0, 0))
    std = {name: float(math.sqrt(max(cov[i, i], 0.0))) for i, name in enumerate(candidates)}
    notes = []
    if k == 1 and len(points) == 1:
        notes.append(f"one data point: fitted one constant ({candidates[0]}); "
                     f"the others stay at their priors ({', '.join(f'{d}' for d in dropped)})")
    for name in candidates:
        if _at_bound(eff, name):
            notes.append(f"{name} sits at its bound {getattr(eff, name):g}: the model needs something it lacks")
    return CalibrationResult(
        gpu=gpu, model=model, efficiency=eff, fitted=tuple(candidates), dropped=dropped, std=std,
        covariance=cov.tolist(), points=points, residuals_log=[float(r) for r in raw],
        noise_log=noise, noise_basis=basis, notes=notes,
    )


def _least_squares(residuals: Callable[..., Any], names: list[str], prior: Efficiency, n_starts: int, loss: str,
                   f_scale: float) -> tuple[Any, Any]:
    """The bounded least-squares fit of `names` (and one start effect per server start), from the
    prior and two starting points below it: max(mem, compute) has a kink, and at the prior a resource
    that does not bind yet has a zero gradient although a lower efficiency would make it bind.
    Returns (the best solution, the parameters' scales)."""
    import numpy as np
    from scipy.optimize import least_squares

    x0 = np.array([min(max(getattr(prior, n), BOUNDS[n][0]), BOUNDS[n][1]) for n in names] + [0.0] * n_starts)
    lo = np.array([BOUNDS[n][0] for n in names] + [-0.5] * n_starts)
    hi = np.array([BOUNDS[n][1] for n in names] + [0.5] * n_starts)
    scale = np.array([max(abs(v), 1e-3 if n.endswith("_s") else 0.1) for n, v in zip(names, x0)] + [0.01] * n_starts)
    sol: Any = None
    for frac_factor, time_factor in ((1.0, 1.0), (0.4, 2.0), (0.15, 0.5)):
        start = np.array([v * (time_factor if n.endswith("_s") else frac_factor) for n, v in zip(names, x0)]
                         + [0.0] * n_starts)
        start = np.clip(start, lo + 1e-12, hi)
        trial = least_squares(residuals, start, bounds=(lo, hi), x_scale=scale, args=(names,), loss=loss,
                              f_scale=f_scale, method="trf", jac="3-point", xtol=1e-12, ftol=1e-12, gtol=1e-12)
        if sol is None or trial.cost < sol.cost - 1e-12:
            sol = trial
    return sol, scale


def _best_subset(candidates: list[str], n_points: int, identified_fit: Callable[[list[str]], Any]) -> Any:
    """Fewer points than constants: the subset of n_points constants that explains the data best
    (ties go to the PRIORITY order, so one point fits the fixed per-step overhead; a constant
    pinned at its bound explains less)."""
    import numpy as np

    best: Any = None
    for subset in itertools.combinations(candidates, n_points):
        trial = identified_fit(list(subset))
        ssr = float(np.sum(trial[3] ** 2))
        pinned = sum(_at_bound(trial[1], n) for n in trial[0])
        tol = 1e-10 + 1e-6 * (best[0] if best else 0.0)
        if best is None or ssr < best[0] - tol or (abs(ssr - best[0]) <= tol and pinned < best[1]):
            best = (ssr, pinned, trial)
    return best[2]


def _fit_noise(res: Any, n: int, k: int, start_effects: bool, whitened: bool) -> tuple[float, str]:
    """The fit's noise in log tok/s and where it came from: the residuals on the degrees of freedom
    the constants leave (in units of the assumed covariance when start effects or a whitening are
    modelled, and then never below it), else an assumed measurement noise."""
    import numpy as np

    if start_effects or whitened:
        scale = float(math.sqrt(float(np.sum(res**2)) / (n - k))) if n > k else 1.0
        return max(scale, 1.0), "start effects on bandwidth" if start_effects else "generalized least squares"
    if n - k > 0:
        return float(math.sqrt(float(np.sum(res**2)) / (n - k))), f"residual scatter of the fit ({n - k} degrees of freedom)"
    return ASSUMED_REL_NOISE, (f"assumed {ASSUMED_REL_NOISE:.0%} measurement noise: {n} point(s) for {k} constant(s) "
                               "leave no degrees of freedom to estimate it")


# --- what a misfit asks of the model ----------------------------------------------------------------


# --- points as `truthput sim calibrate --point` takes them ---------------------------------------

_POINT_KEYS = {"tp": int, "concurrency": int, "spec_k": int, "spec_method": str, "acceptance": float,
               "context": float, "tokps": float, "kv": float, "input": float, "output": float,
               "drafted": float}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def parse_point(text: str) -> CalibrationPoint:
    """'tp=2,concurrency=8,spec_k=1,spec_method=mtp,acceptance=1.95,context=2048,tokps=339.9,kv=1'.

    input= and output= (a closed loop's prompt and output lengths) price the whole request cycle,
    prefill included, instead of steady decode at context=. drafted= is the draft tokens verified
    per sequence-step (counters: draft tokens / (drafts + undrafted steps)); without it, spec_k."""
    values: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in _POINT_KEYS:
            raise InputError(f"--point {text!r}: expected key=value pairs from {', '.join(_POINT_KEYS)}")
        try:
            values[key] = _POINT_KEYS[key](raw.strip())
        except ValueError:
            raise InputError(f"--point {text!r}: {key}={raw!r} is not a number") from None
    for required in ("tp", "concurrency", "tokps"):
        if required not in values:
            raise InputError(f"--point {text!r}: missing {required}=")
    return CalibrationPoint(
        tp=values["tp"], concurrency=values["concurrency"], spec_k=values.get("spec_k", 0),
        spec_method=values.get("spec_method"), acceptance_length=values.get("acceptance"),
        context_tokens=values.get("context", 1024.0), measured_tokps=values["tokps"],
        kv_dtype_bytes=values.get("kv", 2.0), input_tokens=values.get("input"),
        output_tokens=values.get("output"), draft_tokens_per_step=_number(values.get("drafted")),
    )
