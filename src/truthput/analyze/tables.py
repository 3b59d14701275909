"""The report's two big tables as the analysis hands them over: one row per cell (its headline with
the verdict's interval and decision, its latency quantiles) and one row per trial (each counting
method's figure beside the headline the trial was decided on)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Protocol

from pydantic import Field

from truthput.analyze.cells import TrialLike, headline, trial_warnings
from truthput.analyze.rows import Figure, FlagRef, LevelRow, clean, figure, flag_refs
from truthput.analyze.summary import RunSummary
from truthput.experiment.levels import Level, level_json


class StoredTrialLike(TrialLike, Protocol):
    """A stored trial as the trial table reads it (`truthput.store.db.StoredTrial` is one)."""

    @property
    def id(self) -> int: ...
    @property
    def level(self) -> Level: ...
    @property
    def t0_wall(self) -> float | None: ...


class CellRow(LevelRow):
    variant: str
    baseline: bool
    status: str
    warnings: list[str] = Field(default_factory=list)
    tokps: Figure | None = None
    counter_set_aside: list[FlagRef] | None = None
    n_starts: int | None = None
    n_trials: int | None = None
    cv_within: float | None = None
    warning: str | None = None
    noise: list[str] | None = None
    per_stream: Figure | None = None
    delta_pct: Figure | None = None
    ttft_p50: Figure | None = None
    ttft_p90: Figure | None = None
    ttft_p99: Figure | None = None
    itl_p50: Figure | None = None
    itl_p90: Figure | None = None
    itl_p99: Figure | None = None
    tpot_p50: Figure | None = None
    tpot_p90: Figure | None = None
    tpot_p99: Figure | None = None
    e2e_p50: Figure | None = None
    e2e_p90: Figure | None = None
    e2e_p99: Figure | None = None
    completion_tokens: Figure | None = None
    """Mean completion tokens per request (usage), over the cell's trials."""
    prefix_cache_hit_rate: Figure | None = None
    """The server's prefix-cache hit rate over the window (its counters: cached / looked-up prompt
    tokens), median over the cell's trials; null with why where the engine exposes none."""
    acceptance_rate: Figure | None = None
    """Speculation: the share of drafted tokens the model accepted (server counters), mean over the
    cell's trials; null where the cell did not speculate."""
    mean_acceptance_length: Figure | None = None
    """Speculation: tokens a step emits, 1 + accepted / drafts (server counters), mean over trials."""
    replay_late_p99: Figure | None = None
    """A trace's replay: how late its sends left against their schedule, p99 (client clock), median
    over the cell's trials; null where the load was not a replay."""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.tokps is not None and self.tokps.value is not None


class TrialEntry(LevelRow):
    trial_id: int
    variant: str
    start_index: int
    trial_index: int
    status: str
    error: str | None = None
    t0_utc: str | None = None
    window_s: float | None = None
    headline_tokps: Figure
    counter_tokps: Figure
    usage_tokps: Figure
    slots_tokps: Figure | None = None
    """llama.cpp's /slots progress over the window, where the server has /slots."""
    per_stream_median: Figure
    ttft_p50: Figure
    itl_p99: Figure
    acceptance_length: Figure
    requests_ok: int
    requests_total: int
    integrity_holds: bool | None = None
    integrity: str | None = None
    warnings: list[str] = Field(default_factory=list)


