"""The verdict from per-start values alone: what a user can recompute.

A run's verdict depends only on the values of its server starts (each start's trial figures, the
round it ran in) and the design in `[measure]` (first look, max starts, sequential or not, the
equivalence margin, the confidence). `decide` is that function: `truthput run` calls it after each
round, `truthput decide VALUES` calls it on an exported file, the coverage benchmark calls it on
synthetic experiments, so the three cannot disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from truthput.analyze.stopping import StoppingRule
from truthput.analyze.verdict import Rounds, Verdict, make_verdict
from truthput.experiment.file import MeasureSection
from truthput.experiment.levels import Level


@dataclass(frozen=True)
class StartValues:
    """One server start's values of one verdict metric at one level (one per trial)."""

    metric: str
    variant: str
    level: Level
    round: int
    """The round of starts it belongs to (start index: round k runs every variant once)."""
    values: tuple[float, ...]


Groups = dict[tuple[str, Level], list[list[float]]]


def stopping_rule(m: MeasureSection) -> StoppingRule | None:
    """The experiment's sequential rule (None when `sequential = false`): first look at
    max(2, starts), at most max_starts per variant, equivalence within +-min_effect."""
    if not m.sequential:
        return None
    return StoppingRule(target_rel_halfwidth=m.target_rel, max_starts=max(m.planned_max_starts, m.first_look),
                        min_starts=m.first_look, alpha=1 - m.confidence, min_effect=m.min_effect_rel,
                        method=m.spending)



def start_values(groups: Mapping[str, tuple[Groups, Rounds]]) -> list[StartValues]:
    """Metric -> ((variant, level) -> per-start values, rounds) as a flat list, in round order."""
    out = []
    for metric, (values, rounds) in groups.items():
        for key in values:
            for vals, r in sorted(zip(values[key], rounds[key], strict=True), key=lambda vr: vr[1]):
                out.append(StartValues(metric, key[0], key[1], int(r), tuple(float(x) for x in vals)))
    return out


def grouped(values: Iterable[StartValues]) -> dict[str, tuple[Groups, Rounds]]:
    """The inverse of `start_values`."""
    by: dict[str, dict[tuple[str, Level], list[tuple[int, list[float]]]]] = defaultdict(lambda: defaultdict(list))
    for v in values:
        by[v.metric][(v.variant, v.level)].append((v.round, list(v.values)))
    out: dict[str, tuple[Groups, Rounds]] = {}
    for metric, cells in by.items():
        vals: Groups = {}
        rounds: dict[tuple[str, Level], list[int]] = {}
        for key, starts in cells.items():
            starts.sort(key=lambda s: s[0])
            vals[key], rounds[key] = [s[1] for s in starts], [s[0] for s in starts]
        out[metric] = (vals, rounds)
    return out


def decide(values: Sequence[StartValues] | Mapping[str, tuple[Groups, Rounds]], baseline: str,
           measure: MeasureSection | None = None, look: int | None = None, **context: Any) -> Verdict:
    """The verdict for one look: `values` (per-start values, or grouped by metric), the baseline's
    name and the design (`[measure]`, defaults when None); `look` = starts per variant so far
    (default: the most any cell has). `context`: what a run adds beyond the values (failed
    variants, the output guard, simulated) and passes to `make_verdict` as is."""
    m = measure or MeasureSection()
    groups = grouped(values) if not isinstance(values, Mapping) else dict(values)
    tput, rounds = groups.get("tok/s", ({}, {}))
    rule = stopping_rule(m)
    if rule is not None and look is None:
        look = max((len(v) for metric in groups.values() for v in metric[0].values()), default=None)
    extra = {k: groups[k] for k in m.verdicts if k != "tok/s" and k in groups}
    return make_verdict(tput, baseline, confidence=m.confidence, stopping_rule=rule, look=look,
                        min_effect=m.min_effect_rel, rounds=rounds, metrics=extra,
                        decide_throughput="tok/s" in m.verdicts, **context)
