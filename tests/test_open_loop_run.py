"""`truthput run` as an open loop: requests arrive at set rates, and the verdict is on goodput and
latency at each rate.

Known truth: with constant arrivals at r requests/s and every request emitting exactly N tokens
(ignore_eos), a server that keeps up emits r * N tokens per second, whatever its speed; a server
that admits one request at a time (`--max-num-seqs 1`) queues arrivals that come faster than it
finishes them, so its time to first token grows with the rate while the other's does not.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from truthput.runner import run_experiment
from truthput.spec.experiment import parse_experiment
from truthput.spec.levels import Rate
from truthput.store.db import Store

ROOT = Path(__file__).resolve().parents[1]
TRUTHPUT = [sys.executable, "-m", "truthput"]

RATES = (4.0, 16.0)
OUTPUT_TOKENS = 16

EXPERIMENT = f"""
[experiment]
name = "open"
baseline = "base"
seed = 5
[server]
engine = "sim"
command = ["vllm", "serve", "/models/llama", "--max-model-len", "4096", "--max-num-seqs", "64", "--port", "8080"]
ready_timeout_s = 30
stop_grace_s = 5
[hardware]
gpu = "RTX 3090"
count = 1
[model]
profile = "llama-3.1-8b"
[sim]
noise = 0.02
startup_s = 0.1
[[variant]]
name = "base"
[[variant]]
name = "one_at_a_time"
set = {{ "--max-num-seqs" = 1 }}
[workload]
rates = {list(RATES)}
arrival = "constant"
duration_s = 2.5
warmup_s = 0.5
input_tokens = 32
output_tokens = {OUTPUT_TOKENS}
ignore_eos = true
[slo]
ttft_ms = 150
[measure]
starts = 2
max_starts = 3
repeats = 1
verdicts = ["tok/s", "ttft_p99", "goodput"]
output_guard = false
"""


@pytest.fixture(scope="module")
def open_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("open")
    db = folder / "r.db"
    exp = parse_experiment(EXPERIMENT, "open.toml")
    store = Store(db)
    run_id = asyncio.run(run_experiment(exp, EXPERIMENT, "open.toml", store, progress=lambda m: None))
    store.close()
    return db, run_id


def test_each_rate_is_its_own_level_and_the_counter_sees_rate_times_tokens(open_run):
    db, run_id = open_run
    store = Store(db, read_only=True)
    trials = store.trial_results(run_id)
    store.close()
    assert {t.level for t in trials} == {Rate(r) for r in RATES}
    assert all(t.concurrency == 0 and t.rate in RATES for t in trials)
    for t in trials:
        if t.variant != "base" or t.status != "ok":
            continue
        tokps = t.results.headline().number()
        assert tokps is not None
        # constant arrivals: rate x tokens per request, up to the window's edges
        assert tokps == pytest.approx(t.rate * OUTPUT_TOKENS, rel=0.2), (t.rate, tokps)
        assert t.results.load is not None and t.results.load.mode == "open"


def test_verdict_decides_latency_at_the_rate_the_queue_builds(open_run):
    db, run_id = open_run
    out = subprocess.run([*TRUTHPUT, "report", run_id, "--store", str(db)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    # the table is keyed by offered rate, not streams
    assert "req/s" in text and "c=0" not in text
    high = f"{RATES[1]:g} req/s"
    # one request at a time cannot keep up with the higher rate: its p99 TTFT is decided higher
    assert f"{high}: one_at_a_time's p99 TTFT is" in text and "higher than base's" in text, text
    # its goodput under the TTFT target is lower at that rate (none of its requests meets the target:
    # zero, which no log-scale interval takes, and the line says so)
    assert f"{high}: one_at_a_time's goodput is" in text, text
    after = text.split(f"{high}: one_at_a_time's goodput is", 1)[1]
    assert "lower than base's" in after.split("simulated:")[0]


def test_exports_and_markdown_name_the_rate(open_run, tmp_path):
    db, run_id = open_run
    out = tmp_path / "x.json"
    r = subprocess.run([*TRUTHPUT, "report", run_id, "--store", str(db), "--json", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    cells = doc["cells"]
    assert {c["rate"] for c in cells} == set(RATES)
    assert all(c["concurrency"] is None and c["level"].endswith("req/s") for c in cells)
    per = doc["verdict"]["detail"]["per_concurrency"]
    assert {p["rate"] for p in per} == set(RATES)
    md = tmp_path / "r.md"
    r = subprocess.run([*TRUTHPUT, "report", run_id, "--store", str(db), "--md", str(md)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    table = md.read_text()
    assert "| variant | req/s |" in table


def test_both_loop_kinds_at_once_is_refused():
    text = EXPERIMENT.replace("rates = ", "concurrency = [1]\nrates = ")
    with pytest.raises(Exception) as exc:
        parse_experiment(text, "open.toml")
    assert "not both" in str(exc.value)
