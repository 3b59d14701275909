"""GPU telemetry during a trial: utilisation, memory, power, SM clock, energy (NVIDIA via NVML).

Why: throughput per config is half the story on real hardware; energy per token and whether the
GPU was busy explain it. NVML is read through `nvidia-ml-py` (module `pynvml`), imported lazily
so machines without NVIDIA GPUs (like the CI and dev boxes) need nothing. Without it every call
returns `TelemetrySummary(available=False, reason="no GPU telemetry: <why>")` instead of failing:
telemetry is optional, the trial is not.

Provenance: samples are NVML readings (`source="nvml"`). Energy comes from NVML's cumulative
energy counter when every GPU has one (`energy_source="nvml_energy_counter"`), else from the
trapezoid integral of sampled power over time (`energy_source="nvml_power_integral"`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

GPU_UTIL_MEANING = (
    "GPU util is the share of time at least one kernel was running on the GPU (time-busy), "
    "not the share of its compute capacity in use: 100% util can still leave most SMs idle."
)
DEFAULT_INTERVAL_S = 0.5
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One NVML reading of one GPU; a field is None when NVML does not support it on that GPU.
    Field names match the store's `telemetry` table."""

    t_mono: float
    gpu: int
    util_pct: float | None
    mem_used_bytes: float | None
    power_w: float | None
    sm_clock_mhz: float | None


@dataclass(frozen=True, slots=True)
class GpuSummary:
    gpu: int
    name: str
    n_samples: int
    mean_util_pct: float | None
    max_mem_used_bytes: float | None
    mean_power_w: float | None
    mean_sm_clock_mhz: float | None
    energy_j: float | None


