"""The audit: every counting method's tok/s beside the counter, per variant x concurrency, with why.

Input is the stored trials (their results model). Trials of the same variant and concurrency are
pooled: a method's figure is the mean over trials, its error the mean of per-trial errors vs that
trial's counter, its cause the most frequent classification in that cell (each cell its own).
Cells come in the order of the throughput table: variant order, then concurrency.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from pydantic import Field

from truthput.analyze.cells import TrialLike, group_trials, hit_rate_of
from truthput.analyze.rows import LevelRow, clean
from truthput.measure.model import Check, MethodRow, TrialResults
from truthput.experiment.levels import Level, level_json


class AuditEntry(LevelRow):
    """One counting method in one cell: its tok/s (mean over the cell's trials), its error vs each
    trial's headline (mean), and the cause most often classified."""

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
    """Validity flag codes on this method's figure in any of the cell's trials."""
    reference: str = "counter (window)"
    """What the cell's errors are measured against: its trials' headline figure."""


@dataclass
class IntegrityRow:
    variant: str
    level: Level
    trials: int
    identity_held: int
    identity_failed: list[str] = field(default_factory=list)
    identity_unchecked: int = 0
    spec_checks_failed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    prefix_cache_hit_rate: float | None = None
    """The server's prefix-cache hit rate over the windows (its counters), mean over the cell's trials."""
    cache: list[str] = field(default_factory=list)
    """What was done to the cache before the windows (`[workload] cache`: reset and checked, primed)."""
    flags: list[str] = field(default_factory=list)
    """The flags on the cell's headline figures ("code: reason", once each), whatever check raised them."""

    def to_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc.pop("level")
        return {"variant": self.variant, **level_json(self.level), **doc}


def method_groups(items: Iterable[TrialLike]) -> dict[tuple[str, Level], list[TrialResults]]:
    """Ok trials' results with method rows, by (variant, level) (`cells.group_trials`)."""
    groups = {key: [t.results for t in ts if t.status == "ok" and t.results.methods]
              for key, ts in group_trials(items).items()}
    return {key: rs for key, rs in groups.items() if rs}


def _ordered(groups: dict[tuple[str, Level], list[TrialResults]]) -> list[tuple[str, Level]]:
    variants = list(dict.fromkeys(v for v, _c in groups))
    return sorted(groups, key=lambda k: (variants.index(k[0]), k[1]))


def audit_rows(trials: Sequence[TrialLike], simulated: bool = False) -> list[AuditEntry]:
    """One row per variant x concurrency x method: tokps, error_pct_vs_counter, cause, n_trials."""
    rows: list[AuditEntry] = []
    groups = method_groups(trials)
    for key in _ordered(groups):
        variant, conc = key
        per_method: dict[str, list[MethodRow]] = defaultdict(list)
        for res in groups[key]:
            for r in res.methods:
                per_method[r.method].append(r)
        for method, rs in per_method.items():
            vals = [r.tokps for r in rs if r.tokps is not None]
            errs = [r.error_pct_vs_counter for r in rs if r.error_pct_vs_counter is not None]
            causes = Counter(r.cause for r in rs)
            notes = [r.note for r in rs if r.note]
            rows.append(AuditEntry(
                variant=variant, **level_json(conc), method=method,
                tokps=clean(mean(vals)) if vals else None,
                error_pct_vs_counter=clean(mean(errs)) if errs else None,
                cause=causes.most_common(1)[0][0], causes=dict(causes),
                source="simulator" if simulated else rs[0].source, measured_source=rs[0].source,
                n_trials=len(rs), simulated=simulated, note=notes[0] if notes else "",
                flags=list(dict.fromkeys(f.code for r in rs for f in r.flags)),
                reference=Counter(r.reference or "counter (window)" for r in rs).most_common(1)[0][0]))
    return rows


def audit_reference(references: Iterable[str]) -> str:
    """What an audit's errors are against, from its rows' references: "the server counter", or
    truthput's own tokens where the headline is usage placed in time (in every cell or some)."""
    refs = set(references) or {"counter (window)"}
    if refs == {"counter (window)"}:
        return "the server counter"
    if "counter (window)" not in refs:
        return "usage placed in time (truthput's own tokens)"
    return "each cell's headline (the server counter; usage placed in time where the counter is set aside)"


def integrity_rows(trials: Sequence[TrialLike]) -> list[IntegrityRow]:
    """Per variant x concurrency: how many trials' counter identity held, and every warning raised."""
    rows = []
    groups = method_groups(trials)
    for key in _ordered(groups):
        results = groups[key]
        checks: list[Check] = []
        for res in results:
            spec = res.spec_decode
            for interval in (spec.trial, spec.window) if spec is not None else ():
                if interval is not None:
                    checks.extend(interval.checks.values())
        rows.append(IntegrityRow(
            variant=key[0], level=key[1], trials=len(results),
            identity_held=sum(1 for r in results if r.integrity.holds is True),
            identity_failed=[r.integrity.message for r in results if r.integrity.holds is False],
            identity_unchecked=sum(1 for r in results if r.integrity.holds is None),
            spec_checks_failed=[c.message for c in checks if c.ok is False],
            # work other than asked is said once per cell (its warnings), not once per trial here
            warnings=sorted({w for r in results for w in r.warnings if w not in r.requests.work_notes}),
            prefix_cache_hit_rate=hit_rate_of(results)[0], cache=sorted({r.cache for r in results if r.cache}),
            flags=list(dict.fromkeys(f"{f.code}: {f.reason}" for r in results for f in r.headline().flags)),
        ))
    return rows


@dataclass
class Audit:
    """A run's audit, computed once per command: every counting method against each cell's
    headline (`rows`), what they are against, and each cell's whole-trial identity (`integrity`)."""

    rows: list[AuditEntry]
    integrity: list[IntegrityRow]
    against: str
    simulated: bool


def audit_of(trials: Sequence[TrialLike], simulated: bool) -> Audit:
    """The audit of a run's trials (of its ok trials with method figures)."""
    rows = audit_rows(trials, simulated=simulated)
    return Audit(rows, integrity_rows(trials), audit_reference(r.reference for r in rows), simulated)
