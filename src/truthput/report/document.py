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
from typing import Any

from pydantic import ConfigDict, Field

from truthput.text import capped, percent
from truthput.analyze.cells import HeadlineBasis
from truthput.analyze.audit import AuditEntry
from truthput.analyze.claims import ClaimResult
from truthput.analyze.placement import RoofCell, RooflineDoc
from truthput.analyze.compare import CompareRow, Ratio
from truthput.analyze.latency import GoodputRow, LatencyRow
from truthput.analyze.specdecode import SpecDecodeRow
from truthput.analyze.tables import CellRow, TrialEntry
from truthput.analyze.telemetry import TelemetryEntry
from truthput.analyze.rows import DocModel, Figure, FlagRef, LevelRow, Slo, clean
from truthput.analyze.guard import GuardResult
from truthput.analyze.summary import StoppingInfo
from truthput.analyze.verdict import Verdict
from truthput.experiment.file import HardwareSection, ModelSection

__all__ = ["SCHEMA", "AuditEntry", "CellRow", "TrialEntry", "CompareRow", "Ratio", "DocModel", "Figure", "FlagRef", "GoodputRow", "LatencyRow", "LevelRow", "RoofCell", "RooflineDoc", "Slo", "SpecDecodeRow", "TelemetryEntry", "clean"]

SCHEMA = "truthput-report/1"


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


class ExperimentInfo(DocModel):
    name: str | None
    path: str | None
    toml: str | None
    parse_error: str | None = None
    base_command: list[str] = Field(default_factory=list)
    base_command_shell: str = ""
    baseline: str | None = None
    variants: list[VariantInfo] = Field(default_factory=list)
    hardware: HardwareSection | None = None
    model: ModelSection | None = None
    workload: dict[str, Any] | None = None
    workload_shares: str | None = None
    """What the workload's prompts share by design (said beside the server's prefix-cache hits)."""
    measure: dict[str, Any] | None = None
    slo: Slo | None = None


# ---- cells and the verdict ----------------------------------------------------------------------
class VerdictSection(DocModel):
    from_: str = Field(alias="from")
    """Where the verdict comes from: the run's stored decision, or computed from its trials now."""
    lines: list[str] = Field(default_factory=list)
    """Everything the verdict says, in order, rendered from `detail` (`Verdict.lines`)."""
    detail: Verdict | None = None
    """The verdict, typed: per level and metric every comparison with its estimate, outcome, the
    flags it rests on, the winner, the decision and diagnostic lines; failures; method notes."""
    failed: dict[str, str] = Field(default_factory=dict)
    """Variant -> why it produced no measurement."""
    guard: dict[str, GuardResult] = Field(default_factory=dict)
    """Variant -> its greedy outputs compared with the baseline's (the output guard)."""
    stopping: StoppingInfo | None = None
    """How the stopping rule ran (method, starts used, looks, a fixed design's starts)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---- the sections -------------------------------------------------------------------------------
class ClaimsDoc(DocModel):
    present: bool
    results: list[ClaimResult] = Field(default_factory=list)
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


class TelemetryDoc(DocModel):
    available: bool
    note: str | None = None
    util_note: str
    rows: list[TelemetryEntry] = Field(default_factory=list)
    samples: int = 0


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
