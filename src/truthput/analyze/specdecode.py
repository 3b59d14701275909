"""A cell's speculative-decoding figures: the means over its ok trials of each trial's own
server-counter window (acceptance per draft position, mean acceptance length, acceptance rate).

Why in analyze/: the report, the roofline (which prices a step by its measured acceptance length)
and the terminal read the same numbers, so they are computed once here."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean

from pydantic import Field

from truthput.analyze.cells import TrialLike, group_trials, spec_means
from truthput.analyze.rows import Figure, LevelRow, figure
from truthput.experiment.levels import level_json


class SpecDecodeRow(LevelRow):
    variant: str
    k: int | None
    method: str | None
    note: str | None = None
    per_position: list[Figure] = Field(default_factory=list)
    """Mean acceptance at each draft position (`position`), over the trials that had it (`n_trials`)."""
    mean_acceptance_length: Figure
    acceptance_rate: Figure
    n_trials: int


def spec_decode_rows(trials: Sequence[TrialLike], simulated: bool) -> list[SpecDecodeRow]:
    """Per (variant, level) with speculative counters in any ok trial, in first-seen order."""
    out = []
    for (variant, level), ts in group_trials(trials).items():
        blocks = [t.results.spec_decode for t in ts if t.status == "ok" and t.results.spec_decode is not None]
        if not blocks:
            continue
        pos: dict[int, list[float]] = {}
        for b in blocks:
            w = b.best_interval()
            for p in w.per_position_acceptance if w is not None else []:
                if p.value is not None:
                    pos.setdefault(int(p.extra("position", 0)), []).append(float(p.value))
        rate, mal = spec_means(t.results for t in ts if t.status == "ok")
        out.append(SpecDecodeRow(
            variant=variant, **level_json(level), k=blocks[0].k, method=blocks[0].method, note=blocks[0].note,
            n_trials=len(blocks),
            per_position=[figure(mean(v), "ratio", "server_counter", simulated, position=p, n_trials=len(v))
                          for p, v in sorted(pos.items())],
            mean_acceptance_length=figure(mal, "tokens/step", "server_counter", simulated,
                                          note="1 + accepted / drafts over the window, mean over trials"),
            acceptance_rate=figure(rate, "ratio", "server_counter", simulated)))
    return out
