#!/usr/bin/env bash
# Exercise the NVML sampler and the GPU interference checks on a real NVIDIA GPU (a few minutes).
# Needs nvidia-ml-py (module pynvml) and, for the stranger, torch with CUDA; prints what it saw.
# Nothing in the test suite depends on it: CI has no GPU.
#   bash scripts/gpu-check.sh            (from the repository root, with .venv installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
PYTHONPATH=src "$PY" - <<'PYEOF'
import os, subprocess, sys, time
from types import SimpleNamespace

from truthput.engines.telemetry import GpuSampler
from truthput.load.schedule import LoadResult
from truthput.load.selfcheck import SelfCheck
from truthput.measure.model import TrialResults
from truthput.measure.names import metric_names
from truthput.run.trial import TrialRun, TrialSetup, _interference

BURN = ("import torch, time\n"
        "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
        "t = time.monotonic()\n"
        "while time.monotonic() - t < 20: a @ a\n"
        "torch.cuda.synchronize()\n")


def trial(seconds, server_pgid):
    sampler = GpuSampler(interval_s=0.2).start()
    if not sampler.available:
        sys.exit(f"gpu-check: no NVML: {sampler.reason}")
    time.sleep(seconds)
    tel = sampler.stop()
    res = TrialResults()
    res.throughput.counter_window.value = 1.0
    load = LoadResult(records=[], t_start=0, t_window_start=0, t_window_end=seconds, t_end=seconds,
                      never_settled=False, selfcheck=SelfCheck(0, 0, 0, 0, False, None))
    run = TrialRun(results=res, load=load, scrapes=[], t0_wall=0, t0_mono=0, t_end=seconds)
    setup = TrialSetup(base_url="-", names=metric_names("vllm"), engine="vllm", server_pgids={server_pgid})
    _interference(run, setup, SimpleNamespace(other_cores=None, reason="not sampled", cores=os.cpu_count()), tel)
    print(f"  samples {tel.n_samples}, mean util {tel.mean_util_pct}, mean SM clock "
          f"{tel.gpus[0].mean_sm_clock_mhz if tel.gpus else None} MHz, power {tel.mean_power_w} W")
    print(f"  GPU pids seen {list(tel.gpu_pids)}; throttle samples {tel.throttle_samples}")
    print(f"  interference: {res.interference.model_dump()}")
    print(f"  flags on the counter figure: {[(f.code, f.reason) for f in res.throughput.counter_window.flags]}")
    return res


server = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
time.sleep(8)  # CUDA start-up
print("1) the 'server' alone on the GPU (expected: no gpu_interference; gpu_throttled only if the card throttles)")
trial(5, server.pid)
stranger = subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)
time.sleep(8)
print("2) a stranger computing beside it (expected: gpu_interference naming the stranger's pid)")
r = trial(5, server.pid)
for p in (stranger, server):
    p.kill()
    p.wait()
ok = any(f.code == "gpu_interference" for f in r.throughput.counter_window.flags)
print("gpu-check:", "stranger flagged" if ok else "stranger NOT flagged (container pid namespace? see the note above)")
PYEOF
