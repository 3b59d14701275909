"""A cell's speculative-decoding figures: the means over its ok trials of each trial's own
server-counter window (acceptance per draft position, mean acceptance length, acceptance rate).

Why in analyze/: the report, the roofline (which prices a step by its measured acceptance length)
and the terminal read the same numbers, so they are computed once here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import mean

from truthput.analyze.cells import TrialLike, group_trials
from truthput.experiment.levels import Level


@dataclass(frozen=True)
class SpecDecodeCell:
    variant: str
    level: Level
    k: int | None
    method: str | None
    note: str | None
    n_trials: int
    per_position: list[tuple[int, float, int]] = field(default_factory=list)
    """(draft position, mean acceptance, trials that had it)."""
    mean_acceptance_length: float | None = None
    """1 + accepted / drafts over the window, mean over trials."""
    acceptance_rate: float | None = None


def spec_decode_cells(trials: Sequence[TrialLike]) -> list[SpecDecodeCell]:
    """Per (variant, level) with speculative counters in any ok trial, in first-seen order."""
    out = []
    for (variant, level), ts in group_trials(trials).items():
        blocks = [t.results.spec_decode for t in ts if t.status == "ok" and t.results.spec_decode is not None]
        if not blocks:
            continue
        pos: dict[int, list[float]] = {}
        mal: list[float] = []
        rate: list[float] = []
        for b in blocks:
            w = b.best_interval()
            if w is None:
                continue
            for p in w.per_position_acceptance:
                if p.value is not None:
                    pos.setdefault(int(p.extra("position", 0)), []).append(float(p.value))
            if w.mean_acceptance_length is not None and w.mean_acceptance_length.value is not None:
                mal.append(float(w.mean_acceptance_length.value))
            if w.acceptance_rate is not None and w.acceptance_rate.value is not None:
                rate.append(float(w.acceptance_rate.value))
        out.append(SpecDecodeCell(
            variant=variant, level=level, k=blocks[0].k, method=blocks[0].method, note=blocks[0].note,
            n_trials=len(blocks), per_position=[(p, mean(v), len(v)) for p, v in sorted(pos.items())],
            mean_acceptance_length=mean(mal) if mal else None, acceptance_rate=mean(rate) if rate else None))
    return out
