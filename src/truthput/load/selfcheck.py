"""Is the client itself distorting the figures? Event-loop lag and client CPU during the load.

Why: a saturated client delays reading chunks, which inflates TTFT/ITL and can cap throughput;
the report must be able to say "these latencies are client-bound" instead of blaming the server.

Method: a probe task sleeps 10 ms in a loop and records the oversleep (the time the loop was busy
elsewhere); `resource.getrusage(RUSAGE_SELF)` gives the process CPU over the same span.

Thresholds (stated so the report can quote them):
- loop lag p99 above `LAG_P99_LIMIT_MS` (20 ms): chunk timestamps may be late by that much;
- client CPU / wall above `CPU_UTIL_LIMIT` (0.85): the single event-loop thread is near one full
  core, so reads queue up behind parsing.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from dataclasses import dataclass

LAG_PROBE_INTERVAL_S = 0.010
LAG_P99_LIMIT_MS = 20.0
CPU_UTIL_LIMIT = 0.85


@dataclass
class SelfCheck:
    """Client health over a load run. `cpu_util` = client process CPU seconds / wall seconds."""

    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    cpu_s: float
    cpu_util: float
    client_bound: bool
    reason: str | None
    lag_samples: int = 0


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(0.99 * (len(ordered) - 1)))))
    return ordered[k]


class LagProbe:
    """Start before the load, stop after it; `result()` gives the SelfCheck for that span."""

    def __init__(self, interval_s: float = LAG_PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0
        self._cpu0 = 0.0
        self._t1 = 0.0
        self._cpu1 = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._cpu0 = _cpu_seconds()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="truthput-lag-probe")

    async def _run(self) -> None:
        interval = self.interval_s
        now = time.monotonic
        append = self.lags_ms.append
        while True:
            t = now()
            await asyncio.sleep(interval)
            append(max(0.0, (now() - t - interval) * 1000.0))

    async def stop(self) -> SelfCheck:
        self._t1 = time.monotonic()
        self._cpu1 = _cpu_seconds()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        return self.result()

    def result(self) -> SelfCheck:
        wall = max(self._t1 - self._t0, 1e-9)
        cpu = max(self._cpu1 - self._cpu0, 0.0)
        p99 = _p99(self.lags_ms)
        worst = max(self.lags_ms, default=0.0)
        util = cpu / wall
        reasons = []
        if p99 > LAG_P99_LIMIT_MS:
            reasons.append(f"event-loop lag p99 {p99:.1f} ms > {LAG_P99_LIMIT_MS:.0f} ms")
        if util > CPU_UTIL_LIMIT:
            reasons.append(f"client CPU {util:.2f} of a core > {CPU_UTIL_LIMIT:.2f}")
        return SelfCheck(
            loop_lag_p99_ms=p99,
            loop_lag_max_ms=worst,
            cpu_s=cpu,
            cpu_util=util,
            client_bound=bool(reasons),
            reason="; ".join(reasons) or None,
            lag_samples=len(self.lags_ms),
        )
