"""`truthput sim calibrate` on a run whose experiment names no [hardware]/[model] (what a real
engine's run usually is): --gpu/--model supply them, and without them the refusal says which is
missing. The server here is the simulator launched as a plain command (engine = "command"): the
experiment has no [hardware] or [model], as a real engine's need not. (How well constants are
recovered is tests/test_calibrate_store.py's subject.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TRUTHPUT = [sys.executable, "-m", "truthput"]

EXPERIMENT = """
[experiment]
name = "no-hardware"
baseline = "base"
seed = 2
[server]
engine = "command"
command = {command}
ready_timeout_s = 30
stop_grace_s = 5
[[variant]]
name = "base"
[workload]
concurrency = [1, 4]
duration_s = 2
warmup_s = 0.5
input_tokens = 64
output_tokens = 256
ignore_eos = true
[measure]
starts = 1
sequential = false
repeats = 1
output_guard = false
"""


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("nohw")
    command = [sys.executable, "-m", "truthput.sim", "serve", "/models/llama", "--max-model-len", "4096",
               "--sim-gpu", "RTX 3090", "--sim-model", "llama-3.1-8b", "--sim-startup-s", "0.05", "--port", "{port}"]
    exp = folder / "exp.toml"
    exp.write_text(EXPERIMENT.format(command=json.dumps(command)))
    db = folder / "runs.db"
    proc = subprocess.run([*TRUTHPUT, "run", str(exp), "--store", str(db), "--no-reports"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return db


@pytest.mark.slow
def test_without_hardware_the_refusal_names_what_is_missing(stored_run):
    proc = subprocess.run([*TRUTHPUT, "sim", "calibrate", "latest", "--store", str(stored_run)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "[hardware] (or --gpu)" in err and "[model] (or --model)" in err and "Traceback" not in err


def test_gpu_and_model_on_the_command_line_stand_in_for_the_experiments(stored_run):
    proc = subprocess.run([*TRUTHPUT, "sim", "calibrate", "latest", "--store", str(stored_run), "--gpu", "RTX 3090",
                           "--model", "llama-3.1-8b", "--free", "step_overhead_s,bw_frac"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "points (server-counter tok/s) on RTX 3090 / llama-3.1-8b" in out, out
    assert "step_overhead_s = " in out and "bw_frac = " in out
    # the server told truthput it is a simulator: the fit says it recovers the simulator's constants
    assert "SIMULATED runs" in out
