"""GPU telemetry per cell: the NVML samples of a run's trials grouped by variant, level and GPU,
averaged (utilisation, power, clock) or maxed (memory). Computed here; the report renders it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from statistics import mean
from typing import Protocol

from truthput.analyze.rows import Figure, LevelRow, figure
from truthput.analyze.tables import StoredTrialLike
from truthput.experiment.levels import Level, level_json


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


class TelemetryEntry(LevelRow):
    """One GPU of one variant at one level, over its trials' NVML samples (the GPU's own sampler,
    never the simulator)."""

    variant: str
    gpu: int
    samples: int
    util_pct_mean: Figure
    mem_used_gb_max: Figure
    power_w_mean: Figure
    sm_clock_mhz_mean: Figure


def _nvml(value: float | None, unit: str, note: str | None = None) -> Figure:
    return figure(value, unit, "nvml", False, note=note) if note else figure(value, unit, "nvml", False)


def _over(xs: Sequence[float | None], fn: Callable[[list[float]], float]) -> float | None:
    vals = [v for v in xs if v is not None]
    return fn(vals) if vals else None


def telemetry_rows(trials: Sequence[StoredTrialLike], samples: Iterable[TelemetrySample]) -> list[TelemetryEntry]:
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
        out.append(TelemetryEntry(
            variant=variant, **level_json(level), gpu=gpu, samples=len(xs),
            util_pct_mean=_nvml(_over([x.util_pct for x in xs], mean), "%", "time busy, not capacity used"),
            mem_used_gb_max=_nvml(None if mem is None else mem / 1e9, "GB"),
            power_w_mean=_nvml(_over([x.power_w for x in xs], mean), "W"),
            sm_clock_mhz_mean=_nvml(_over([x.sm_clock_mhz for x in xs], mean), "MHz")))
    return out
