"""Two runs side by side (before/after an upgrade, two hosts): the cells both have, each B / A
ratio decided together (Hochberg; faster, slower, equivalent within +-2%, or not decided).

Server starts are the unit of replication, and each ratio uses its two cells' own variances
(Welch): two runs need not share their noise."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from truthput.analyze.cells import Cell
from truthput.analyze.decide import ComparisonKey, decide_family
from truthput.analyze.rows import DocModel, Figure, LevelRow, clean, figure, flag_refs
from truthput.analyze.stats import cell_estimate, ratio_estimate
from truthput.experiment.levels import Level, level_json

EQUIVALENCE_MARGIN = 0.02
"""Two runs' cells within +-2% of each other are called equivalent."""


class Ratio(DocModel):
    """B / A with its interval (Hochberg-adjusted over the shared cells) and the decision."""

    value: float | None
    lo: float | None
    hi: float | None
    unit: str
    source: str
    """Both cells' headline source, or `B / A` where they differ."""
    pct: float | None
    pct_lo: float | None
    pct_hi: float | None
    p_value: float | None
    significant: bool
    method: str
    correction: str
    warning: str | None = None
    outcome: str | None = None
    """faster | slower | equivalent | not decided."""


class CompareRow(LevelRow):
    variant: str
    a: Figure
    b: Figure
    ratio: Ratio
    same_argv: bool


def _side(cell: Cell, simulated: bool, confidence: float) -> Figure:
    e = cell_estimate(cell.per_start, confidence)
    return figure(e.mean, "tok/s", cell.source, simulated, lo=e.lo, hi=e.hi, n_starts=e.n_starts,
                  n_trials=e.n_trials, flags=flag_refs(cell.flags_on("tok/s")))


def compare_cells(cells_a: Mapping[tuple[str, Level], Cell], cells_b: Mapping[tuple[str, Level], Cell],
                  confidence: float = 0.95, simulated: tuple[bool, bool] = (False, False),
                  same_argv: Callable[[str], bool] = lambda _variant: True) -> list[CompareRow]:
    """Every cell both runs measured, in (variant, level) order, decided together."""
    shared = sorted(set(cells_a) & set(cells_b), key=lambda k: (k[0], k[1]))
    keys = {key: ComparisonKey("tok/s", key[1], key[0]) for key in shared}
    raw = {keys[key]: ratio_estimate(cells_b[key].per_start, cells_a[key].per_start, confidence) for key in shared}
    decided = decide_family(raw, 1.0 - confidence, EQUIVALENCE_MARGIN) if raw else {}
    out = []
    for key in shared:
        d = decided[keys[key]]
        r = d.estimate
        a, b = cells_a[key], cells_b[key]
        out.append(CompareRow(
            variant=key[0], **level_json(key[1]), a=_side(a, simulated[0], confidence),
            b=_side(b, simulated[1], confidence),
            ratio=Ratio(value=clean(r.ratio), lo=clean(r.lo), hi=clean(r.hi), unit="B/A",
                        source=a.source if a.source == b.source else f"{b.source} / {a.source}",
                        pct=clean(r.pct), pct_lo=clean(r.pct_lo), pct_hi=clean(r.pct_hi), p_value=clean(r.p_value),
                        significant=r.significant, method=r.method, correction=r.correction, warning=r.warning,
                        outcome={"different": "faster" if r.ratio > 1 else "slower"}.get(d.kind, d.kind)),
            same_argv=same_argv(key[0])))
    return out


def flag_notes(rows: list[CompareRow]) -> list[str]:
    """A flagged headline on either side, said beside the ratio that rests on it."""
    notes = []
    for r in rows:
        for side, fig in (("A", r.a), ("B", r.b)):
            for f in fig.flags or []:
                notes.append(f"{side} {r.variant} {r.level}: flagged {f.code} ({f.trials} of {f.of} "
                             f"trials): {f.reason}; the ratio rests on it")
    return notes
