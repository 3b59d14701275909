"""The figures and rows the analysis hands to every view: one number with its provenance (`Figure`)
and the base of every row keyed by a load level (`LevelRow`).

Why here: each `analyze/` module returns its results as these typed rows (`audit.AuditEntry`,
`latency.LatencyRow`, `specdecode.SpecDecodeRow`, ...), and the report document (`report.document`)
holds them as they are, so a figure crosses two places: the result that computes it and the views
that show it. Unknown keys are refused, so a misspelt field fails loudly (mypy's pydantic plugin
checks the keywords)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from pydantic import BaseModel, ConfigDict
from typing_extensions import Unpack

from truthput.experiment.levels import Level, level_from_json

if TYPE_CHECKING:
    from truthput.analyze.cells import CellFlag
    from truthput.measure.model import Flag


class DocModel(BaseModel):
    """Base of every document type: unknown keys are refused, so a misspelt field fails loudly. A
    field's docstring is its description, which docs/export-schema.md's generated key list shows
    (scripts/make_schema_doc.py)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


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

    @property
    def key(self) -> Level:
        """The row's load level (`levels.level_json`'s inverse)."""
        return level_from_json(self)


class Slo(DocModel):
    """Latency targets (milliseconds) that goodput counts requests against."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def text(self) -> str:
        """The targets set, as a reader sees them: "ttft_ms ≤ 200, e2e_ms ≤ 4000"."""
        return ", ".join(f"{k} ≤ {v:g}" for k, v in self.model_dump().items() if v is not None)


class FigureExtra(TypedDict, total=False):
    """What a figure may carry besides its value, unit and source (`Figure`'s fields)."""

    label: str | None
    lo: float | None
    hi: float | None
    note: str | None
    interval: str | None
    n_starts: int | None
    n_trials: int | None
    position: int | None
    name: str | None
    significant: bool | None
    outcome: str | None
    level: float | None
    additive: bool | None
    detail: str | None
    flags: list[FlagRef] | None


def figure(value: float | None, unit: str, source: str, simulated: bool, **extra: Unpack[FigureExtra]) -> Figure:
    """A figure with provenance; in a simulated run the source is 'simulator' (read via `source`),
    except a model's figure (a ceiling, a bound), which no server produced. Non-finite numbers: null."""
    fields: dict[str, Any] = {k: clean(v) if not isinstance(v, list) else v for k, v in extra.items()}
    if simulated and source != "model":
        return Figure(value=clean(value), unit=unit, source="simulator", read_via=source, **fields)
    return Figure(value=clean(value), unit=unit, source=source, **fields)


def flag_refs(flags: Sequence[CellFlag | Flag]) -> list[FlagRef]:
    """A figure's or a cell's validity flags as the document keeps them."""
    from truthput.analyze.cells import CellFlag

    return [FlagRef(code=f.code, reason=f.reason, figure=f.figure, trials=f.trials, of=f.of)
            if isinstance(f, CellFlag) else FlagRef(code=f.code, reason=f.reason) for f in flags]


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
