"""Counter deltas between scrapes with Prometheus' reset rule, and nothing invented.

Rule (as Prometheus' increase() without extrapolation): walk the samples in time order; a rise adds
the difference; a drop means the counter restarted from zero, so the post-reset value is added (the
increments between the last pre-reset scrape and the restart are lost, and that is said in the
note). No extrapolation to window edges: the delta is between the first and last scrape, and rates
divide by the time between those scrapes. A missing sample is reported, never read as zero.

When the counter's `_created` timestamp is known it decides: a changed `_created` is a restart even
if the value rose meanwhile (invisible to the value-only rule), and a drop with an unchanged
`_created` is not a restart. Without `_created`, a restart starts near zero: a drop to more than
half the highest value seen is not one either. Such a drop is a dip: a stale scrape (a lagging
replica, a cache) that is dropped, the counter read on from its highest value so far, so a dip
that recovers costs nothing. Only a dip at the last scrape loses the interval's edge
(`went_backwards_without_reset`: the end is read at the highest earlier value, an under-count).
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
    """The last scrape was a dip (below an earlier one, no restart): the interval's end is lost."""
    dips: int = 0
    """Stale scrapes dropped inside the interval (below the highest value before them, no restart)."""
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


def is_dip(high: float, value: float, known_created: bool, restarted: bool) -> bool:
    """A drop below the highest value so far that is not a restart: a stale scrape. A restart
    changes `_created`; without `_created`, it starts near zero (at most half the highest value)."""
    return value < high and not restarted and (known_created or value > 0.5 * high)


def dips(values: Sequence[tuple[float, float | None]]) -> set[int]:
    """Indexes of the stale scrapes among (value, created) samples in time order (`is_dip`)."""
    out: set[int] = set()
    high: float | None = None
    created: float | None = None
    for i, (v, c) in enumerate(values):
        restarted = created is not None and c is not None and c != created
        if high is not None and is_dip(high, v, created is not None and c is not None, restarted):
            out.add(i)
            continue
        if c is not None:
            created = c
        high = v  # a new high, or a restart (which starts one)
    return out


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
    high = float(present[0][1])  # type: ignore[arg-type]
    created = present[0][2] if len(present[0]) > 2 else None
    last_dip = False
    for prev, cur in zip(present, present[1:]):
        c = float(cur[1])  # type: ignore[arg-type]
        created_cur = cur[2] if len(cur) > 2 else None
        known_created = created is not None and created_cur is not None
        restarted = known_created and created != created_cur
        if created_cur is not None:
            created = created_cur
        if c >= high and not restarted:
            total += c - high
            high, last_dip = c, False
            continue
        if is_dip(high, c, known_created, restarted):
            result.dips += 1
            last_dip = True
            notes.append(
                f"a stale scrape at t={cur[0]:.3f}: {c:g} after {high:g}"
                + (" with the same _created" if known_created else ", not near zero") +
                ": not a restart (a lagging replica or cache); dropped, the counter read on from its highest value"
            )
            continue
        result.resets += 1
        total += c
        how = "_created changed" if restarted else "value dropped to near zero"
        notes.append(
            f"counter reset ({how}) at t in ({prev[0]:.3f}, {cur[0]:.3f}] ({high:g} -> {c:g}): post-reset value added; "
            "increments between the last scrape before the restart and the restart are lost (under-count)"
        )
        high, last_dip = c, False
    if last_dip:
        result.went_backwards_without_reset = True
        notes.append("the interval's last scrape was stale: its end is read at the highest earlier value "
                     "(an under-count of the tokens after it)")
    if missing:
        notes.append(f"{len(missing)} intermediate scrape(s) without the metric: a reset there would be invisible")
    result.value = total
    result.note = "; ".join(notes)
    return result
