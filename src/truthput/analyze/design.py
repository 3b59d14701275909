"""Trial design: the order of server starts and what a plan costs in wall time.

Why interleave: throughput drifts (GPU temperature, clocks, background load).  Running all of
A's starts then all of B's confounds A-vs-B with time; interleaving A B C A B C ... (or
randomised blocks, each variant once per block, with the seed recorded) spreads drift evenly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from truthput.errors import InputError
from truthput.text import plural


def interleaved_order(
    variants: Sequence[str], n_starts: int, seed: int, randomized: bool = False
) -> list[tuple[str, int]]:
    """(variant, start_index) in run order: block k holds every variant's start k.

    ``randomized`` shuffles the order within each block with ``numpy.random.default_rng(seed)``
    so the same seed reproduces the same order; otherwise blocks alternate A B C, C B A, ...
    """
    names = list(variants)
    if len(set(names)) != len(names):
        raise InputError(f"design: variant names must be unique, got {names}")
    if n_starts < 0:
        raise InputError(f"design: n_starts must be >= 0, got {n_starts}")
    rng = np.random.default_rng(seed)
    order: list[tuple[str, int]] = []
    for k in range(n_starts):
        block = [names[i] for i in rng.permutation(len(names))] if randomized else block_order(names, k)
        order.extend((v, k) for v in block)
    return order


def block_order(names: Sequence[str], k: int) -> list[str]:
    """Round k's order: A B C in even rounds, C B A in odd ones. Alternating keeps a steady drift
    (a host warming up) from always favouring the variant that runs first in a round: over each
    pair of rounds every variant sits at the same mean position."""
    return list(names) if k % 2 == 0 else list(reversed(names))


@dataclass(frozen=True)
class PlanTime:
    """Wall-time estimate of an experiment plan, in seconds, with its parts."""

    n_server_starts: int
    n_trials: int
    restart_s: float
    trials_s: float
    total_s: float
    max_total_s: float
    """The same plan run to ``max_starts`` (the worst case of a sequential design)."""

    def line(self) -> str:
        return (
            f"{plural(self.n_server_starts, 'server start')}, {plural(self.n_trials, 'trial')}: ~{self.total_s / 60:.1f} min "
            f"({self.restart_s / 60:.1f} min restarts + {self.trials_s / 60:.1f} min trials); "
            f"up to {self.max_total_s / 60:.1f} min at max starts (estimate from the given timings)"
        )


def estimate_plan_time(
    n_variants: int,
    n_concurrencies: int,
    n_starts: int,
    trials_per_start: int,
    restart_s: float,
    trial_s: float,
    warmup_s: float = 0.0,
    max_starts: int | None = None,
) -> PlanTime:
    """Each server start costs ``restart_s`` (teardown + load + readiness) and then runs every
    concurrency level: ``warmup_s`` once per level plus ``trials_per_start`` trials of ``trial_s``.
    """
    for name, value in (("n_variants", n_variants), ("n_concurrencies", n_concurrencies),
                        ("n_starts", n_starts), ("trials_per_start", trials_per_start)):
        if value < 0:
            raise InputError(f"design: {name} must be >= 0, got {value}")

    def cost(starts: int) -> tuple[int, int, float, float]:
        n_srv = n_variants * starts
        n_tr = n_srv * n_concurrencies * trials_per_start
        r = n_srv * restart_s
        t = n_srv * n_concurrencies * (warmup_s + trials_per_start * trial_s)
        return n_srv, n_tr, r, t

    n_srv, n_tr, r, t = cost(n_starts)
    _, _, r_max, t_max = cost(max(n_starts, max_starts or n_starts))
    return PlanTime(n_server_starts=n_srv, n_trials=n_tr, restart_s=r, trials_s=t,
                    total_s=r + t, max_total_s=r_max + t_max)
