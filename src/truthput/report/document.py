"""The report document's types (schema "truthput-report/1"), which every view renders.

Why typed: the HTML page, the markdown, the CSV files, the plots, the terminal and `compare` read
one model by attribute, so a view cannot misspell a key, and a figure cannot lose its provenance on
the way (every `Figure` has a `source`). `ReportDocument.to_json()` is the export; `from_json()`
reads one back. Fields left unset are left out of the JSON (a cell that never measured has no
`tokps`), so the export keeps the shape documented in docs/export-schema.md.

The document holds results only; it computes nothing. `report.data` fills it from the analysis
(`analyze/`), and views only render it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from truthput.text import capped, percent
from truthput.analyze.cells import HeadlineBasis

SCHEMA = "truthput-report/1"


class DocModel(BaseModel):
    """Base of every document type: unknown keys are refused, so a misspelt field fails loudly."""

    model_config = ConfigDict(extra="forbid")


class FlagRef(DocModel):
    """A validity flag on a figure: its code, why, and (for a cell) in how many trials."""

    code: str
    reason: str
    figure: str | None = None
    trials: int | None = None
    of: int | None = None


class Figure(DocModel):
    """One number with its provenance. In a simulated run `source` is "simulator" and `read_via`
    keeps the mechanism the figure was read through."""

    value: float | None
    unit: str
    source: str
    read_via: str | None = None
    label: str | None = None
    lo: float | None = None
    hi: float | None = None
    note: str | None = None
    interval: str | None = None
    n_starts: int | None = None
    n_trials: int | None = None
    position: int | None = None
    name: str | None = None
    significant: bool | None = None
    outcome: str | None = None
    level: float | None = None
    additive: bool | None = None
    detail: str | None = None
    flags: list[FlagRef] | None = None

    @property
    def flag_codes(self) -> list[str]:
        return list(dict.fromkeys(f.code for f in self.flags or []))

    @property
    def provenance(self) -> str:
        """The mechanism the figure was read through (the source, or `read_via` when simulated)."""
        return self.read_via or self.source


class LevelRow(DocModel):
    """A row keyed by a load level: streams of a closed loop, or the rate an open loop offered."""

    concurrency: int | None = None
    rate: float | None = None
    level: str = ""


# ---- run and experiment -------------------------------------------------------------------------
class Versions(DocModel):
    truthput: str | None = None
    git: Any = None
    python: str | None = None
    engine: list[str] = Field(default_factory=list)


class RunInfo(DocModel):
    id: str
    name: str | None
    status: str | None
    created_at: Any = None
    finished_at: Any = None
    engine: str | None = None
    simulated: bool
    seed: int | None = None
    experiment_path: str | None = None
    machine: dict[str, Any] = Field(default_factory=dict)
    versions: Versions


class VariantInfo(DocModel):
    name: str
    position: int
    baseline: bool
    argv: list[str]
    diff: Any = None
    diff_lines: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    speculative: dict[str, Any] | None = None
    description: str = ""


class Hardware(DocModel):
    model_config = ConfigDict(extra="allow")
    gpu: str | None = None
    count: int | None = None


class ModelRef(DocModel):
    model_config = ConfigDict(extra="allow")
    profile: str | None = None
    path: str | None = None

    @property
    def label(self) -> str | None:
        return self.profile or self.path


class Slo(DocModel):
    ttft_ms: float | None = None
    itl_ms: float | None = None


class ExperimentInfo(DocModel):
    name: str | None
    path: str | None
    toml: str | None
    parse_error: str | None = None
    base_command: list[str] = Field(default_factory=list)
    base_command_shell: str = ""
    baseline: str | None = None
    variants: list[VariantInfo] = Field(default_factory=list)
    hardware: Hardware | None = None
    model: ModelRef | None = None
    workload: dict[str, Any] | None = None
    measure: dict[str, Any] | None = None
    slo: Slo | None = None


# ---- cells and the verdict ----------------------------------------------------------------------
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

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.tokps is not None and self.tokps.value is not None


class GuardSummary(DocModel):
    n: int
    exact_matches: int
    exact_match_rate: float | None = None
    first_divergence: list[int | None] = Field(default_factory=list)
    verdict: str


class VerdictSection(DocModel):
    from_: str = Field(alias="from")
    lines: list[str] = Field(default_factory=list)
    detail: dict[str, Any] | None = None
    """The verdict object as `analyze.verdict.Verdict.to_dict` writes it (kept whole for readers
    that recompute it; no view reads into it)."""
    failed: dict[str, str] = Field(default_factory=dict)
    guard: dict[str, GuardSummary] = Field(default_factory=dict)
    stopping: dict[str, Any] | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---- the sections -------------------------------------------------------------------------------
class AuditEntry(LevelRow):
    variant: str
    method: str
    tokps: float | None
    error_pct_vs_counter: float | None
    cause: str
    causes: dict[str, int] = Field(default_factory=dict)
    source: str
    measured_source: str
    n_trials: int
    simulated: bool
    note: str = ""
    flags: list[str] = Field(default_factory=list)
    reference: str = "counter (window)"


class SpecDecodeRow(LevelRow):
    variant: str
    k: int | None
    method: str | None
    note: str | None = None
    per_position: list[Figure] = Field(default_factory=list)
    mean_acceptance_length: Figure
    acceptance_rate: Figure
    n_trials: int


class LatencyRow(LevelRow):
    variant: str
    ttft_ms: list[float] = Field(default_factory=list)
    itl_ms: list[float] = Field(default_factory=list)
    n_requests: int
    n_failed: int
    from_results: list[Any] = Field(default_factory=list)
    requests_per_s: Figure | None = None
    prompt_tps: Figure | None = None
    kv_usage_max: Figure | None = None
    waiting_mean: Figure | None = None
    waiting_max: Figure | None = None
    preemptions: Figure | None = None
    source: str
    note: str


class GoodputRow(LevelRow):
    variant: str
    slo: Slo
    goodput_rps: Figure
    good_tokens_per_s: Figure
    good_fraction: Figure
    n_trials: int


class RoofCell(LevelRow):
    variant: str
    tp: int
    kv_cache_dtype: str
    kv_dtype_bytes: float
    spec_k: int
    acceptance_length: float | None
    measured: Figure
    tightest_ceiling: Figure
    no_spec_ceiling: Figure | None = None
    pct_of_tightest: Figure
    pct_of_weight_streaming: Figure
    measured_step_ms: Figure
    unexplained_ms: Figure
    bounds_ms: dict[str, Figure]
    weight_passes_per_s: Figure
    binding: str | None
    sentence: str
    reading: str
    roofline: dict[str, Any]
    placement: dict[str, Any]


class RooflineDoc(DocModel):
    available: bool
    reason: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    model: str | None = None
    context_tokens: int | None = None
    context_basis: str | None = None
    cells: list[RoofCell] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    source_note: str | None = None

    def no_spec_ceilings(self) -> dict[int, float]:
        """Per concurrency, the aggregate ceiling without speculation (what check-claims bounds by)."""
        return {r.concurrency: float(r.no_spec_ceiling.value) for r in self.cells
                if r.concurrency is not None and r.no_spec_ceiling is not None and r.no_spec_ceiling.value is not None}


class ClaimEntry(DocModel):
    text: str
    verdict: str
    reason: str
    claimed: dict[str, Any] = Field(default_factory=dict)
    measured: dict[str, Any] | None = None
    bound: dict[str, Any] | None = None
    likely_cause: str | None = None


class ClaimsDoc(DocModel):
    present: bool
    results: list[ClaimEntry] = Field(default_factory=list)
    error: str | None = None
    bounds_note: str | None = None


class FailureRow(LevelRow):
    kind: str
    variant: str
    start_index: int
    trial_index: int | None = None
    failure_class: str | None
    reason: str | None
    line: str | None = None
    log_excerpt: str = ""
    argv: list[str] | None = None
    source: str


class TelemetryEntry(LevelRow):
    variant: str
    gpu: int
    samples: int
    util_pct_mean: Figure
    mem_used_gb_max: Figure
    power_w_mean: Figure
    sm_clock_mhz_mean: Figure


class TelemetryDoc(DocModel):
    available: bool
    note: str | None = None
    util_note: str
    rows: list[TelemetryEntry] = Field(default_factory=list)
    samples: int = 0


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
    per_stream_median: Figure
    ttft_p50: Figure
    itl_p99: Figure
    acceptance_length: Figure
    requests_ok: int
    requests_total: int
    integrity_holds: bool | None = None
    integrity: str | None = None
    warnings: list[str] = Field(default_factory=list)


class EventEntry(DocModel):
    t_wall: float | None
    kind: str
    message: str | None


class ReportDocument(DocModel):
    """Everything a run's reports show."""

    schema_: str = Field(SCHEMA, alias="schema")
    generated_at: str
    simulated: bool
    simulated_note: str | None = None
    run: RunInfo
    experiment: ExperimentInfo
    cells: list[CellRow] = Field(default_factory=list)
    headline: HeadlineBasis = Field(default_factory=lambda: HeadlineBasis("server counter", "", main="server_counter"))
    """What the cells' tok/s are (from their sources): every view's header and footnote say it."""
    verdict: VerdictSection
    warnings: list[str] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list)
    audit: list[AuditEntry] = Field(default_factory=list)
    audit_against: str = "the server counter"
    """What the audit's errors are measured against (each cell's headline: `analyze.audit.audit_reference`)."""
    spec_decode: list[SpecDecodeRow] = Field(default_factory=list)
    latency: list[LatencyRow] = Field(default_factory=list)
    goodput: list[GoodputRow] | None = None
    roofline: RooflineDoc
    claims: ClaimsDoc
    failures: list[FailureRow] = Field(default_factory=list)
    telemetry: TelemetryDoc
    trials: list[TrialEntry] = Field(default_factory=list)
    events: list[EventEntry] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @property
    def ok_cells(self) -> list[CellRow]:
        return [c for c in self.cells if c.ok]

    @property
    def variant_names(self) -> list[str]:
        return [v.name for v in self.experiment.variants]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = clean(self.model_dump(mode="json", by_alias=True, exclude_unset=True))
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ReportDocument":
        return cls.model_validate(data)


