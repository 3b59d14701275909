"""`truthput run` as an open loop (the README's `truthput run examples/open-loop.toml`, run here as
written): requests arrive at set rates, and the verdict is on goodput and latency at each rate.

Known truth: with constant arrivals at r requests/s and every request emitting exactly N tokens
(ignore_eos), a server that keeps up emits r * N tokens per second, whatever its speed; a server
that admits four requests at a time (`--max-num-seqs 4`) queues arrivals that come faster than it
finishes them, so its time to first token grows with the rate while the other's does not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from truthput.experiment.file import parse_experiment
from truthput.experiment.levels import Rate
from truthput.store.db import Store

ROOT = Path(__file__).resolve().parents[1]
TRUTHPUT = [sys.executable, "-m", "truthput"]

EXAMPLE = ROOT / "examples" / "open-loop.toml"
RATES = (4.0, 12.0)  # the example's [workload] rates
OUTPUT_TOKENS = 32  # its output_tokens (ignore_eos: every request emits exactly these)
SLOW = "few_seqs"  # its variant that admits 4 requests at a time
BASE = "default"


@pytest.fixture(scope="module")
def open_run(tmp_path_factory):
    """The README's open-loop command, as written, in a folder of its own (the store is the
    default ./truthput.db there)."""
    folder = tmp_path_factory.mktemp("open")
    (folder / "examples").symlink_to(ROOT / "examples")
    out = subprocess.run([*TRUTHPUT, "run", "examples/open-loop.toml"], capture_output=True, text=True, cwd=folder,
                         timeout=600)
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    db = folder / "truthput.db"
    store = Store(db, read_only=True)
    run_id = store.resolve_run("latest")
    store.close()
    return db, run_id


@pytest.mark.slow
def test_each_rate_is_its_own_level_and_the_counter_sees_rate_times_tokens(open_run):
    db, run_id = open_run
    store = Store(db, read_only=True)
    trials = store.trial_results(run_id)
    store.close()
    assert {t.level for t in trials} == {Rate(r) for r in RATES}
    assert all(t.concurrency == 0 and t.rate in RATES for t in trials)
    for t in trials:
        if t.variant != BASE or t.status != "ok":
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
    store = Store(db, read_only=True)
    disturbed = [t for t in store.trial_results(run_id) if t.rate == RATES[1] and t.status == "ok"
                 and {f.code for f in t.results.headline().flags} & {"load_not_reached", "host_interference"}]
    store.close()
    if disturbed and f"{high}: {SLOW}'s p99 TTFT is" not in text:
        # a trial at that rate was flagged (on a host the suite's other workers saturate, the load
        # generator can fall behind an open loop's arrivals): its latencies are uncertain, so "not
        # decided" is a right answer; a decision the wrong way round never is
        assert f"{high}: p99 TTFT {SLOW} vs {BASE}: not decided" in text, text
        assert "lower than" not in text.split(f"{high}: p99 TTFT", 1)[1].split("simulated:")[0], text
        return
    # four requests at a time cannot keep up with the higher rate: its p99 TTFT is decided higher
    assert f"{high}: {SLOW}'s p99 TTFT is" in text and f"higher than {BASE}'s" in text, text
    # its goodput under the latency targets is lower at that rate (where none of its requests meets
    # them it is zero, which no log-scale interval takes, and the line says so)
    assert f"{high}: {SLOW}'s goodput is" in text, text
    after = text.split(f"{high}: {SLOW}'s goodput is", 1)[1]
    assert f"lower than {BASE}'s" in after.split("simulated:")[0]


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
    assert {p["level"]["rate"] for p in per} == set(RATES) and all(p["level"]["concurrency"] is None for p in per)
    md = tmp_path / "r.md"
    r = subprocess.run([*TRUTHPUT, "report", run_id, "--store", str(db), "--md", str(md)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    table = md.read_text()
    assert "| variant | req/s |" in table


def test_both_loop_kinds_at_once_is_refused():
    text = EXAMPLE.read_text().replace("rates = ", "concurrency = [1]\nrates = ")
    with pytest.raises(Exception) as exc:
        parse_experiment(text, "open.toml")
    assert "not both" in str(exc.value)
