"""GPU telemetry per cell: the NVML samples of a run's trials grouped by variant, level and GPU,
averaged (utilisation, power, clock) or maxed (memory). Computed here; the report renders it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Protocol

from truthput.experiment.levels import Level


class TelemetrySample(Protocol):
    """One stored NVML sample (`truthput.store.rows.TelemetryRow` is one)."""

    @property
    def trial_id(self) -> int: ...
    @property
    def gpu(self) -> int: ...
    @property
    def util_pct(self) -> float | None: ...
    @property
    def mem_used_bytes(self) -> float | None: ...
    @property
    def power_w(self) -> float | None: ...
    @property
    def sm_clock_mhz(self) -> float | None: ...


class TrialPlace(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def variant(self) -> str: ...
    @property
    def level(self) -> Level: ...


@dataclass(frozen=True)
class GpuCell:
    """One GPU of one variant at one level, over its trials' samples."""

    variant: str
    level: Level
    gpu: int
    samples: int
    util_pct_mean: float | None
    mem_used_gb_max: float | None
    power_w_mean: float | None
    sm_clock_mhz_mean: float | None


def _over(xs: Sequence[float | None], fn: Callable[[list[float]], float]) -> float | None:
    vals = [v for v in xs if v is not None]
    return fn(vals) if vals else None


def gpu_cells(trials: Sequence[TrialPlace], samples: Iterable[TelemetrySample]) -> list[GpuCell]:
    """The cells in the trials' order, GPUs in order within each; samples of unknown trials are left out."""
    by_id = {t.id: t for t in trials}
    order = list(dict.fromkeys((t.variant, t.level) for t in trials))
    groups: dict[tuple[str, Level, int], list[TelemetrySample]] = defaultdict(list)
    for s in samples:
        t = by_id.get(s.trial_id)
        if t is not None:
            groups[(t.variant, t.level, s.gpu)].append(s)
    out = []
    for (variant, level, gpu), xs in sorted(groups.items(), key=lambda kv: (order.index(kv[0][:2]), kv[0][2])):
        mem = _over([x.mem_used_bytes for x in xs], max)
        out.append(GpuCell(variant, level, gpu, len(xs), _over([x.util_pct for x in xs], mean),
                           None if mem is None else mem / 1e9, _over([x.power_w for x in xs], mean),
                           _over([x.sm_clock_mhz for x in xs], mean)))
    return out
