"""Two runs side by side (before/after an upgrade, two hosts): the cells both have, each B / A
ratio decided together (Holm; faster, slower, equivalent within +-2%, or not decided).

Server starts are the unit of replication, and each ratio uses its two cells' own variances
(Welch): two runs need not share their noise."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from truthput.analyze.cells import Cell
from truthput.analyze.decide import ComparisonKey, decide_family
from truthput.analyze.stats import CellEstimate, RatioEstimate, cell_estimate, ratio_estimate
from truthput.experiment.levels import Level, level_label

EQUIVALENCE_MARGIN = 0.02
"""Two runs' cells within +-2% of each other are called equivalent."""


@dataclass(frozen=True)
class CellComparison:
    variant: str
    level: Level
    a: Cell
    b: Cell
    a_estimate: CellEstimate
    b_estimate: CellEstimate
    ratio: RatioEstimate
    """B / A with its interval, Holm-adjusted over the shared cells."""
    outcome: str
    """faster | slower | equivalent | not decided."""

    @property
    def source(self) -> str:
        """The ratio's provenance: both cells' headline source, or `B / A` where they differ."""
        return self.a.source if self.a.source == self.b.source else f"{self.b.source} / {self.a.source}"


def compare_cells(cells_a: Mapping[tuple[str, Level], Cell], cells_b: Mapping[tuple[str, Level], Cell],
                  confidence: float = 0.95) -> list[CellComparison]:
    """Every cell both runs measured, in (variant, level) order, decided together."""
    shared = sorted(set(cells_a) & set(cells_b), key=lambda k: (k[0], k[1]))
    keys = {key: ComparisonKey("tok/s", key[1], key[0]) for key in shared}
    raw = {keys[key]: ratio_estimate(cells_b[key].per_start, cells_a[key].per_start, confidence) for key in shared}
    decided = decide_family(raw, 1.0 - confidence, EQUIVALENCE_MARGIN) if raw else {}
    out = []
    for key in shared:
        d = decided[keys[key]]
        outcome = {"different": "faster" if d.estimate.ratio > 1 else "slower"}.get(d.kind, d.kind)
        out.append(CellComparison(key[0], key[1], cells_a[key], cells_b[key],
                                  cell_estimate(cells_a[key].per_start, confidence),
                                  cell_estimate(cells_b[key].per_start, confidence), d.estimate, outcome))
    return out


def flag_notes(comparisons: list[CellComparison]) -> list[str]:
    """A flagged headline on either side, said beside the ratio that rests on it."""
    notes = []
    for c in comparisons:
        for side, cell in (("A", c.a), ("B", c.b)):
            for f in cell.flags_on("tok/s"):
                notes.append(f"{side} {c.variant} {level_label(c.level)}: flagged {f.code} ({f.trials} of {f.of} "
                             f"trials): {f.reason}; the ratio rests on it")
    return notes
