"""Counter deltas between scrapes with Prometheus' reset rule, and nothing invented.

Rule (as Prometheus' increase() without extrapolation): walk the samples in time order; a rise adds
the difference; a drop means the counter restarted from zero, so the post-reset value is added (the
increments between the last pre-reset scrape and the restart are lost, and that is said in the
note). No extrapolation to window edges: the delta is between the first and last scrape, and rates
divide by the time between those scrapes. A missing sample is reported, never read as zero.

When the counter's `_created` timestamp is known it decides: a changed `_created` is a restart even
if the value rose meanwhile (invisible to the value-only rule), and a drop with an unchanged
`_created` is not a restart. Without `_created`, a restart starts near zero: a drop to more than
half the highest value seen is not one either, nor is a drop (to any value) that the next scrape
climbs back from to at least the highest value before it -- a restarted counter starts again from
zero, it does not resume where the old one was (a fresh replica behind a gateway answering one
scrape reads near zero). Such a drop is a dip: a stale scrape (a lagging
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


RESTART_RATE_FACTOR = 2.0
"""A drop to near zero that a later scrape climbs back from to the old high is read as a restart
only if the restarted counter could have climbed that far: no faster than this many times the
fastest rise the counter showed before it. Faster, the drop was a stale scrape (a dip)."""


def classify(samples: Sequence[tuple[float, float, float | None]]) -> list[str]:
    """Each of `samples` = [(t, value, created), ...] in time order: "rise" (the first, or at or
    above the highest value so far), "dip" (a stale scrape below it, dropped) or "restart".

    A changed `_created` is a restart, an unchanged one rules a restart out. Without `_created`, a
    drop to more than half the highest value is a dip; a deeper drop is a restart unless a later
    scrape is back at or above the old high sooner than a restarted counter could be there (it
    starts again from zero: `RESTART_RATE_FACTOR`) -- a fresh replica behind a gateway answering
    one or two scrapes reads near zero, and the next scrape is the old counter again."""
    kinds: list[str] = []
    high = high_t = None
    created: float | None = None
    fastest = 0.0
    for i, (t, v, c) in enumerate(samples):
        if high is None or high_t is None:
            kinds.append("rise")
        elif created is not None and c is not None and c != created:
            kinds.append("restart")
        elif v >= high:
            fastest = max(fastest, (v - high) / (t - high_t)) if t > high_t else fastest
            kinds.append("rise")
        elif (created is not None and c is not None) or v > 0.5 * high or _back_too_soon(samples, i, high, fastest):
            kinds.append("dip")
            continue
        else:
            kinds.append("restart")
            fastest = 0.0
        if c is not None:
            created = c
        high, high_t = v, t
    return kinds


def _back_too_soon(samples: Sequence[tuple[float, float, float | None]], i: int, high: float,
                   fastest: float) -> bool:
    """Whether a later scrape (the same `_created`, where known) is back at or above `high` sooner
    than a counter restarted at sample i could have climbed there."""
    t_i, v_i, c_i = samples[i]
    for t, v, c in samples[i + 1:]:
        if c_i is not None and c is not None and c != c_i:
            return False
        if v >= high:
            return fastest <= 0 or t <= t_i or (v - v_i) / (t - t_i) > RESTART_RATE_FACTOR * fastest
    return False


def dips(samples: Sequence[tuple[float, float, float | None]]) -> set[int]:
    """Indexes of the stale scrapes among (t, value, created) samples in time order (`classify`)."""
    return {i for i, kind in enumerate(classify(samples)) if kind == "dip"}


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
    triples = [(float(s[0]), float(s[1]), s[2] if len(s) > 2 else None) for s in present]  # type: ignore[arg-type]
    kinds = classify(triples)
    high = triples[0][1]
    last_dip = False
    for k in range(1, len(triples)):
        t_prev, t, c, kind = triples[k - 1][0], triples[k][0], triples[k][1], kinds[k]
        if kind == "rise":
            total += c - high
            high, last_dip = c, False
            continue
        known_created = triples[k][2] is not None and any(x[2] is not None for x in triples[:k])
        if kind == "dip":
            result.dips += 1
            last_dip = True
            why = (" with the same _created" if known_created else ", not near zero" if c > 0.5 * high
                   else ", a later scrape back above it sooner than a restarted counter could climb")
            notes.append(f"a stale scrape at t={t:.3f}: {c:g} after {high:g}{why}: not a restart (a lagging replica "
                         "or cache); dropped, the counter read on from its highest value")
            continue
        result.resets += 1
        total += c
        how = "_created changed" if known_created else "value dropped to near zero"
        notes.append(
            f"counter reset ({how}) at t in ({t_prev:.3f}, {t:.3f}] ({high:g} -> {c:g}): post-reset value added; "
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
