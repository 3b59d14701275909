"""Trials -> cells: the one place that decides a trial's headline figure and a cell's figures.

A cell is one variant at one load level (streams, or an offered rate); its replicates are server starts (the unit of
replication), each holding one or more trials. Every view (run and `load` tables, verdict,
audit, claims, compare, HTML, markdown, CSV, JSON) renders cells built here, so they cannot
disagree about which figure a cell is judged by or where it came from.
"""

from __future__ import annotations

import math
from collections import Counter

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Protocol, TypeVar

from truthput.analyze.noise import likely_noise_cause
from truthput.analyze.stats import CellEstimate, cell_estimate, noise_warnings
from truthput.measure.model import NOT_COMPARED_FLAGS, Figure, TrialResults
from truthput.experiment.levels import Level, is_rate, level_label, level_of

HEADLINE_SOURCES = {"server_counter": "server counter", "usage": "usage placed in time"}
HEADLINE_DEFINITIONS = {
    "server_counter": "the rise of the server's emitted-token counter over the steady-state window (all N streams "
                      "in flight) / the window's wall time",
    "usage": "truthput's own tokens: the usage counts of the chunks that arrived in the steady-state window "
             "(running usage, or each request's final usage placed on its chunks) / the window's wall time",
}


@dataclass(frozen=True)
class HeadlineBasis:
    """What the tok/s column of a table of cells is, from the cells' own sources: the label its
    header carries, the definition its footnote gives, and the source whose cells are marked in it
    (None: every cell has the header's source)."""

    label: str
    definition: str
    marked: str | None = None
    main: str = "server_counter"

    def marks(self, source: str) -> bool:
        """Whether a cell (or row) whose headline came from `source` is marked in the column."""
        return any(s != self.main for s in source.split("+") if s in HEADLINE_SOURCES)


COUNTER_BASIS = "emitted-token counter delta over the steady-state window / its wall time"


def hit_rate_of(results: Sequence[TrialResults]) -> tuple[float | None, str]:
    """A cell's prefix-cache hit rate, the one figure every view shows: the median over its ok
    trials of each window's rate (the server's counters), or why there is none."""
    figs = [r.server_samples.prefix_cache_hit_rate for r in results]
    known = [v for f in figs if f is not None and (v := f.number()) is not None]
    notes = [f.note for f in figs if f is not None and f.note]
    if not known:
        return None, notes[0] if notes else "no trial measured it"
    return median(known), "median over trials of the window's cached / looked-up prompt tokens (the server's counters)"


def headline_basis_note(results: TrialResults, h: Figure) -> str:
    """How a trial's headline was counted, said from the figures themselves: the counter's delta,
    or the usage figure's own note (running usage counts, or final usage spread over the chunks, and
    why a counter gave way), said as without a counter where the window had no counter figure; `h`
    is the trial's headline (`headline`)."""
    if h.source == "server_counter":
        return COUNTER_BASIS
    how = h.note or source_label(h.source)
    return how if results.throughput.counter_window.value is not None else f"no server counter figure: {how}"


def headline_basis(sources: Iterable[str]) -> HeadlineBasis:
    """The basis of a column whose cells' headlines come from `sources` (one per cell; a cell
    whose trials differ gives "a+b"): the most common source heads it, the others are marked."""
    parts = [s for src in sources for s in src.split("+") if s in HEADLINE_SOURCES]
    if not parts:
        return HeadlineBasis(HEADLINE_SOURCES["server_counter"], HEADLINE_DEFINITIONS["server_counter"])
    main = max(HEADLINE_SOURCES, key=lambda s: (parts.count(s), s == "server_counter"))
    others = [s for s in HEADLINE_SOURCES if s != main and s in parts]
    if not others:
        return HeadlineBasis(HEADLINE_SOURCES[main], HEADLINE_DEFINITIONS[main], main=main)
    other = others[0]
    return HeadlineBasis(f"{HEADLINE_SOURCES[main]}; {HEADLINE_SOURCES[other]} where marked",
                         f"{HEADLINE_DEFINITIONS[main]}; where marked, {HEADLINE_DEFINITIONS[other]}", other, main)


