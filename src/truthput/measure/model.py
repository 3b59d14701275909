"""The results model: every figure of a trial, typed, with its provenance and validity flags.

Why typed: every view (terminal tables, `load`, reports, exports, compare, claims, the verdict)
reads the same attributes of the same objects, so no view re-derives a figure from string paths
into an untyped dict and drifts from the others. `measure_trial` builds a `TrialResults` once;
the store keeps `TrialResults.to_json_dict()` and reads it back with `TrialResults.from_stored`,
which also converts what earlier versions of truthput wrote (results schema 1).

A `Figure` is a value (or None: missing data, never 0) with its unit, its source (one of
`SOURCES`: principle 1, every number has a provenance), the window it covers, a note, and
validity flags: the checks that found a reason the figure may be wrong. Extra keyword fields
(interval bounds, the metric name, counts behind the figure) ride along unvalidated.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from truthput.load.rows import RowUse

RESULTS_SCHEMA = 2
"""Version of the stored trial-results document (1: the untyped dict of truthput 0.1)."""

SOURCES = ("server_counter", "server_slots", "usage", "tokenizer", "chunks", "words", "log_line", "client_clock",
           "simulator", "model")


class Flag(BaseModel):
    """A named reason a figure may be wrong (computed from what was observed)."""

    model_config = ConfigDict(frozen=True)

    code: str
    reason: str


class Figure(BaseModel):
    """One number with its provenance."""

    model_config = ConfigDict(extra="allow")

    value: float | int | None = None
    unit: str = ""
    source: str = "server_counter"
    note: str | None = None
    window: str | None = None
    flags: list[Flag] = Field(default_factory=list)

    @field_validator("value", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        if v is None or isinstance(v, bool):
            return None if v is None else int(v)
        try:
            import numpy as np

            if isinstance(v, np.integer):
                return int(v)
            if isinstance(v, np.floating):
                v = float(v)
        except ImportError:  # pragma: no cover
            pass
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    @field_validator("source")
    @classmethod
    def _known_source(cls, v: str) -> str:
        if v not in SOURCES:
            raise ValueError(f"unknown figure source {v!r}")
        return v

    @property
    def flagged(self) -> bool:
        return bool(self.flags)

    def number(self) -> float | None:
        """The value as a float (None when missing)."""
        return None if self.value is None else float(self.value)

    def extra(self, key: str, default: Any = None) -> Any:
        """An extra field (interval bounds, counts, the metric name) or `default`."""
        return (self.model_extra or {}).get(key, default)


def missing(unit: str, source: str, note: str) -> Figure:
    return Figure(value=None, unit=unit, source=source, note=note)


class Section(BaseModel):
    """Base of every section: unknown keys from other versions are kept, not lost."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Window(Section):
    start: float | None = None
    end: float | None = None
    seconds: float | None = None
    basis: str | None = Field(default=None, alias="from")


class ScrapeRef(Section):
    phase: str
    t_mono: float
    error: str | None = None


class ErrorCount(Section):
    error: str
    count: int


class Requests(Section):
    total: int = 0
    ok: int = 0
    failed: int = 0
    failed_mid_stream: int = 0
    continuous_usage: int = 0
    errors: list[ErrorCount] = Field(default_factory=list)
    failed_not_stored: int = 0
    """Failed requests beyond the per-trial cap of stored rows (counted here, not stored one by one)."""
    completion_tokens_mean: float | None = None
    """Mean usage.completion_tokens of the ok requests (the work each did; None without usage)."""
    prompt_tokens_mean: float | None = None
    """Mean usage.prompt_tokens of the ok requests: the prompt as the server counted it."""
    completion_tokens_sd: float | None = None
    """The spread (standard deviation) of the ok requests' usage.completion_tokens: a workload of
    the user's rows asks each for its own length."""
    prompt_tokens_sd: float | None = None
    """The spread of the ok requests' usage.prompt_tokens."""
    prompt_tokens_asked_mean: float | None = None
    """Mean prompt length the ok requests were built to (None where the workload does not set one)."""
    completion_tokens_asked_mean: float | None = None
    """Mean output length the ok requests asked for (max_tokens; None where the workload does not set one)."""
    work_notes: list[str] = Field(default_factory=list)
    """Where the ok requests did other work than they asked (outputs cut short, prompts of another
    length): `measure.validity.check_work`'s sentences, also in the trial's warnings."""
    finish_reasons: dict[str, int] = Field(default_factory=dict)
    """How the ok requests ended, by finish_reason (e.g. {"length": 40}; "stop" before max_tokens
    under ignore_eos means a limit cut the output)."""


