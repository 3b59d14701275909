"""The load a `sim batch` line carries (`truthput tune` screens configurations under it; the
simulator's virtual clock runs it): fixed-length requests measured over a window, a closed loop of
`concurrency` streams or, with `rate`, an open loop whose goodput is counted against the SLOs. One
type for both sides of the process boundary, so the two cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class VirtualLoad:
    concurrency: int
    input_tokens: int = 256
    output_tokens: int = 256
    duration_s: float = 30.0
    warmup_s: float = 5.0
    rate: float | None = None
    arrival: str = "poisson"
    max_in_flight: int | None = None
    """Open loop: an arrival that finds this many requests open waits for one to finish."""
    slo_ttft_ms: float | None = None
    slo_itl_ms: float | None = None
    slo_e2e_ms: float | None = None

    def line(self) -> dict[str, Any]:
        """The load's fields of a `sim batch` line (the open loop's only with a rate)."""
        closed = ("concurrency", "input_tokens", "output_tokens", "duration_s", "warmup_s")
        return {f.name: getattr(self, f.name) for f in fields(self) if self.rate is not None or f.name in closed}

    @classmethod
    def of_line(cls, line: dict[str, Any]) -> VirtualLoad:
        """The load of a `sim batch` line (keys it leaves out or sets null take the defaults)."""
        return cls(**{f.name: line[f.name] for f in fields(cls) if line.get(f.name) is not None})