class TrialLike(Protocol):
    """What analysis needs of a stored trial (`truthput.store.db.StoredTrial` is one)."""

    @property
    def variant(self) -> str: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def start_index(self) -> int: ...
    @property
    def trial_index(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def results(self) -> TrialResults: ...


def headline(results: TrialResults) -> Figure:
    """The figure a trial is judged by, with its provenance (`TrialResults.headline`: the
    counter, else usage placed in time when the counter is missing or flagged)."""
    return results.headline()


def source_label(source: str) -> str:
    """How a person reads a headline's source."""
    return " + ".join(HEADLINE_SOURCES.get(part, part) for part in source.split("+"))


def trial_warnings(trial: TrialLike) -> list[str]:
    """Why a trial's figures may be distorted, in words (the batch never settled, the client was
    the bottleneck, the trial failed)."""
    out = []
    client = trial.results.client
    if client.never_settled:
        out.append(f"the {trial.concurrency} streams never all generated at once (no steady state)"
                   if not is_rate(level_of(trial)) else "the load never reached a steady state (no window)")
    check = client.selfcheck
    if check is not None and check.client_bound:
        out.append(f"client-bound ({check.reason}): the load generator may have distorted it")
    if trial.status != "ok" and trial.error:
        out.append(trial.error)
    return out


@dataclass
class CellFlag:
    """A validity flag on a cell's figure: which figure, why, and in how many of its trials."""

    figure: str
    """"tok/s" (the headline), "per stream" or "counter" (a counter set aside for usage)."""
    code: str
    reason: str
    trials: int
    of: int

    def text(self) -> str:
        share = f"{self.trials} of {self.of} trials" if self.of > 1 else "its trial"
        return f"{self.figure}: {self.code} ({share}): {self.reason}"


def _collect(flags: list[CellFlag], figure: str, fig: Figure | None, of: int) -> None:
    for f in fig.flags if fig is not None else ():
        same = next((x for x in flags if x.figure == figure and x.code == f.code), None)
        if same is None:
            flags.append(CellFlag(figure, f.code, f.reason, 1, of))
        else:
            same.trials += 1


@dataclass
class Cell:
    """One variant at one load level: the headline figures of its trials, grouped by server start."""

    variant: str
    level: Level
    """Streams (closed loop) or a `Rate` (open loop)."""
    baseline: bool
    status: str
    """"ok", "failed: <class>: <reason>" or "no data"."""
    per_start: list[list[float]] = field(default_factory=list)
    start_ids: list[int] = field(default_factory=list)
    """The start index (the interleaved round) of each entry of `per_start`."""
    estimate: CellEstimate | None = None
    sources: list[str] = field(default_factory=list)
    bases: list[str] = field(default_factory=list)
    """How the trials' headlines were counted, each said once (`headline_basis_note`): a cell note
    from the figures' own provenance, not from their source's name."""
    per_stream: float | None = None
    ttft_p50: float | None = None
    itl_p50: float | None = None
    noise: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """Trial warnings, each naming its trial."""
    flags: list[CellFlag] = field(default_factory=list)
    """Validity flags on the cell's headline ("tok/s") and per-stream figures, and on counters
    set aside for usage placed in time ("counter")."""
    trials: list[TrialLike] = field(default_factory=list, repr=False)

    def flags_on(self, figure: str) -> list[CellFlag]:
        return [f for f in self.flags if f.figure == figure]

    @property
    def wrong(self) -> list[str]:
        """The flags on the headline that keep it out of every comparison (`measure.model.
        NOT_COMPARED_FLAGS`, the one definition: a count known to be wrong, or unequal work): such
        a cell is shown, never compared."""
        return sorted({f.code for f in self.flags_on("tok/s") if f.code in NOT_COMPARED_FLAGS})

    @property
    def flagged(self) -> bool:
        """Whether the headline figure carries a flag in any trial."""
        return bool(self.flags_on("tok/s"))

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.estimate is not None

    @property
    def key(self) -> tuple[str, Level]:
        return (self.variant, self.level)

    @property
    def label(self) -> str:
        """"c=4" or "2 req/s"."""
        return level_label(self.level)

    @property
    def concurrency(self) -> int | None:
        """The closed loop's streams; None for an open loop (its in-flight count is what the
        server made of the offered rate, not a setting)."""
        return None if is_rate(self.level) else int(self.level)

    @property
    def source(self) -> str:
        """The headline's source: 'server_counter', 'usage', or both joined when trials differ."""
        return "+".join(self.sources) if self.sources else "missing"

    def series(self, metric: str) -> tuple[list[list[float]], list[int]]:
        """(per-start values, their rounds) of a verdict metric over the cell's ok trials: "tok/s"
        (the headline), "goodput" (good output tokens per second under the SLOs), or a latency
        quantile such as "itl_p99" (each trial's own quantile, client clock)."""
        if metric == "tok/s":
            return self.per_start, self.start_ids
        starts = self._by_server(metric)
        keys = sorted(starts)
        return [starts[k] for k in keys], [k[0] for k in keys]

    def servers(self, metric: str) -> list[int]:
        """The server start (start_id, -1 where unknown) of each entry of `series(metric)`."""
        return [k[1] for k in sorted(self._by_server(metric))]

    def _by_server(self, metric: str) -> dict[tuple[int, int], list[float]]:
        """(round, server) -> the metric's values over the cell's ok trials (the grouping of
        `per_start`, for any verdict metric)."""
        starts: dict[tuple[int, int], list[float]] = {}
        for t in self.trials:
            if t.status != "ok":
                continue
            v = trial_metric(t.results, metric)
            if v is not None:
                starts.setdefault(_replicate(t), []).append(v)
        return starts

    def completion_tokens_mean(self) -> float | None:
        """Mean completion tokens per ok request over the cell's ok trials (usage): the work each
        request did, so a figure per token can be read per request."""
        vals = [t.results.requests.completion_tokens_mean for t in self.trials if t.status == "ok"]
        known = [v for v in vals if v is not None]
        return sum(known) / len(known) if known else None

    def prefix_cache_hit_rate(self) -> tuple[float | None, str]:
        """(median over the cell's ok trials of the window's prefix-cache hit rate, what it is or
        why there is none)."""
        return hit_rate_of([t.results for t in self.trials if t.status == "ok"])

    def spec_acceptance(self) -> tuple[float | None, float | None]:
        """(acceptance rate, mean acceptance length) of the cell's speculation: the means over its ok
        trials of each window's counters (None where no trial speculated)."""
        return spec_means([t.results for t in self.trials if t.status == "ok"])

    def replay_lateness_p99(self) -> float | None:
        """A trace's replay: the median over the cell's ok trials of their sends' p99 lateness (s)."""
        late = [t.results.replay.lateness_p99_ms for t in self.trials
                if t.status == "ok" and t.results.replay is not None and t.results.replay.lateness_p99_ms is not None]
        return median(late) / 1000 if late else None

    def median_over_trials(self, metric: str, q: str) -> float | None:
        """Median over the cell's ok trials of each trial's client-clock latency quantile."""
        vals = []
        for t in self.trials:
            if t.status != "ok":
                continue
            d = t.results.latency.metric(metric)
            v = d.at(q) if d is not None else None
            if v is not None:
                vals.append(v)
        return median(vals) if vals else None


def spec_means(results: Iterable[TrialResults]) -> tuple[float | None, float | None]:
    """The mean acceptance rate and mean acceptance length (1 + accepted / drafts) over trials'
    spec-decode windows (the whole trial's where the window had none); None where none has it."""
    rate: list[float] = []
    length: list[float] = []
    for r in results:
        w = r.spec_decode.best_interval() if r.spec_decode is not None else None
        if w is None:
            continue
        if w.acceptance_rate is not None and w.acceptance_rate.value is not None:
            rate.append(float(w.acceptance_rate.value))
        if w.mean_acceptance_length is not None and w.mean_acceptance_length.value is not None:
            length.append(float(w.mean_acceptance_length.value))
    return (sum(rate) / len(rate) if rate else None, sum(length) / len(length) if length else None)


def _replicate(t: TrialLike) -> tuple[int, int]:
    """(round, server): the unit of replication is the server process a trial ran on."""
    sid = getattr(t, "start_id", None)
    return (t.start_index, -1 if sid is None else int(sid))


def trial_metric(results: TrialResults, metric: str) -> float | None:
    """One trial's value of a verdict metric (see `Cell.series`); None where it has none."""
    if metric == "tok/s":
        return results.headline().number()
    if metric == "goodput":
        gp = results.goodput
        return gp.good_tokens_per_s.number() if gp is not None and gp.good_tokens_per_s is not None else None
    if metric == "tok/s/W":
        return tokens_per_joule(results)
    name, _, q = metric.partition("_")
    d = results.latency.metric(name)
    return d.at(q) if d is not None else None


def tokens_per_joule(results: TrialResults) -> float | None:
    """tok/s per watt: the server counter's tokens per joule the GPUs drew over the trial (NVML's
    energy, or on the simulator its power model's); None where neither was there."""
    per_token = (results.telemetry or {}).get("energy_per_token_j") or {}
    joules = per_token.get("value")
    return 1.0 / float(joules) if joules else None


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return median(vals) if vals else None


T = TypeVar("T", bound=TrialLike)


def group_trials(trials: Iterable[T]) -> dict[tuple[str, Level], list[T]]:
    """Trials by (variant, load level), in first-seen order: the one grouping behind every figure a
    cell shows (its headline per start, its audit rows, its claims, its latency and spec-decode means)."""
    groups: dict[tuple[str, Level], list[T]] = {}
    for t in trials:
        groups.setdefault((t.variant, level_of(t)), []).append(t)
    return groups


def build_cells(trials: Sequence[TrialLike], variants: Sequence[str] | None = None, baseline: str | None = None,
                failed: dict[str, str] | None = None) -> list[Cell]:
    """Every variant x concurrency cell, in variant order then concurrency order.

    `variants` fixes the order (and includes variants without a trial); `failed` says why a
    variant has no data.
    """
    failed = failed or {}
    names = list(variants) if variants is not None else list(dict.fromkeys(t.variant for t in trials))
    levels = sorted({level_of(t) for t in trials})
    by_key = group_trials(trials)
    cells = []
    for v in names:
        for c in levels:
            ts = sorted(by_key.get((v, c), []), key=lambda t: (t.start_index, t.trial_index))
            cell = Cell(variant=v, level=c, baseline=v == baseline, status="no data", trials=list(ts))
            # one replicate per server process: a start resumed after truthput died is a new server
            # (a new start_id) in the same round (start_index)
            starts: dict[tuple[int, int], list[float]] = {}
            sources: list[str] = []
            for t in ts:
                cell.warnings.extend(f"{v} {level_label(c)} start {t.start_index + 1} trial {t.trial_index + 1}: {w}"
                                     for w in trial_warnings(t))
                if t.status != "ok":
                    continue
                h = headline(t.results)
                if h.value is None:
                    continue
                if not (math.isfinite(h.value) and h.value > 0):
                    # e.g. a counter window that read 0.0 behind a late /metrics: a figure the trial
                    # shows with its flags, but no throughput a ratio can use
                    codes = "".join(f" !{f.code}" for f in h.flags)
                    cell.warnings.append(
                        f"{v} {level_label(c)} start {t.start_index + 1} trial {t.trial_index + 1}: its headline "
                        f"{h.value:g} tok/s [{source_label(h.source)}]{codes} is not a throughput the statistics "
                        "can use (a ratio to zero has no interval): left out of the cell's figures and the verdict")
                    continue
                starts.setdefault(_replicate(t), []).append(float(h.value))
                if h.source not in sources:
                    sources.append(h.source)
                if (basis := headline_basis_note(t.results, h)) not in cell.bases:
                    cell.bases.append(basis)
            ok = [t for t in ts if t.status == "ok"]
            other_work = [t.results.requests.work_notes for t in ok if t.results.requests.work_notes]
            if other_work:
                cell.warnings.extend(f"{v} {level_label(c)} ({len(other_work)} of {len(ok)} trials): {note}"
                                     for note in other_work[0])
            if starts:
                cell.per_start = [starts[s] for s in sorted(starts)]
                cell.start_ids = [s[0] for s in sorted(starts)]
                cell.estimate = cell_estimate(cell.per_start)
                cell.status = "ok"
                cell.sources = sorted(sources)
                cell.noise = list(dict.fromkeys(([cell.estimate.warning] if cell.estimate.warning else [])
                                                + noise_warnings(cell.per_start)))
                cause = likely_noise_cause([t.results for t in ok]) if cell.noise else None
                if cause:
                    cell.noise.append(cause)
                for t in ok:
                    h = headline(t.results)
                    _collect(cell.flags, "tok/s", h, len(ok))
                    _collect(cell.flags, "per stream", t.results.per_stream.decode_tps_median, len(ok))
                    counter = t.results.throughput.counter_window
                    if h is not counter and counter.value is not None:
                        _collect(cell.flags, "counter", counter, len(ok))
                cell.per_stream = _median(t.results.per_stream.decode_tps_median.number() for t in ok)
                cell.ttft_p50 = _median(t.results.latency.ttft.at("p50") for t in ok)
                cell.itl_p50 = _median(t.results.latency.itl.at("p50") for t in ok)
            elif v in failed:
                cell.status = f"failed: {failed[v]}"
            cells.append(cell)
    if baseline is not None:
        flag_unequal_work(cells, baseline)
    return cells


UNEQUAL_WORK = 0.05
"""A variant's requests that got (or were given) more than this share fewer completion tokens,
or another prompt length, than the baseline's at the same level did other work: not compared."""


@dataclass(frozen=True)
class _Work:
    """What a cell's ok requests did, per request: the medians over its trials of their mean
    completion and prompt tokens (usage), the standard error of those means (the requests' own
    spread: a workload of the user's rows asks each its own length), and how they ended."""

    done: float | None
    prompt: float | None
    done_se: float
    prompt_se: float
    reasons: Counter[str]

    @classmethod
    def of(cls, c: Cell) -> _Work:
        ok = [t for t in c.trials if t.status == "ok"]
        reasons: Counter[str] = Counter()
        for t in ok:
            reasons.update(t.results.requests.finish_reasons)
        n = sum(t.results.requests.ok for t in ok) or 1

        def se(sds: Iterable[float | None]) -> float:
            known = [x for x in sds if x is not None]
            return math.sqrt(sum(x * x for x in known) / len(known) / n) if known else 0.0

        reqs = [t.results.requests for t in ok]
        return cls(_median(r.completion_tokens_mean for r in reqs), _median(r.prompt_tokens_mean for r in reqs),
                   se(r.completion_tokens_sd for r in reqs), se(r.prompt_tokens_sd for r in reqs), reasons)


def _differs(a: float, b: float, se: float) -> bool:
    """Two means of work per request further apart than UNEQUAL_WORK of the reference and than three
    standard errors of their difference (requests of the user's rows differ in length by design)."""
    return abs(a - b) > max(UNEQUAL_WORK * b, 3 * se)


def flag_unequal_work(cells: list[Cell], baseline: str) -> None:
    """Flag `unequal_work` on a cell of either arm whose requests did other work than the other
    arm's at the same level (fewer completion tokens each: a context limit or a stop cut them; or
    another prompt length): tok/s over other work is not the same quantity, so it is never compared.
    The same test whichever arm is the baseline: the cell that did less is the one flagged."""
    base = {c.level: c for c in cells if c.variant == baseline and c.per_start}
    for cell in cells:
        ref = base.get(cell.level)
        if ref is None or cell is ref or not cell.per_start:
            continue
        mine, theirs = _Work.of(cell), _Work.of(ref)
        for less, more, a, b in ((cell, ref, mine, theirs), (ref, cell, theirs, mine)):
            said = []
            if a.done is not None and b.done and a.done < b.done and _differs(
                    a.done, b.done, math.hypot(a.done_se, b.done_se)):
                said.append(f"its requests got {a.done:.0f} completion tokens each against {more.variant}'s "
                            f"{b.done:.0f}")
            if less is cell and a.prompt is not None and b.prompt and _differs(
                    a.prompt, b.prompt, math.hypot(a.prompt_se, b.prompt_se)):
                said.append(f"its prompts were {a.prompt:.0f} tokens as the server counted them against "
                            f"{more.variant}'s {b.prompt:.0f}")
            if not said or any(f.code == "unequal_work" for f in less.flags):
                continue
            ends = ", ".join(f"{k} {n}" for k, n in a.reasons.most_common())
            other_ends = ", ".join(f"{k} {n}" for k, n in b.reasons.most_common())
            ok = sum(1 for t in less.trials if t.status == "ok")
            less.flags.append(CellFlag("tok/s", "unequal_work",
                                       "; ".join(said) + f" (finish_reason: {ends or 'unknown'}; {more.variant}: "
                                       f"{other_ends or 'unknown'}): less or other work per request, so its tok/s "
                                       f"is not the same quantity as {more.variant}'s and is not compared", ok, ok))


def metric_groups(cells: Iterable[Cell], metric: str) -> tuple[dict[tuple[str, Level], list[list[float]]],
                                                               dict[tuple[str, Level], list[int]]]:
    """(variant, level) -> per-start values of `metric`, and -> their rounds."""
    values, rounds = {}, {}
    for c in cells:
        vals, ids = c.series(metric)
        if vals:
            values[c.key], rounds[c.key] = vals, ids
    return values, rounds