class Integrity(Section):
    """Whole-trial identity: counter delta pre->post == usage of the trial's requests."""

    counter_delta: Figure = Field(default_factory=lambda: missing("tokens", "server_counter", "not recorded"))
    usage_sum_ok: Figure = Field(default_factory=lambda: missing("tokens", "usage", "not recorded"))
    failed_requests: int = 0
    failed_partial_tokens: Figure = Field(default_factory=lambda: missing("tokens", "usage", "not recorded"))
    failed_without_count: int = 0
    failed_chunks_without_count: int = 0
    ok_without_usage: int = 0
    holds: bool | None = None
    difference: int | None = None
    message: str = ""


COUNT_WRONG_FLAGS = frozenset({"stale_counter", "counter_reset", "foreign_traffic", "counter_exceeds_usage"})
NOT_COMPARED_FLAGS = COUNT_WRONG_FLAGS | {"unequal_work", "replay_behind"}
"""Flags on a headline that keep its cell out of every tok/s comparison: a count known to be wrong,
or a variant whose requests did other work than the baseline's (`unequal_work`: fewer tokens
each, another prompt), whose tok/s is not the same quantity."""
"""The one definition of a WRONG figure: flags that say the count itself is wrong (a stale, restarted
or foreign-token counter; `counter_exceeds_usage` is what stores before `foreign_traffic` called
it), not that the conditions were poor. Every other flag says a figure is UNCERTAIN (a busy host, a
load not reached, timestamps that cannot resolve decoding): shown everywhere, but it may still be
compared. A headline figure that carries a wrong flag never decides a comparison
(`truthput.analyze.cells.Cell.wrong`)."""


class IntervalRow(Section):
    start_phase: str = Field(alias="from")
    end_phase: str = Field(alias="to")
    t_from: float
    t_to: float
    counter: float | None = None
    usage_arrived: int = 0
    resets: int = 0
    difference: float | None = None
    slack: float | None = None  # tokens the two counts may differ by through the edges (None: not judged)


class ScrapeIntervals(Section):
    rows: list[IntervalRow] = Field(default_factory=list)
    stale_suspected: bool | None = None
    note: str = ""


class Throughput(Section):
    """Output rates over the steady-state window, by every way of counting."""

    counter_window: Figure = Field(default_factory=lambda: missing("tok/s", "server_counter", "not recorded"))
    usage_window: Figure = Field(default_factory=lambda: missing("tok/s", "usage", "not recorded"))
    tokenizer_window: Figure = Field(default_factory=lambda: missing("tok/s", "tokenizer", "not recorded"))
    chunks_window: Figure = Field(default_factory=lambda: missing("chunks/s", "chunks", "not recorded"))
    words_window: Figure = Field(default_factory=lambda: missing("words/s", "words", "not recorded"))
    slots_window: Figure | None = None
    """llama.cpp's live per-task progress (`/slots`) over the window (`measure.slots`); None where
    the server has no /slots."""


class WholeTrial(Section):
    """Figures over the whole trial (ramp-up and drain included) and unit conversions."""

    usage_trial: Figure = Field(default_factory=lambda: missing("tok/s", "usage", "not recorded"))
    counter_trial: Figure = Field(default_factory=lambda: missing("tok/s", "server_counter", "not recorded"))
    words_per_token: Figure | None = None
    tokenizer_vs_usage: Figure | None = None
    word_probe_per_request: Figure = Field(default_factory=lambda: missing("words/s", "words", "not recorded"))