# ---- cells -----------------------------------------------------------------------------------
def cell_rows(summary: RunSummary, simulated: bool) -> list[CellRow]:
    """The summary's cells as document rows; the interval of `delta_pct` is the verdict's."""
    out = []
    for cell in summary.cells:
        row = CellRow(variant=cell.variant, **level_json(cell.level), baseline=cell.baseline, status=cell.status,
                      warnings=list(cell.warnings))
        est = cell.estimate
        if cell.ok and est is not None:
            source = cell.source
            note = " / ".join(cell.bases)
            row.tokps = figure(est.mean, "tok/s", source, simulated, lo=est.lo, hi=est.hi,
                               interval=f"{summary.verdict.confidence:.0%} Student-t over server starts", note=note,
                               flags=flag_refs(cell.flags_on("tok/s")))
            if cell.flags_on("counter"):
                row.counter_set_aside = flag_refs(cell.flags_on("counter"))
            row.n_starts, row.n_trials = est.n_starts, est.n_trials
            row.cv_within, row.warning, row.noise = clean(est.cv_within), est.warning, list(cell.noise)
            row.per_stream = figure(cell.per_stream, "tok/s/stream", "usage", simulated,
                                    note="median over trials of per-request (tokens-1)/(last chunk - first token); "
                                         "leaves out TTFT and the gaps between requests, so at c=1 it can exceed "
                                         "the aggregate",
                                    flags=flag_refs(cell.flags_on("per stream")))
            row.completion_tokens = figure(cell.completion_tokens_mean(), "tokens", "usage", simulated,
                                           note="mean usage.completion_tokens of the ok requests, over trials")
            hit, why = cell.prefix_cache_hit_rate()
            row.prefix_cache_hit_rate = figure(hit, "fraction", "server_counter", simulated,
                                               note=why)
            row.replay_late_p99 = figure(cell.replay_lateness_p99(), "s", "client_clock", simulated,
                                         note="each send's lateness against the trace's schedule, p99")
            rate, length = cell.spec_acceptance()
            row.acceptance_rate = figure(rate, "ratio", "server_counter", simulated,
                                         note="accepted / drafted tokens over the window, mean over trials")
            row.mean_acceptance_length = figure(length, "tokens/step", "server_counter", simulated,
                                                note="1 + accepted / drafts over the window, mean over trials")
            row.ttft_p50 = figure(cell.ttft_p50, "s", "client_clock", simulated)
            row.itl_p50 = figure(cell.itl_p50, "s", "client_clock", simulated)
            for name in ("ttft", "itl", "tpot", "e2e"):
                for q in ("p50", "p90", "p99"):
                    if getattr(row, f"{name}_{q}") is None:
                        setattr(row, f"{name}_{q}", figure(cell.median_over_trials(name, q), "s", "client_clock",
                                                           simulated, note="median over the cell's trials of each "
                                                                           "trial's quantile"))
            comp = summary.comparison(cell.variant, cell.level)
            if comp is not None:
                e = comp.estimate
                row.delta_pct = figure(e.pct, "%", source, simulated, lo=e.pct_lo, hi=e.pct_hi,
                                       significant=e.significant, outcome=comp.outcome, note=e.warning,
                                       level=e.level, interval=f"the verdict's: {e.method}; {e.correction}")
        out.append(row)
    return out


def trial_rows(trials: Sequence[StoredTrialLike], simulated: bool) -> list[TrialEntry]:
    out = []
    for t in trials:
        r = t.results
        spec_w = r.spec_decode.window if r.spec_decode is not None else None
        h = headline(r)
        out.append(TrialEntry(
            trial_id=t.id, variant=t.variant, start_index=t.start_index, **level_json(t.level),
            trial_index=t.trial_index, status=t.status, error=t.error,
            t0_utc=datetime.fromtimestamp(t.t0_wall, timezone.utc).isoformat() if t.t0_wall else None,
            window_s=clean(r.window.seconds),
            headline_tokps=figure(h.number(), "tok/s", h.source, simulated, note=h.note, flags=flag_refs(h.flags)),
            counter_tokps=figure(r.throughput.counter_window.number(), "tok/s", "server_counter", simulated),
            usage_tokps=figure(r.throughput.usage_window.number(), "tok/s", "usage", simulated),
            **({} if r.throughput.slots_window is None else  # absent, not null, where there is no /slots
               {"slots_tokps": figure(r.throughput.slots_window.number(), "tok/s", "server_slots", simulated)}),
            per_stream_median=figure(r.per_stream.decode_tps_median.number(), "tok/s/stream", "usage", simulated),
            ttft_p50=figure(r.latency.ttft.at("p50"), "s", "client_clock", simulated),
            itl_p99=figure(r.latency.itl.at("p99"), "s", "client_clock", simulated),
            acceptance_length=figure(spec_w.mean_acceptance_length.number()
                                     if spec_w is not None and spec_w.mean_acceptance_length is not None else None,
                                     "tokens/step", "server_counter", simulated),
            requests_ok=r.requests.ok, requests_total=r.requests.total, integrity_holds=r.integrity.holds,
            integrity=r.integrity.message, warnings=list(r.warnings) + trial_warnings(t)))
    return out


