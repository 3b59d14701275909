"""The simulated server's GPU energy, from the same physics as its step times.

A real server's tok/s per watt comes from NVML's energy counter; the simulator has none, so it
models one: each step at `hardware.physics.step_power_w` (idle power plus the rest of the board's
power limit in proportion to the step's roofline-busy time) on every tensor x pipeline parallel
GPU, for the step's modelled duration, and idle power the rest of the time. `sim serve` exposes
the total as the counter `truthput_sim:gpu_energy_joules_total` (not a vLLM family: only the
simulator has it), and the virtual-time driver reads it at its window's ends. Every figure from it
is SIMULATED, an estimate that ranks configurations by what a token costs.
"""

from __future__ import annotations

from typing import Any, Callable

ENERGY_METRIC = "truthput_sim:gpu_energy_joules_total"


class PowerMeter:
    """Energy the server's GPUs drew by the model, from `t0` on, on the caller's clock (`clock`:
    monotonic seconds for `sim serve`, the virtual clock for `sim batch`). A step counts from when
    it is priced (the engine then runs it for its price) for its modelled duration, pro rata while it
    runs, so a read inside a long prefill step charges only the part already run."""

    def __init__(self, gpu: Any, gpus: int, t0: float = 0.0, clock: Callable[[], float] | None = None) -> None:
        from truthput.hardware.physics import IDLE_POWER_FRAC

        self.gpu = gpu
        self.gpus = gpus
        self.t0 = t0
        self.clock = clock or (lambda: t0)
        self.idle_w = None if gpu.board_power_w is None else gpu.board_power_w * IDLE_POWER_FRAC * gpus
        self.done_j = 0.0
        self.done_s = 0.0
        self._step: tuple[float, float, float] | None = None
        """The step being run: (start, seconds, watts)."""

    def priced(self, step: Any) -> None:
        """A step the engine will run now (its breakdown, from the pricer)."""
        from truthput.hardware.physics import step_power_w

        if self._step is not None:  # the engine runs one step at a time: the last one is over
            _, secs, watts = self._step
            self.done_j += watts * secs
            self.done_s += secs
            self._step = None
        w = step_power_w(self.gpu, step)
        if w is not None:
            self._step = (self.clock(), step.total, w * self.gpus)

    def energy_j(self, now: float) -> float | None:
        """Joules from t0 to `now`; None when the board's power limit is not known."""
        if self.idle_w is None:
            return None
        joules, busy = self.done_j, self.done_s
        if self._step is not None:
            start, secs, watts = self._step
            ran = min(max(now - start, 0.0), secs)
            joules += watts * ran
            busy += ran
        return joules + self.idle_w * max(0.0, now - self.t0 - busy)
