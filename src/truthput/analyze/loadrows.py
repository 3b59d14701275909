"""The figures of one `truthput load` trial as its table and its `--json` show them: throughput with
its source and flags, req/s and prompt tok/s over the window, token totals (the client's against the
counter's), goodput, the client's health, latency percentiles. Computed here once; the views render.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from truthput.analyze.cells import spec_means
from truthput.analyze.rows import DocModel, FlagRef, flag_refs
from truthput.measure.model import Figure
from truthput.load.records import RequestRecord
from truthput.measure.model import Replay, TrialResults

LOAD_SUMMARY_SCHEMA = 1
"""The version of `LoadSummary` a `truthput load` run keeps in `runs.summary_json` (and `load --json`
prints); a load run stored without one (or with another) has its rows rebuilt from its trials."""


class LoadRow(DocModel):
    """One `load` trial as its table, `--json` and the report of the stored run show it."""

    level: float
    """Streams (closed loop) or requests/s offered (open loop)."""
    mode: str
    counter_tps: float | None
    """The server counter's output tok/s over the window (None: no counter figure)."""
    headline_tps: float | None
    """The headline output tok/s (the counter, else usage placed in time; see `headline_source`)."""
    headline_source: str
    simulated: bool
    flags: list[FlagRef] = Field(default_factory=list)
    """Why the headline figure may be wrong (code, reason, figure)."""
    per_stream_flags: list[FlagRef] = Field(default_factory=list)
    counter_set_aside: list[FlagRef] = Field(default_factory=list)
    """The counter's flags where the headline is usage placed in time instead."""
    status: str
    error: str | None
    requests: int
    failed: int
    client_tokens: int | None
    """Completion tokens the client received (None: the server sent no usage counts)."""
    counter_tokens: float | None
    counter_missing: str | None
    """Why there is no counter figure, when there is none."""
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
    latency_ms: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    """TTFT, TPOT, ITL, E2E: mean, p50, p90, p99 in milliseconds (client clock)."""
    latency_missing: dict[str, str] = Field(default_factory=dict)
    """Why a latency metric has no figures (e.g. ITL without per-chunk token counts), by metric."""
    work: dict[str, Any] = Field(default_factory=dict)
    """What the ok requests did against what they asked: completion and prompt tokens each (usage
    means; asked: the workload's), and how they ended (finish_reason counts)."""
    warnings: list[str] = Field(default_factory=list)
    """The trial's own warnings (other traffic, work other than asked, a suspect scrape)."""
    client_notes: list[str] = Field(default_factory=list)
    """What the client noticed (a closed connection resent, ...)."""
    integrity: str | None = None
    """The integrity check's message where it failed (the counter's delta against the client's tokens)."""
    prefix_cache: Figure | None = None
    """The server's prefix-cache hit rate over the window (cached / looked-up prompt tokens, its counters)."""
    replay: Replay | None = None
    """A trace's replay: its fidelity (`measure.model.Replay`: lateness p50/p99/max ms, rates, not sent)."""
    acceptance: Figure | None = None
    """Speculation: accepted / drafted tokens over the window (its counters); None without speculation."""
    acceptance_length: Figure | None = None
    """Speculation: tokens a step emits, 1 + accepted / drafts over the window; None without speculation."""

    @property
    def said(self) -> TrialFlags:
        return TrialFlags(headline=self.flags, per_stream=self.per_stream_flags,
                          counter_set_aside=self.counter_set_aside, warnings=self.warnings)


class LoadSweep(DocModel):
    """A sweep's answer: the saturation point (the lowest level within `tolerance` of the best)."""

    saturation_level: float | None
    saturation_tps: float | None
    saturated: bool
    """Throughput stopped rising (else: still rising at the last level tried)."""
    tolerance: float


class LoadSummary(DocModel):
    """A `truthput load` run: what its table, `--json` and `truthput report` of it show; stored once
    (schema-versioned) as the run ends."""

    schema_: int = Field(LOAD_SUMMARY_SCHEMA, alias="schema")
    url: str
    run_id: str | None
    simulated: bool
    unit: str
    """"streams" (closed loop) or "req/s" (open loop)."""
    goodput: bool = False
    """Latency targets were set, so each row has goodput."""
    levels: list[LoadRow]
    sweep: LoadSweep | None = None
    before_load: list[str] = Field(default_factory=list)
    """What the server did before any load of truthput's (another client's traffic), said in every view."""

    model_config = ConfigDict(populate_by_name=True)

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(by_alias=True, indent=indent)

    @classmethod
    def from_json(cls, text: str | None) -> LoadSummary | None:
        """The stored record; None where there is none or it is of another schema (rebuild it)."""
        try:
            record = cls.model_validate_json(text or "")
        except ValidationError:
            return None
        return record if record.schema_ == LOAD_SUMMARY_SCHEMA else None


class TrialFlags(DocModel):
    """What a load trial's views say beside its figures: one home for `load`'s own table and
    `report` of a stored load run."""

    headline: list[FlagRef]
    per_stream: list[FlagRef]
    counter_set_aside: list[FlagRef]
    """The counter's flags where the headline is usage placed in time instead."""
    warnings: list[str]


def trial_flags(results: TrialResults) -> TrialFlags:
    from truthput.analyze.cells import headline

    h = headline(results)
    return TrialFlags(
        headline=[f.model_copy(update={"figure": "tok/s"}) for f in flag_refs(h.flags)],
        per_stream=[f.model_copy(update={"figure": "per stream"})
                    for f in flag_refs(results.per_stream.decode_tps_median.flags)],
        counter_set_aside=[f.model_copy(update={"figure": "counter"})
                           for f in flag_refs(results.throughput.counter_window.flags)]
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
        client_notes=list(res.client.notes), prefix_cache=res.server_samples.prefix_cache_hit_rate,
        **_speculation(res), replay=res.replay,
        integrity=res.integrity.message if res.integrity.holds is False else None,
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


def _speculation(res: TrialResults) -> dict[str, Figure]:
    """The window's acceptance figures where the trial speculated (absent otherwise)."""
    rate, length = spec_means([res])
    if rate is None and length is None:
        return {}
    return {"acceptance": Figure(value=rate, unit="ratio", source="server_counter", window="window"),
            "acceptance_length": Figure(value=length, unit="tokens/step", source="server_counter", window="window")}