@dataclass(frozen=True, slots=True)
class TelemetrySummary:
    """What a trial's telemetry amounts to; `available=False` carries the reason instead."""

    available: bool
    reason: str | None = None
    duration_s: float | None = None
    n_samples: int = 0
    mean_util_pct: float | None = None  # mean over GPUs of each GPU's mean
    max_mem_used_bytes: float | None = None  # max over GPUs and samples
    mean_power_w: float | None = None  # sum over GPUs of each GPU's mean power
    energy_j: float | None = None  # sum over GPUs
    energy_source: str | None = None
    gpus: tuple[GpuSummary, ...] = field(default_factory=tuple)
    source: str = "nvml"
    util_meaning: str = GPU_UTIL_MEANING
    throttle_samples: dict[str, int] = field(default_factory=dict)
    """Clocks-event reason -> samples (over all GPUs) in which NVML reported it."""
    gpu_pids: tuple[int, ...] = ()
    """Every process NVML saw computing on a GPU during the trial."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpus"] = [asdict(g) for g in self.gpus]
        return d


def unavailable(why: str) -> TelemetrySummary:
    return TelemetrySummary(available=False, reason=f"no GPU telemetry: {why}")


def load_nvml(module: ModuleType | None = None) -> tuple[ModuleType | None, str | None]:
    """Import and initialise pynvml (or the injected module). Returns (nvml, None) or (None, why)."""
    if module is None:
        try:
            import pynvml
        except ImportError:
            return None, "nvidia-ml-py (module pynvml) is not installed"
        module = pynvml
    try:
        module.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML could not initialise ({type(exc).__name__}: {exc})"
    try:
        count = module.nvmlDeviceGetCount()
    except Exception as exc:
        _shutdown(module)
        return None, f"NVML could not count GPUs ({exc})"
    if count == 0:
        _shutdown(module)
        return None, "NVML sees no GPUs"
    return module, None


def _shutdown(nvml: ModuleType) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML reading, `fn(*args)`; None when this GPU does not support it (NVMLError_NotSupported etc.)."""
    try:
        return fn(*args)
    except Exception:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_sample(nvml: ModuleType, handle: Any, gpu: int, t_mono: float) -> GpuSample:
    util = _try(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    mem = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used)
    power_mw = _try(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    clock = _try(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
    return GpuSample(
        t_mono=t_mono,
        gpu=gpu,
        util_pct=None if util is None else float(util),
        mem_used_bytes=None if mem is None else float(mem),
        power_w=None if power_mw is None else power_mw / 1000.0,
        sm_clock_mhz=None if clock is None else float(clock),
    )


def read_interference(nvml: ModuleType, handle: Any) -> tuple[list[str], list[int]]:
    """(throttle reasons now, pids computing on the GPU now); empty where NVML cannot say."""
    from truthput.engines.interference import THROTTLE_REASONS

    mask = _try(lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    if mask is None:
        mask = _try(lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
    reasons = [name for bit, name in THROTTLE_REASONS.items() if mask is not None and int(mask) & bit]
    procs = _try(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
    return reasons, [int(p.pid) for p in procs if getattr(p, "pid", None) is not None]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def integrate_power(samples: Sequence[GpuSample]) -> float | None:
    """Energy in joules of one GPU: trapezoid integral of power over the sample times."""
    points = [(s.t_mono, s.power_w) for s in samples if s.power_w is not None]
    if len(points) < 2:
        return None
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(points, points[1:]))


def summarize(
    samples: Sequence[GpuSample],
    names: Mapping[int, str] | None = None,
    energy_counter_j: Mapping[int, float] | None = None,
) -> TelemetrySummary:
    """Per-GPU and overall figures from samples; `energy_counter_j` (GPU -> joules from NVML's
    energy counter over the same span) replaces the power integral when it covers every GPU."""
    if not samples:
        return unavailable("no samples were taken")
    by_gpu: dict[int, list[GpuSample]] = {}
    for s in sorted(samples, key=lambda s: (s.gpu, s.t_mono)):
        by_gpu.setdefault(s.gpu, []).append(s)
    use_counter = energy_counter_j is not None and set(by_gpu) <= set(energy_counter_j)
    gpus = []
    for gpu, ss in by_gpu.items():
        mems = [s.mem_used_bytes for s in ss if s.mem_used_bytes is not None]
        gpus.append(GpuSummary(
            gpu=gpu,
            name=(names or {}).get(gpu, f"GPU {gpu}"),
            n_samples=len(ss),
            mean_util_pct=_mean([s.util_pct for s in ss if s.util_pct is not None]),
            max_mem_used_bytes=max(mems) if mems else None,
            mean_power_w=_mean([s.power_w for s in ss if s.power_w is not None]),
            mean_sm_clock_mhz=_mean([s.sm_clock_mhz for s in ss if s.sm_clock_mhz is not None]),
            energy_j=energy_counter_j[gpu] if use_counter else integrate_power(ss),  # type: ignore[index]
        ))
    utils = [g.mean_util_pct for g in gpus if g.mean_util_pct is not None]
    mems = [g.max_mem_used_bytes for g in gpus if g.max_mem_used_bytes is not None]
    powers = [g.mean_power_w for g in gpus if g.mean_power_w is not None]
    energies = [g.energy_j for g in gpus]
    times = [s.t_mono for s in samples]
    return TelemetrySummary(
        available=True,
        duration_s=max(times) - min(times),
        n_samples=len(samples),
        mean_util_pct=_mean(utils),
        max_mem_used_bytes=max(mems) if mems else None,
        mean_power_w=sum(powers) if powers else None,
        energy_j=None if any(e is None for e in energies) else sum(energies),  # type: ignore[arg-type]
        energy_source="nvml_energy_counter" if use_counter else "nvml_power_integral",
        gpus=tuple(gpus),
    )


def energy_per_token(summary: TelemetrySummary, tokens: int | float) -> float | None:
    """Joules per generated token, or None when energy or tokens are unknown or zero."""
    if not summary.available or summary.energy_j is None or not tokens or tokens <= 0:
        return None
    return summary.energy_j / tokens


class GpuSampler:
    """Background thread sampling every GPU each `interval_s` between start() and stop().

    Use as a context manager or call start()/stop(); stop() returns the TelemetrySummary and
    leaves the raw readings in `.samples` (for the store's `telemetry` table). `nvml` injects a
    module with pynvml's API (tests pass a fake); by default pynvml is imported lazily.
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, nvml: ModuleType | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if interval_s <= 0:
            raise ValueError(f"telemetry interval must be > 0 s, got {interval_s}")
        self.interval_s = interval_s
        self.samples: list[GpuSample] = []
        self._clock = clock
        self._nvml, self.reason = load_nvml(nvml)
        self._handles: list[Any] = []
        self.names: dict[int, str] = {}
        self._energy_start: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.throttle_samples: dict[str, int] = {}
        self.gpu_pids: set[int] = set()
        if self._nvml is not None:
            nvml_mod = self._nvml
            self._handles = [nvml_mod.nvmlDeviceGetHandleByIndex(i) for i in range(nvml_mod.nvmlDeviceGetCount())]
            self.names = {i: _text(_try(nvml_mod.nvmlDeviceGetName, h) or f"GPU {i}")
                          for i, h in enumerate(self._handles)}

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def _energy_mj(self) -> dict[int, float]:
        out: dict[int, float] = {}
        if self._nvml is None:
            return out
        for i, h in enumerate(self._handles):
            v = _try(self._nvml.nvmlDeviceGetTotalEnergyConsumption, h)
            if v is not None:
                out[i] = float(v)
        return out

    def sample_once(self) -> None:
        if self._nvml is None:
            return
        t = self._clock()
        readings = [read_sample(self._nvml, h, i, t) for i, h in enumerate(self._handles)]
        events = [read_interference(self._nvml, h) for h in self._handles]
        with self._lock:
            self.samples.extend(readings)
            for reasons, pids in events:
                for r in reasons:
                    self.throttle_samples[r] = self.throttle_samples.get(r, 0) + 1
                self.gpu_pids.update(pids)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def start(self) -> "GpuSampler":
        if self._nvml is None or self._thread is not None:
            return self
        self._energy_start = self._energy_mj()
        self._thread = threading.Thread(target=self._run, name="truthput-gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> TelemetrySummary:
        if self._nvml is None:
            return unavailable(self.reason or "NVML unavailable")
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample_once()  # a closing reading so the span covers start..stop
        end = self._energy_mj()
        counter = None
        if self._energy_start and set(end) == set(self._energy_start):
            counter = {i: (end[i] - self._energy_start[i]) / 1000.0 for i in end}
        with self._lock:
            samples = list(self.samples)
        _shutdown(self._nvml)
        self._nvml = None
        self.reason = "sampler stopped"
        import dataclasses

        return dataclasses.replace(summarize(samples, self.names, counter), throttle_samples=dict(self.throttle_samples),
                                   gpu_pids=tuple(sorted(self.gpu_pids)))

    def __enter__(self) -> "GpuSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._nvml is not None:
            self.summary = self.stop()


def _gpu_pids(mod: ModuleType) -> set[int]:
    pids: set[int] = set()
    for i in range(mod.nvmlDeviceGetCount()):
        h = mod.nvmlDeviceGetHandleByIndex(i)
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            read = getattr(mod, getter, None)  # an older NVML binding may lack one of the two
            procs = (_try(read, h) if read is not None else None) or []
            pids.update(int(p.pid) for p in procs)
    return pids


def _session_and_group(pid: int) -> tuple[int, int] | None:
    """(session id, process group id) of a live process, from /proc; None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        return int(fields[3]), int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def _belongs_to(pid: int, roots: set[int]) -> bool:
    """Whether a GPU process is one of `roots` or in their session / process group: vLLM's GPU
    memory is held by its engine-core and worker children, not by the API server pid truthput
    started (with setsid, so the children share its session)."""
    if pid in roots:
        return True
    ids = _session_and_group(pid)
    return ids is not None and (ids[0] in roots or ids[1] in roots)


def gpu_memory_released(
    pids_or_baseline: Sequence[int] | Mapping[int, float],
    timeout: float = 30.0,
    *,
    tolerance_bytes: float = 256 * MIB,
    poll_s: float = 0.25,
    nvml: ModuleType | None = None,
) -> bool | None:
    """Wait up to `timeout` s for a stopped server's GPU memory to be freed, for teardown.

    `pids_or_baseline` is either the server's process ids (released = none of them, nor any
    process in their session or process group, holds GPU memory any more) or a baseline {gpu index: used bytes} taken before the server started
    (released = every GPU is back within `tolerance_bytes` of it). True when released, False on
    timeout, None when it cannot be told (no NVML: nothing to wait for).
    """
    mod, _ = load_nvml(nvml)
    if mod is None:
        return None
    try:
        deadline = time.monotonic() + timeout
        while True:
            if isinstance(pids_or_baseline, Mapping):
                used = {i: float(mod.nvmlDeviceGetMemoryInfo(mod.nvmlDeviceGetHandleByIndex(i)).used)
                        for i in range(mod.nvmlDeviceGetCount())}
                done = all(used.get(i, 0.0) <= base + tolerance_bytes for i, base in pids_or_baseline.items())
            else:
                roots = {int(p) for p in pids_or_baseline}
                done = not any(_belongs_to(p, roots) for p in _gpu_pids(mod))
            if done:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
    finally:
        _shutdown(mod)