# ---- compare ------------------------------------------------------------------------------------
class RunHead(DocModel):
    store: str
    id: str
    name: str | None
    created_at: Any = None
    engine: str | None = None
    simulated: bool
    engine_versions: list[str] = Field(default_factory=list)
    truthput: str | None = None
    host: str | None = None


class Ratio(DocModel):
    value: float | None
    lo: float | None
    hi: float | None
    unit: str
    source: str
    pct: float | None
    pct_lo: float | None
    pct_hi: float | None
    p_value: float | None
    significant: bool
    method: str
    correction: str
    warning: str | None = None
    outcome: str | None = None


class CompareRow(LevelRow):
    variant: str
    a: Figure
    b: Figure
    ratio: Ratio
    same_argv: bool


class CompareDocument(DocModel):
    """Two runs' shared cells side by side (`truthput compare`)."""

    a: RunHead
    b: RunHead
    rows: list[CompareRow] = Field(default_factory=list)
    only_a: list[list[str]] = Field(default_factory=list)
    only_b: list[list[str]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = clean(self.model_dump(mode="json", exclude_unset=True))
        return out

    def slower_cells(self, threshold: float) -> list[str]:
        """Cells whose B/A interval lies wholly below 1 - threshold (a regression a gate fails on)."""
        out = []
        for r in self.rows:
            q = r.ratio
            if q.hi is not None and q.hi < 1.0 - threshold:
                out.append(f"{r.variant} {r.level} ({percent(q.pct or 0.0)}, CI {capped(q.pct_lo or 0.0, '{:+.1f}')}.."
                           f"{capped(q.pct_hi or 0.0, '{:+.1f}')})")
        return out


def clean(obj: Any) -> Any:
    """Strict-JSON copy: NaN/inf -> None, tuples -> lists, unknown objects -> str."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return clean(obj.item())
    except ImportError:  # pragma: no cover
        pass
    return str(obj)


# ---- tune ---------------------------------------------------------------------------------------
class TuneRow(DocModel):
    """One configuration: the simulator's figure (and corrected), the server's where measured."""

    config: str
    simulated: float | None = None
    corrected: float | None = None
    simulated_itl_p99_s: float | None = None
    server: float | None = None
    server_itl_p99_s: float | None = None
    server_starts: int = 0
    server_failure: str | None = None
    feasible_on_server: bool = False


class TuneRound(DocModel):
    index: int
    run: str | None
    candidates: list[str] = Field(default_factory=list)
    winner: str | None = None
    lines: list[str] = Field(default_factory=list)


class TunePoint(DocModel):
    value: float | None
    itl_p99_s: float | None = None
    config: str | None = None


class TuneCorrection(DocModel):
    intercept: float | None = None
    sd: float | None = None
    points: int = 0


class TuneDocument(DocModel):
    """A tune search for the terminal, the HTML report and `tune.json` (`tune.driver.outcome_document`)."""

    name: str
    objective: str
    figure: str
    level: str
    screened: int
    screen_failed: int
    screen_cpu_s: float
    rounds: list[TuneRound] = Field(default_factory=list)
    measured: list[TuneRow] = Field(default_factory=list)
    top_simulated: list[TuneRow] = Field(default_factory=list)
    simulator_points: list[TunePoint] = Field(default_factory=list)
    front: list[TunePoint] = Field(default_factory=list)
    chosen: str | None = None
    chosen_line: str | None = None
    chosen_run: str | None = None
    chosen_variant: str | None = None
    server_minutes: float
    server_starts: int
    rank_correlation: float | None = None
    rank_pairs: int = 0
    stop_reason: str | None = None
    correction: TuneCorrection
    server_simulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = clean(self.model_dump(mode="json"))
        return out
