"""The report's per-level figures (req/s, prompt tok/s, TPOT, E2E, and the server's KV-cache use,
waiting queue and preemptions) against what the run stored as it happened: the requests table
(client clock, usage) and the raw /metrics text the server served, read here with
prometheus_client's parser, not with truthput's own readers. A simulated run where one variant's
KV cache is far too small for its streams (the server preempts) and the other's is ample."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

TRUTHPUT = [sys.executable, "-m", "truthput"]

EXPERIMENT = """
[experiment]
name = "levels"
baseline = "ample"
seed = 2
[server]
engine = "sim"
command = ["vllm", "serve", "/models/m", "--max-num-seqs", "64", "--max-model-len", "4096"]
ready_timeout_s = 30
[hardware]
gpu = "H100 SXM"
count = 1
[model]
profile = "llama-3.1-8b"
[sim]
noise = 0.0
startup_s = 0.1
log_stats_interval_s = 0.5
[[variant]]
name = "ample"
[[variant]]
name = "tight"
set = { "--gpu-memory-utilization" = 0.215 }
[workload]
concurrency = [48]
duration_s = 4
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


def _sample(text: str, name: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return s.value
    return None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("levels")
    (d / "e.toml").write_text(EXPERIMENT)
    proc = subprocess.run([*TRUTHPUT, "run", str(d / "e.toml"), "--store", str(d / "r.db"), "--reports",
                           str(d / "rep")], capture_output=True, text=True, timeout=240, cwd=d)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = subprocess.run([*TRUTHPUT, "report", "latest", "--store", str(d / "r.db"), "--json", str(d / "doc.json")],
                         capture_output=True, text=True, timeout=120, cwd=d)
    assert doc.returncode == 0, doc.stderr[-2000:]
    return d


def _truth(db: Path, variant: str) -> dict[str, float]:
    """From the stored rows: requests finished inside the window per second, prompt tokens of
    requests whose first token came inside it per second, KV-cache use at the window's scrapes
    (highest), and the preemption counter's increase between its first and last scrape."""
    import json

    con = sqlite3.connect(db)
    tid, doc = con.execute("SELECT id, results_json FROM trials WHERE variant=?", (variant,)).fetchone()
    window = json.loads(doc)["window"]  # the headline's window: the scrapes that opened and closed it
    ws, we = window["start"], window["end"]
    reqs = con.execute("SELECT t_end, t_first, prompt_tokens, status FROM requests WHERE trial_id=?", (tid,)).fetchall()
    ok = [r for r in reqs if r[3] == "ok"]
    seconds = we - ws
    scrapes = [text for t, text in con.execute("SELECT t_mono, text FROM scrapes WHERE trial_id=? ORDER BY t_mono",
                                               (tid,)) if ws <= t <= we and text]
    kv = [v for v in (_sample(t, "vllm:kv_cache_usage_perc") for t in scrapes) if v is not None]
    pre = [v for v in (_sample(t, "vllm:num_preemptions_total") for t in scrapes) if v is not None]
    return {"requests_per_s": sum(1 for r in ok if ws <= r[0] <= we) / seconds,
            "prompt_tps": sum(r[2] for r in ok if r[1] is not None and ws <= r[1] <= we) / seconds,
            "kv_usage_max": max(kv), "preemptions": pre[-1] - pre[0]}


@pytest.mark.slow
def test_the_per_level_figures_are_the_stored_requests_and_the_servers_own_series(run):
    import json

    doc = json.loads((run / "doc.json").read_text())
    rows = {r["variant"]: r for r in doc["latency"]}
    for variant in ("ample", "tight"):
        truth = _truth(run / "r.db", variant)
        for key, want in truth.items():
            got = rows[variant][key]["value"]
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (variant, key, got, want)
        assert rows[variant]["kv_usage_max"]["read_via"] == "server_counter"  # simulated: said as such
    tight, ample = _truth(run / "r.db", "tight"), _truth(run / "r.db", "ample")
    assert tight["preemptions"] > 0 and tight["kv_usage_max"] > 0.95  # the premise: it ran out of KV cache
    assert ample["preemptions"] == 0 and ample["kv_usage_max"] < 0.5
    assert tight["requests_per_s"] > 0 and ample["requests_per_s"] > 0


def test_the_html_and_markdown_show_them(run):
    html = next((run / "rep").glob("*.html")).read_text()
    assert 'id="level-table"' in html and 'data-plot="levels"' in html
    assert "KV-cache use, max" in html and "preemptions per trial" in html
    md = next((run / "rep").glob("*.md")).read_text()
    section = md[md.index("### Requests, latency and what the server saw"):]
    line = next(ln for ln in section.splitlines() if ln.startswith("| tight |"))
    assert "100%" in line or "99%" in line, line
