"""Counter deltas between scrapes with Prometheus' reset rule, and nothing invented.

Rule (as Prometheus' increase() without extrapolation): walk the samples in time order; a rise adds
the difference; a drop means the counter restarted from zero, so the post-reset value is added (the
increments between the last pre-reset scrape and the restart are lost, and that is said in the
note). No extrapolation to window edges: the delta is between the first and last scrape, and rates
divide by the time between those scrapes. A missing sample is reported, never read as zero.

When the counter's `_created` timestamp is known it decides: a changed `_created` is a restart even
if the value rose meanwhile (invisible to the value-only rule), and a drop with an unchanged
`_created` is not a restart: the counter went backwards (stale or load-balanced /metrics), flagged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

Sample = tuple[float, float | None] | tuple[float, float | None, float | None]


@dataclass(slots=True)
class CounterDelta:
    """The increase of a counter between the first and last sample, or None with the reason."""

    value: float | None
    resets: int = 0
    missing: list[int] = field(default_factory=list)  # indexes of samples with no value
    went_backwards_without_reset: bool = False
    note: str = ""
    t_first: float | None = None
    t_last: float | None = None

    @property
    def seconds(self) -> float | None:
        if self.t_first is None or self.t_last is None:
            return None
        return self.t_last - self.t_first

    def rate(self) -> float | None:
        """Increase per second between the first and last sample's times."""
        s = self.seconds
        if self.value is None or not s or s <= 0:
            return None
        return self.value / s


def counter_delta(samples: Sequence[Sample]) -> CounterDelta:
    """Increase over `samples` = [(t, value | None[, created | None]), ...] (sorted by t here)."""
    if len(samples) < 2:
        return CounterDelta(value=None, note=f"need at least 2 samples, got {len(samples)}")
    ordered = sorted(samples, key=lambda s: s[0])
    missing = [i for i, s in enumerate(ordered) if s[1] is None]
    present = [s for s in ordered if s[1] is not None]
    result = CounterDelta(value=None, missing=missing)
    if ordered[0][1] is None or ordered[-1][1] is None:
        end = "first" if ordered[0][1] is None else "last"
        result.note = f"metric missing at the {end} scrape: no delta"
        return result
    result.t_first, result.t_last = ordered[0][0], ordered[-1][0]
    total = 0.0
    notes: list[str] = []
    for prev, cur in zip(present, present[1:]):
        p, c = float(prev[1]), float(cur[1])  # type: ignore[arg-type]
        created_prev = prev[2] if len(prev) > 2 else None
        created_cur = cur[2] if len(cur) > 2 else None
        known_created = created_prev is not None and created_cur is not None
        restarted = known_created and created_prev != created_cur
        if c >= p and not restarted:
            total += c - p
            continue
        if known_created and not restarted:
            result.went_backwards_without_reset = True
            notes.append(
                f"counter went backwards {p:g} -> {c:g} at t={cur[0]:.3f} with the same _created: "
                "not a restart (stale or load-balanced /metrics); the drop is not counted"
            )
            continue
        result.resets += 1
        total += c
        how = "_created changed" if restarted else "value dropped"
        notes.append(
            f"counter reset ({how}) at t in ({prev[0]:.3f}, {cur[0]:.3f}] ({p:g} -> {c:g}): post-reset value added; "
            "increments between the last scrape before the restart and the restart are lost (under-count)"
        )
    if missing:
        notes.append(f"{len(missing)} intermediate scrape(s) without the metric: a reset there would be invisible")
    result.value = total
    result.note = "; ".join(notes)
    return result