class Check(Section):
    ok: bool | None = None
    numbers: dict[str, Any] = Field(default_factory=dict)
    message: str = ""


class SpecInterval(Section):
    interval: str = ""
    drafts: Figure | None = None
    draft_tokens: Figure | None = None
    accepted_tokens: Figure | None = None
    acceptance_rate: Figure | None = None
    mean_acceptance_length: Figure | None = None
    per_position_acceptance: list[Figure] = Field(default_factory=list)
    undrafted_steps: Figure | None = None
    share_steps_without_draft: Figure | None = None
    checks: dict[str, Check] = Field(default_factory=dict)


class SpecDecode(Section):
    k: int | None = None
    method: str | None = None
    note: str | None = None
    trial: SpecInterval | None = None
    window: SpecInterval | None = None
    accept_length_window: Figure | None = None

    def best_interval(self) -> SpecInterval | None:
        """The window's statistics, else the whole trial's."""
        return self.window or self.trial


class LogLines(Section):
    lines_seen: int = 0
    spec_lines_seen: int = 0
    generation_mean_window: Figure = Field(default_factory=lambda: missing("tok/s", "log_line", "not recorded"))
    generation_peak_window: Figure = Field(default_factory=lambda: missing("tok/s", "log_line", "not recorded"))
    generation_peak_trial: Figure | None = None
    kv_kind: str | None = None
    spec_accepted_tps: Figure | None = None
    spec_drafted_tps: Figure | None = None
    drafted_plus_accepted_vs_generation: Check | None = None
    drafted_plus_accepted_explanation: str | None = None


class PerStream(Section):
    decode_tps_mean: Figure = Field(default_factory=lambda: missing("tok/s/stream", "usage", "not recorded"))
    decode_tps_median: Figure = Field(default_factory=lambda: missing("tok/s/stream", "usage", "not recorded"))
    n: int = 0
    aggregate_tps: Figure = Field(default_factory=lambda: missing("tok/s", "server_counter", "not recorded"))


class Distribution(Section):
    n: int = 0
    mean: Figure | None = None
    p50: Figure | None = None
    p90: Figure | None = None
    p99: Figure | None = None

    def at(self, name: str) -> float | None:
        """The stored figure `name` ("p50", "p99", "mean") as a number; None where it is missing."""
        f = getattr(self, name, None)
        return f.number() if isinstance(f, Figure) else None


class Latency(Section):
    ttft: Distribution = Field(default_factory=Distribution)
    e2e: Distribution = Field(default_factory=Distribution)
    tpot: Distribution = Field(default_factory=Distribution)
    itl: Distribution = Field(default_factory=Distribution)
    chunk_gap: Distribution = Field(default_factory=Distribution)
    server_window: dict[str, Distribution] = Field(default_factory=dict)

    def metric(self, name: str) -> Distribution | None:
        d = getattr(self, name, None)
        return d if isinstance(d, Distribution) else None


class MethodRow(Section):
    """One way of counting output over the window, set against the reference."""

    method: str
    tokps: float | None = None
    error_pct_vs_counter: float | None = None
    cause: str = "missing data"
    source: str = "server_counter"
    note: str = ""
    breakdown_pct: dict[str, float | None] | None = None
    reference: str | None = None
    flags: list[Flag] = Field(default_factory=list)
    """The validity flags of the figure this row reports (the counter's, usage's)."""


class SelfCheckFigures(Section):
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    cpu_s: float | None = None
    cpu_util: float | None = None
    client_bound: bool = False
    reason: str | None = None
    lag_samples: int = 0


class ClientCheck(Section):
    """Was the load generator itself the bottleneck?"""

    selfcheck: SelfCheckFigures | None = None
    notes: list[str] = Field(default_factory=list)
    never_settled: bool = False
    continuous_usage: bool | None = None
    token_total: int | None = None


