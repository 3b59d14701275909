"""The Pareto front of (latency, throughput) points: the one rule for the report's trade-off plot
and `truthput tune`'s pareto objective."""

from __future__ import annotations

from collections.abc import Sequence


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated (lower latency x AND higher throughput y is better)."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return front
