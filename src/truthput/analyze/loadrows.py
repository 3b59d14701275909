"""The figures of one `truthput load` trial as its table and its `--json` show them: throughput with
its source and flags, req/s and prompt tok/s over the window, token totals (the client's against the
counter's), goodput, the client's health, latency percentiles. Computed here once; the views render.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from truthput.load.records import RequestRecord
from truthput.measure.model import TrialResults

@dataclass(frozen=True)
class LoadRow:
    """One `load` trial as its table shows it."""

    level: float
    mode: str
    counter_tps: float | None
    headline_tps: float | None
    headline_source: str
    simulated: bool
    flags: list[str]
    per_stream_flags: list[str]
    counter_set_aside: list[str]
    status: str
    error: str | None
    requests: int
    failed: int
    client_tokens: int | None  # None: the server sent no usage counts
    counter_tokens: float | None
    counter_missing: str | None  # why there is no counter figure, when there is none
    tokens_equal: bool
    requests_per_s: float | None
    prompt_tps: float | None
    total_tps: float | None
    goodput_rps: float | None
    good_fraction: float | None
    client_bound: bool
    client_reason: str | None
    cpu_util: float | None
    lag_p99_ms: float | None
    latency_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)
    latency_missing: dict[str, str] = field(default_factory=dict)
    """Why a latency metric has no figures (e.g. ITL without per-chunk token counts), by metric."""
    """TTFT, TPOT, ITL, E2E: mean, p50, p90, p99 in milliseconds (client clock)."""
    work: dict[str, Any] = field(default_factory=dict)
    """What the ok requests did against what they asked: completion and prompt tokens each (usage
    means; asked: the workload's), and how they ended (finish_reason counts)."""
    warnings: list[str] = field(default_factory=list)
    """The trial's own warnings (other traffic, work other than asked, a suspect scrape)."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrialFlags:
    """What a load trial's views say beside its figures, each as "code: reason" (or the warning's
    text): one home for `load`'s own table and `report` of a stored load run."""

    headline: list[str]
    per_stream: list[str]
    counter_set_aside: list[str]
    """The counter's flags where the headline is usage placed in time instead."""
    warnings: list[str]


def trial_flags(results: TrialResults) -> TrialFlags:
    from truthput.analyze.cells import headline

    h = headline(results)
    return TrialFlags(
        headline=[f"{f.code}: {f.reason}" for f in h.flags],
        per_stream=[f"{f.code}: {f.reason}" for f in results.per_stream.decode_tps_median.flags],
        counter_set_aside=[f"{f.code}: {f.reason}" for f in results.throughput.counter_window.flags]
        if h is not results.throughput.counter_window else [],
        warnings=list(results.warnings))


LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
LATENCY_STATS = ("mean", "p50", "p90", "p99")


def load_row(level: float, mode: str, results: TrialResults, records: Sequence[RequestRecord], status: str,
             error: str | None, client_tokens: int) -> LoadRow:
    """One trial's row: `client_tokens` is the sum of what the client received (its usage, else its
    chunks); shown only where the server sent usage counts."""
    from truthput.analyze.cells import headline
    from truthput.measure.rates import window_rates

    res = results
    gp = res.goodput
    sc = res.client.selfcheck
    counter = res.integrity.counter_delta.number()
    h = headline(res)
    said = trial_flags(res)
    rates = window_rates(records, res.window)
    usage_seen = any(r.completion_tokens is not None or any(x >= 0 for x in r.chunk_tokens) for r in records)
    seen_tokens = client_tokens if usage_seen else None
    tps = h.number()
    latency = {m: {q: (None if (d := res.latency.metric(m)) is None or d.at(q) is None else 1000 * (d.at(q) or 0))
                   for q in LATENCY_STATS} for m in LATENCY_METRICS}
    return LoadRow(
        level=level, mode=mode, counter_tps=res.throughput.counter_window.number(),
        headline_tps=tps, headline_source=h.source, simulated=res.simulated,
        flags=said.headline, per_stream_flags=said.per_stream, counter_set_aside=said.counter_set_aside,
        status=status, error=error,
        requests=len(records), failed=sum(1 for r in records if r.status != "ok"),
        client_tokens=seen_tokens, counter_tokens=counter,
        counter_missing=None if counter is not None else (res.integrity.counter_delta.note or "no counter"),
        tokens_equal=counter is not None and seen_tokens is not None and int(round(counter)) == seen_tokens,
        requests_per_s=rates.requests_per_s, prompt_tps=rates.prompt_tps,
        total_tps=None if tps is None or rates.prompt_tps is None else tps + rates.prompt_tps,
        goodput_rps=gp.goodput_rps.number() if gp is not None and gp.goodput_rps is not None else None,
        good_fraction=gp.good_fraction.number() if gp is not None and gp.good_fraction is not None else None,
        client_bound=bool(sc and sc.client_bound), client_reason=sc.reason if sc else None,
        cpu_util=sc.cpu_util if sc else None, lag_p99_ms=sc.loop_lag_p99_ms if sc else None,
        latency_ms=latency,
        latency_missing={m: (d.mean.note or "no samples") for m in LATENCY_METRICS
                         if (d := res.latency.metric(m)) is not None and d.mean is not None and d.mean.value is None},
        work={"completion_tokens_mean": res.requests.completion_tokens_mean,
              "completion_tokens_asked_mean": res.requests.completion_tokens_asked_mean,
              "prompt_tokens_mean": res.requests.prompt_tokens_mean,
              "prompt_tokens_asked_mean": res.requests.prompt_tokens_asked_mean,
              "finish_reasons": dict(res.requests.finish_reasons)},
        warnings=said.warnings,
    )