class Replay(Section):
    """How faithfully a trace was replayed: each send against its scheduled moment (client clock)."""

    scheduled: int = 0
    """Requests the replayed slice holds."""
    sent: int = 0
    lateness_p50_ms: float | None = None
    lateness_p99_ms: float | None = None
    lateness_max_ms: float | None = None
    requested_rate: float | None = None
    """Requests per second the schedule asks for (first to last arrival)."""
    achieved_rate: float | None = None
    """Requests per second sent (first to last send)."""


class ServerSamples(Section):
    """/metrics sampled during the window: what the server itself saw of the load."""

    n: int = 0
    interval_s: float | None = None
    running_mean: Figure | None = None
    running_min: Figure | None = None
    running_max: Figure | None = None
    waiting_mean: Figure | None = None
    waiting_max: Figure | None = None
    kv_usage_mean: Figure | None = None
    """The server's KV-cache use gauge (a fraction of its blocks) at the scrapes inside the window."""
    kv_usage_max: Figure | None = None
    preemptions: Figure | None = None
    """Requests the server preempted between the window's first and last scrape (its counter's delta)."""
    prefix_cache_hit_rate: Figure | None = None
    """The share of the prompt tokens the server looked up in its prefix cache over the window that
    it found cached (its hits / queries counters); null with why where the engine exposes none."""
    prefix_cache_per_request: Figure | None = None
    """The same share from the requests' own answers (llama.cpp's `timings.cache_n`, vLLM's
    `usage.prompt_tokens_details.cached_tokens`) over the requests that ended in the window; None
    where no answer says."""
    note: str = ""


class Interference(Section):
    """Was the server alone in the window: other processes' CPU on this host, the GPU's."""

    host_other_cores: Figure | None = None
    host_cores: int | None = None
    server_cores: Figure | None = None
    server_front_cores: Figure | None = None
    gpu_throttle_samples: dict[str, int] = Field(default_factory=dict)
    gpu_foreign_pids: list[int] = Field(default_factory=list)
    note: str = ""


class Validity(Section):
    """Which validity checks ran on this trial, and which could not (and why)."""

    applied: list[str] = Field(default_factory=list)
    not_applied: list[str] = Field(default_factory=list)


class LoadLevel(Section):
    mode: str = "closed"
    level: float = 0.0
    unit: str = "streams"
    arrival: str | None = None
    max_in_flight_seen: int | None = None
    workers: int = 1


class Goodput(Section):
    slo: dict[str, float | None] = Field(default_factory=dict)
    window: dict[str, Any] | None = None
    requests: int | None = None
    good_fraction: Figure | None = None
    goodput_rps: Figure | None = None
    good_tokens_per_s: Figure | None = None


class TrialResults(Section):
    """Every figure of one trial (what `trials.results_json` holds)."""

    schema_version: int = Field(default=RESULTS_SCHEMA, alias="schema")
    engine: str = "vllm"
    counter_moves: str = "per_step"
    """When the engine's emitted-token counter rises ("per_step" or "per_request"; see
    `measure.names.EngineMetricNames.counter_moves`): it decides which window figure is the headline."""
    concurrency: int = 0
    speculative: dict[str, Any] | None = None
    simulated: bool = False
    window: Window = Field(default_factory=Window)
    scrapes: list[ScrapeRef] = Field(default_factory=list)
    emitted_metric: str | None = None
    requests: Requests = Field(default_factory=Requests)
    integrity: Integrity = Field(default_factory=Integrity)
    scrape_intervals: ScrapeIntervals = Field(default_factory=ScrapeIntervals)
    throughput: Throughput = Field(default_factory=Throughput)
    whole_trial: WholeTrial = Field(default_factory=WholeTrial)
    spec_decode: SpecDecode | None = None
    log_line: LogLines = Field(default_factory=LogLines)
    per_stream: PerStream = Field(default_factory=PerStream)
    latency: Latency = Field(default_factory=Latency)
    methods: list[MethodRow] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    server_samples: ServerSamples = Field(default_factory=ServerSamples)
    client: ClientCheck = Field(default_factory=ClientCheck)
    validity: Validity = Field(default_factory=Validity)
    interference: Interference = Field(default_factory=Interference)
    telemetry: dict[str, Any] | None = None
    load: LoadLevel | None = None
    goodput: Goodput | None = None
    replay: Replay | None = None
    """A trace's replay: its fidelity (None: not a replay)."""
    cache: str | None = None
    """What was done to the server's prefix cache before this window (`[workload] cache`: reset and
    checked, or primed); None: as it was."""
    rows: RowUse | None = None
    """The user's rows the trial sent (a file of prompts), and how many the server had been sent before."""

    def headline(self) -> Figure:
        """The figure this trial is judged by, with its provenance.

        The server's emitted-token counter over the steady-state window, unless a validity check
        flagged it and the running usage counts placed in the same window are clean; then those.
        For an engine whose counter moves only when a request ends, usage placed in time first.
        A flagged figure is chosen only when nothing clean exists, and it carries its flags into
        every view. Without either figure: a missing figure that says why.
        """
        counter, usage = self.throughput.counter_window, self.throughput.usage_window
        # A counter that adds a request's tokens when it ends counts whole requests, not a window:
        # there usage placed in time is the window's figure in every trial (one estimator for a
        # whole cell), and the counter checks it over whole requests (the validity bounds).
        order = (usage, counter) if self.counter_moves == "per_request" else (counter, usage)
        for fig in order:
            if fig.value is not None and not fig.flagged:
                return fig
        # both flagged: a count known to be wrong (a stale, reset or foreign-token counter) gives
        # way to one whose flags speak only of the conditions (a busy host, a load not reached)
        for fig in sorted(order, key=lambda f: any(fl.code in COUNT_WRONG_FLAGS for fl in f.flags)):
            if fig.value is not None:
                return fig
        return Figure(value=None, unit="tok/s", source="server_counter", window="window",
                      note=f"no headline figure: counter: {counter.note or 'missing'}; usage: {usage.note or 'missing'}")


    def to_json_dict(self) -> dict[str, Any]:
        """The stored document (strict JSON: missing values are null)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)

    @classmethod
    def from_stored(cls, doc: dict[str, Any] | None) -> "TrialResults":
        """A stored document of any results schema, converted to this one."""
        if not doc:
            return cls()
        if int(doc.get("schema", 1)) > RESULTS_SCHEMA:
            from truthput.errors import StoreError

            raise StoreError(f"trial results schema {doc.get('schema')} is newer than this truthput "
                             f"reads ({RESULTS_SCHEMA}): upgrade truthput")
        if int(doc.get("schema", 1)) < 2:
            doc = _from_schema_1(doc)
        return cls.model_validate(doc)


_WHOLE_TRIAL_KEYS = ("usage_trial", "counter_trial", "words_per_token", "tokenizer_vs_usage", "word_probe_per_request")


def _from_schema_1(doc: dict[str, Any]) -> dict[str, Any]:
    """Results written by truthput 0.1: whole-trial figures lived under `throughput`."""
    doc = dict(doc)
    tp = dict(doc.get("throughput") or {})
    whole = {k: tp.pop(k) for k in _WHOLE_TRIAL_KEYS if k in tp}
    doc["throughput"] = tp
    doc["whole_trial"] = whole
    methods = []
    for row in doc.get("methods") or []:
        if isinstance(row, dict) and row.get("method") == "word probe per request (seed)":
            row = {**row, "method": "word probe per request"}
        methods.append(row)
    doc["methods"] = methods
    probe = whole.get("word_probe_per_request")
    if isinstance(probe, dict) and str(probe.get("note") or "").startswith("seed's probe:"):
        whole["word_probe_per_request"] = {**probe, "note": "per-request probe:" + probe["note"][len("seed's probe:"):]}
    client = doc.get("client")
    if isinstance(client, dict) and client.get("never_settled") is None:
        doc["client"] = {**client, "never_settled": False}
    doc["schema"] = RESULTS_SCHEMA
    return doc
