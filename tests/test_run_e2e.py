"""`truthput run` end to end on the embedded simulator: known truth, failures as results, resume.

Runs here write no report files (`--no-reports`): what they check is in the store and the output;
the reports a run writes are checked by test_run_outcome.py and the README's quickstart.

Known truth: with ignore_eos every request emits exactly output_tokens tokens, so the usage sum of
a trial is n_requests * output_tokens, and the server counter delta over the whole trial must equal
it exactly (an integer identity).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from truthput.run.plan import build_plan
from simhelpers import flagged_figures, run_experiment
from truthput.experiment.file import parse_experiment
from truthput.analyze.summary import StoredSummary


def stored_summary(store, run_id):
    return StoredSummary.from_json(store.run(run_id).summary_json)
from truthput.store.db import Store

ROOT = Path(__file__).resolve().parents[1]
TRUTHPUT = [sys.executable, "-m", "truthput"]

SEED_CMD = [
    "/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/qwen",
    "--tensor-parallel-size", "2", "--max-model-len", "8192", "--max-num-seqs", "64",
    "--kv-cache-dtype", "fp8", "--spec-method", "qwen3_5_mtp", "--spec-tokens", "3",
    "--enable-prefix-caching", "--host", "0.0.0.0", "--port", "8080",
]


def experiment_text(variants: str, *, concurrency=(1, 4), duration=1.0, output_tokens=24, starts=1, repeats=1,
                    engine="sim", command=None, extra="", sequential=False) -> str:
    cmd = json.dumps(command if command is not None else SEED_CMD)
    return f"""
[experiment]
name = "e2e"
baseline = "base"
seed = 3
[server]
engine = "{engine}"
command = {cmd}
ready_timeout_s = 30
stop_grace_s = 5
{extra}
[hardware]
gpu = "H100 SXM"
count = 2
[model]
profile = "llama-3.1-8b"
[sim]
noise = 0.0
startup_s = 0.1
log_stats_interval_s = 0.5
{variants}
[workload]
concurrency = {list(concurrency)}
duration_s = {duration}
warmup_s = 0
input_tokens = 32
output_tokens = {output_tokens}
ignore_eos = true
[measure]
starts = {starts}
sequential = {str(sequential).lower()}
repeats = {repeats}
output_guard = true
guard_prompts = 2
guard_max_tokens = 8
"""


BASE_VARIANTS = """
[[variant]]
name = "base"
[[variant]]
name = "spec1"
set = { "--spec-tokens" = 1, "--max-num-seqs" = 32 }
[[variant]]
name = "nospec"
remove = ["--speculative-config", "--enable-prefix-caching"]
"""


def _run(text: str, db: Path, engine: str | None = None) -> str:
    exp = parse_experiment(text, "e2e.toml")
    store = Store(db)
    return asyncio.run(run_experiment(exp, text, "e2e.toml", store, engine=engine, progress=lambda m: None))


def test_trials_hold_counter_figures_and_the_integrity_identity(tmp_path):
    db = tmp_path / "r.db"
    text = experiment_text(BASE_VARIANTS)
    run_id = _run(text, db)
    store = Store(db)
    assert store.run(run_id).status == "done"
    assert store.run(run_id).simulated == 1
    trials = store.trial_results(run_id)
    assert {(t.variant, t.concurrency) for t in trials} == {
        (v, c) for v in ("base", "spec1", "nospec") for c in (1, 4)}
    for t in trials:
        r = t.results.to_json_dict()
        assert t.status == "ok"
        reqs = store.requests(t.id)
        assert reqs and all(q.status == "ok" for q in reqs)
        # known truth: ignore_eos -> exactly output_tokens per request
        assert all(q.completion_tokens == 24 for q in reqs)
        integ = r["integrity"]
        assert integ["holds"] is True
        assert integ["counter_delta"]["value"] == 24 * len(reqs) == integ["usage_sum_ok"]["value"]
        assert integ["counter_delta"]["source"] == "server_counter"
        tp = r["throughput"]["counter_window"]
        assert tp["source"] == "server_counter" and tp["value"] > 0
        assert r["simulated"] is True
        # four scrapes, raw Prometheus text kept
        phases = [s.phase for s in store.scrapes(t.id)]
        assert list(dict.fromkeys(p for p in phases if p != "periodic")) == ["pre", "window_start", "window_end", "post"]
        # in-window samples: the server's own running-requests gauge saw the intended concurrency
        assert phases.count("periodic") >= 1
        samples = r["server_samples"]
        # (a sample can fall between one request's end and the next one's scheduling: max, not min)
        assert samples["n"] >= 3 and samples["running_max"]["value"] >= t.concurrency
        # (the simulator reports a request in prefill as waiting: a few samples may read below N)
        assert 0.25 * t.concurrency <= samples["running_mean"]["value"] <= t.concurrency
        # a clean simulated run: no validity flag on any figure, but what a busy host (the suite's other
        # workers) rightly says of itself: the client or the host was busy, a starved simulator's chunks
        # reached the client in bursts (per-stream rates then cannot be resolved), or its own gauge fell
        # short of the streams in the window (the streams reaching the server is held above by the
        # gauge's maximum)
        host_flags = {"client_bound", "host_interference", "load_not_reached", "burst_delivery"}
        wrong = [(name, [f.code for f in fig.flags if f.code not in host_flags])
                 for name, fig in flagged_figures(t.results)]
        assert not [w for w in wrong if w[1]], wrong
        host = t.results.interference.host_other_cores  # the sim's process group is the server's
        assert host is not None and host.value is not None
        codes = {f.code for f in t.results.throughput.counter_window.flags}
        assert ("host_interference" in codes) == (host.value > 0.5)
        assert "vllm:generation_tokens_total" in store.scrapes(t.id)[0].text
    # speculation counters only where speculation is on
    by_variant = {t.variant: t.results.to_json_dict() for t in trials if t.concurrency == 4}
    assert by_variant["base"]["spec_decode"]["k"] == 3
    assert by_variant["spec1"]["spec_decode"]["k"] == 1
    assert not by_variant["nospec"].get("spec_decode")
    summary = stored_summary(store, run_id)
    assert summary is not None and summary.verdict.lines(), "a verdict is written"
    # greedy output unchanged by speculation (the simulator promises it; the guard checks it)
    assert summary.guard["spec1"].exact_match_rate == 1.0


def test_variant_argv_is_exactly_what_the_experiment_asked(tmp_path):
    db = tmp_path / "r.db"
    exp = parse_experiment(experiment_text(BASE_VARIANTS), "e2e.toml")
    plan = build_plan(exp)
    base = plan.variant("base").argv.to_argv()
    spec1 = plan.variant("spec1").argv.to_argv()
    nospec = plan.variant("nospec").argv.to_argv()
    assert base == SEED_CMD
    # only the asked flags changed, in place
    changed = [(a, b) for a, b in zip(base, spec1) if a != b]
    assert changed == [("64", "32"), ("3", "1")]
    assert len(spec1) == len(base)
    assert nospec == [a for a in SEED_CMD if a not in (
        "--spec-method", "qwen3_5_mtp", "--spec-tokens", "3", "--enable-prefix-caching")]
    assert plan.variant("nospec").speculative is None
    assert plan.variant("spec1").speculative["num_speculative_tokens"] == 1


def test_failed_start_is_a_result_and_the_run_goes_on(tmp_path):
    variants = BASE_VARIANTS + """
[[variant]]
name = "too-long"
set = { "--max-model-len" = 4000000, "--gpu-memory-utilization" = 0.2 }
"""
    db = tmp_path / "r.db"
    run_id = _run(experiment_text(variants, concurrency=(2,)), db)
    store = Store(db)
    starts = {s.variant: s for s in store.starts(run_id)}
    bad = starts["too-long"]
    assert bad.status == "failed"
    assert bad.failure_class in ("kv_too_small", "oom", "invalid_config")
    assert bad.failure_line
    assert {t.variant for t in store.trial_results(run_id)} == {"base", "spec1", "nospec"}
    assert store.run(run_id).status == "done"
    assert "too-long" in stored_summary(store, run_id).failed


def test_pinned_port_in_use_is_refused_by_the_plan_and_recorded_when_taken_later(tmp_path, monkeypatch):
    from truthput.errors import InputError
    import truthput.run.plan as planning

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        port = blocker.getsockname()[1]
        text = experiment_text("[[variant]]\nname = \"base\"\n", concurrency=(1,), extra=f"port = {port}")
        db = tmp_path / "r.db"
        # taken when the run is planned: refused before any start (plan says the same)
        with pytest.raises(InputError, match=f"port {port}: something already listens"):
            _run(text, db)
        # taken between the plan and the start (the plan saw it free): the start's failure is recorded
        monkeypatch.setattr(planning, "_check_port", lambda exp, kind: None)
        run_id = _run(text, db)
    store = Store(db)
    (start,) = store.starts(run_id)
    assert start.failure_class == "port_in_use"
    assert str(port) in start.failure_reason
    assert store.trial_results(run_id) == []


def test_server_that_exits_at_once(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('ValueError: bad flag --frobnicate', file=sys.stderr); sys.exit(3)"]
    text = experiment_text("[[variant]]\nname = \"base\"\n", concurrency=(1,), engine="command", command=cmd)
    db = tmp_path / "r.db"
    run_id = _run(text, db)
    (start,) = Store(db).starts(run_id)
    assert start.status == "failed"
    assert "bad flag" in (start.log_excerpt or "") + (start.failure_line or "")


def test_server_without_metrics_falls_back_to_usage_and_says_so(tmp_path):
    cmd = [sys.executable, str(ROOT / "tests" / "stubserver.py"), "--tokens-per-chunk", "2", "--token-delay-s", "0.002",
           "--port", "{port}"]
    text = experiment_text("[[variant]]\nname = \"base\"\n", concurrency=(2,), engine="command", command=cmd,
                           output_tokens=20, extra='ready_url = "/v1/models"')
    db = tmp_path / "r.db"
    run_id = _run(text, db)
    store = Store(db)
    (trial,) = store.trial_results(run_id)
    r = trial.results.to_json_dict()
    assert r["throughput"]["counter_window"]["value"] is None
    assert "metrics" in json.dumps(r["throughput"]["counter_window"]).lower() or r["scrapes"][0]["error"]
    assert r["throughput"]["usage_window"]["value"] > 0
    from truthput.report.data import run_summary

    (cell,) = run_summary(store, run_id).cells
    assert cell.sources == ["usage"]
    store.close()
    _roofline_says_usage_in_every_view(db, run_id, tmp_path, r["throughput"]["usage_window"]["value"])


def _roofline_says_usage_in_every_view(db: Path, run_id: str, tmp_path: Path, usage_tokps: float) -> None:
    """The roofline places the cell's own headline figure, and every view names its source: here no
    server counter was read, so `usage` (never `server_counter`), in JSON, HTML, markdown and the
    terminal, through the commands a user runs."""
    out = tmp_path / "views"
    args = [*TRUTHPUT, "report", run_id, "--store", str(db)]
    made = subprocess.run([*args, "--json", str(out / "r.json"), "--md", str(out / "r.md"), "--html", str(out / "r.html")],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    doc = json.loads((out / "r.json").read_text())
    (row,) = doc["roofline"]["cells"]
    assert row["measured"]["source"] == "usage" and row["measured"]["label"] == "usage placed in time"
    assert row["measured"]["value"] == pytest.approx(usage_tokps)
    assert "server_counter" not in json.dumps(doc["roofline"])
    md = (out / "r.md").read_text()
    roof_md = md[md.index("### Roofline"):]
    roof_md = roof_md[:roof_md.index("\n###")] if "\n###" in roof_md else roof_md
    assert f"{row['measured']['value']:.1f} [usage placed in time]" in roof_md and "server counter" not in roof_md
    html = (out / "r.html").read_text()
    table = html[html.index('<table id="roofline-table">'):]
    table = table[:table.index("</table>")]
    assert "[usage placed in time]" in table and "server counter" not in table
    term = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert term.returncode == 0, term.stderr
    line = next(x for x in term.stdout.splitlines() if x.strip().startswith("base c=2:"))
    assert f"{row['measured']['value']:.1f} tok/s [usage placed in time]" in line


def _running(pids):
    """Pids that run (a zombie, dead but not yet reaped, does not)."""
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            out.append(pid)
    return out


def _pids_alive(pids):
    """The pids still running: a zombie (dead, waiting for whoever adopted it to reap it: on some
    hosts pid 1 reaps late) holds no port and no memory, and counts as gone."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "?"
        if state != "Z":
            alive.append(pid)
    return alive


def _port_listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_ctrl_c_keeps_finished_trials_stops_servers_and_resume_finishes(tmp_path):
    proc, db = _start_run(tmp_path, "e", 5, text=experiment_text(BASE_VARIANTS, concurrency=(1, 2), duration=1.0,
                                                                  repeats=2))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out.decode()
    assert b"--resume" in out
    store = Store(db)
    run_id = store.resolve_run("latest")
    assert store.run(run_id).status == "interrupted"
    starts = store.starts(run_id)
    assert not _pids_alive([s.pid for s in starts if s.pid]), "a server outlived Ctrl-C"
    assert not any(_port_listening(s.port) for s in starts if s.port)
    before = {(t.variant, t.start_index, t.concurrency, t.trial_index): t.id
              for t in store.trial_results(run_id)}
    store.close()
    done = subprocess.run([*TRUTHPUT, "run", "--resume", run_id, "--store", str(db), "--no-reports"],
                          capture_output=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    store = Store(db)
    assert store.run(run_id).status == "done"
    after = {(t.variant, t.start_index, t.concurrency, t.trial_index): t.id
             for t in store.trial_results(run_id)}
    assert len(after) == 3 * 2 * 2  # every planned trial, once
    assert all(after[k] == v for k, v in before.items()), "finished trials were redone"
    assert all(t.results.to_json_dict()["integrity"]["holds"] for t in store.trial_results(run_id))
    # the resume's progress counted the kept trials (not "0/12" from scratch)
    progress = done.stderr.decode()
    assert f"resumed, {len(before)} finished trial" in progress
    assert f" {len(before)}/12 trials" in progress or f" {len(before) + 1}/12 trials" in progress, progress[-2000:]
    # resuming a finished run says so and starts nothing
    n_starts = len(store.starts(run_id))
    store.close()
    again = subprocess.run([*TRUTHPUT, "run", "--resume", run_id, "--store", str(db)], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=120)
    assert again.returncode == 0 and f"run {run_id} is complete (status done): nothing to resume" in again.stdout
    store = Store(db)
    assert len(store.trial_results(run_id)) == 12 and len(store.starts(run_id)) == n_starts


@pytest.mark.slow
def test_the_winner_is_written_back_as_a_unit_that_imports_to_its_argv(tmp_path):
    """Import the seed's unit, A/B it on the simulator, and get the winning variant as a unit again."""
    from truthput.report.units import write_winner_units
    from truthput.experiment.unit import import_unit, parse_unit

    unit_path = ROOT / "tests" / "fixtures" / "units" / "gwen-original-config.service"
    text = import_unit(str(unit_path))
    text = text.replace('engine = "vllm"', 'engine = "sim"')
    # the imported file names the unit's model directory; the simulator needs a GPU and a profile
    # (what `run --sim-gpu --sim-model` sets), and the variants are the user's
    model_line = next(line for line in text.splitlines() if line.startswith("path = ") and "snapshots" in line)
    text = text.replace("[model]\n" + model_line + "\n", "")
    text = text.split("[[variant]]")[0] + """
[hardware]
gpu = "RTX 3090"
count = 2
[model]
profile = "qwen3.6-27b-5.5bit"
[sim]
noise = 0.01
startup_s = 0.1
[[variant]]
name = "baseline"
remove = ["--speculative-config"]
[[variant]]
name = "mtp3"
[workload]
concurrency = [1]
duration_s = 1.5
warmup_s = 0
input_tokens = 32
output_tokens = 24
[measure]
starts = 3   # 2 starts leave 1 degree of freedom: too wide an interval to name a winner reliably
sequential = false
repeats = 1
output_guard = true
guard_prompts = 1
guard_max_tokens = 8
"""
    exp = parse_experiment(text, "imported.toml")
    db = tmp_path / "r.db"
    run_id = asyncio.run(run_experiment(exp, text, "imported.toml", Store(db), progress=lambda m: None))
    store = Store(db)
    paths = write_winner_units(store, db, run_id, tmp_path / "out")
    assert [p.name for p in paths] == [f"{run_id}-mtp3.service"], stored_summary(store, run_id).verdict.lines()
    unit = parse_unit(paths[0].read_text())
    original = parse_unit(unit_path.read_text())
    # same argv as the user's own unit (mtp3 changed nothing), same sections, normal restart policy kept
    assert unit.exec_start_argv() == original.exec_start_argv()
    assert unit.get("Service", "Restart") == original.get("Service", "Restart")


def _assert_interrupted_and_nothing_left(db, why: str) -> None:
    """The stopped run is marked interrupted, and no server pid or port of it is left."""
    store = Store(db, read_only=True)
    run_id = store.resolve_run("latest")
    assert store.run(run_id).status == "interrupted"
    starts = store.starts(run_id)
    assert not _pids_alive([s.pid for s in starts if s.pid]), why
    assert not any(_port_listening(s.port) for s in starts if s.port)


def _start_run(tmp_path, name: str, min_trials: int, preexec=None, text: str | None = None):
    """`truthput run` in a subprocess, returned once `min_trials` trials are committed (mid-run)."""
    exp = tmp_path / f"{name}.toml"
    exp.write_text(text or experiment_text(BASE_VARIANTS, concurrency=(1, 2), duration=0.8, starts=2))
    db = tmp_path / f"{name}.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*TRUTHPUT, "run", str(exp), "--store", str(db), "--no-reports"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            preexec_fn=preexec)
    deadline = time.monotonic() + 120
    n = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists():
            try:
                with sqlite3.connect(db) as c:
                    n = c.execute("SELECT count(*) FROM trials").fetchone()[0]
            except sqlite3.OperationalError:
                n = 0
        if n >= min_trials:
            break
        time.sleep(0.1)
    assert n >= min_trials, "no trials committed in time"
    return proc, db


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_the_servers_and_mark_the_run_interrupted(tmp_path, sig):
    # the signal's default disposition, whatever the test runner inherited (`nohup pytest` ignores
    # SIGHUP, and truthput rightly keeps an inherited ignore)
    proc, db = _start_run(tmp_path, sig.name, 2, preexec=lambda: signal.signal(sig, signal.SIG_DFL))
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, out.decode()
    assert f"stopped by {sig.name}".encode() in out and b"--resume" in out
    _assert_interrupted_and_nothing_left(db, "a server outlived the signal")


@pytest.mark.slow
def test_sighup_inherited_as_ignored_stays_ignored(tmp_path):
    """`nohup truthput run`: a closed terminal must not stop the run."""
    proc, db = _start_run(tmp_path, "nohup", 1, preexec=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert proc.poll() is None, "SIGHUP stopped a run started with SIGHUP ignored"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM


@pytest.mark.slow
def test_a_server_dies_with_truthput_even_after_kill_9(tmp_path):
    """kill -9 of truthput mid-run with a pinned port: the server dies with it (parent-death signal),
    the resume can bind the same port again, marks the dead start lost, measures the rest of that
    round on a new server (a replicate of its own) and finishes."""
    from truthput.engines.ports import free_port

    port = free_port("127.0.0.1")
    text = experiment_text(BASE_VARIANTS, concurrency=(1, 2), duration=0.8, starts=2, extra=f"port = {port}")
    proc, db = _start_run(tmp_path, "kill9", 1, text=text)
    with sqlite3.connect(db) as c:
        spawned = c.execute("SELECT pid, info_json FROM starts WHERE pid IS NOT NULL").fetchall()
    pids = [r[0] for r in spawned]
    # each spawned server's identity (boot id / start ticks) is recorded with its pid: a resume tells
    # it from a process that reuses the pid
    assert spawned and all("/" in (json.loads(info or "{}").get("process") or "") for _, info in spawned)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _pids_alive(pids):
        time.sleep(0.2)
    assert not _pids_alive(pids), "a server outlived kill -9 of truthput (no parent-death signal)"
    # the resume marks the dead run's unfinished start lost (its finished trials stay), starts new
    # servers, and finishes
    store = Store(db, read_only=True)
    run_id = store.resolve_run("latest")
    kept = len(store.trial_results(run_id))
    out = subprocess.run([*TRUTHPUT, "run", "--resume", run_id, "--store", str(db), "--no-reports"],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "left by a stopped truthput" in out.stderr
    store = Store(db, read_only=True)
    statuses = [s.status for s in store.starts(run_id)]
    assert "lost" in statuses and not {"starting", "ready"} & set(statuses)
    trials = store.trial_results(run_id)
    assert len(trials) >= kept and store.run(run_id).status == "done"
    assert "port_in_use" not in out.stderr and all(s.port == port for s in store.starts(run_id))
    lost = {s.id: (s.variant, s.start_index) for s in store.starts(run_id) if s.status == "lost"}
    for t in trials:  # a trial belongs to the server it ran on; none of the resume's runs on a lost one
        start = next(s for s in store.starts(run_id) if s.id == t.start_id)
        assert (start.variant, start.start_index) == (t.variant, t.start_index)
    resumed = [t for t in trials if (t.variant, t.start_index) in lost.values() and t.start_id not in lost]
    if resumed:  # the round's rest ran on a new server: the cell counts it as a replicate of its own
        from truthput.analyze.cells import build_cells

        cells = {c.key: c for c in build_cells(trials)}
        t = resumed[0]
        assert len(cells[(t.variant, t.concurrency)].per_start) == len({x.start_id for x in trials
                                                                        if (x.variant, x.concurrency) ==
                                                                        (t.variant, t.concurrency)})


SAME_VARIANTS = """
[[variant]]
name = "base"
[[variant]]
name = "same"
set = { "--max-num-seqs" = 256 }
"""


def test_sequential_run_adds_rounds_until_decided_or_max_starts(tmp_path):
    """Two configurations the simulator serves alike, 5% start noise: the first look (2 starts) cannot
    decide, so the runner adds an interleaved round, stops at max_starts, and the verdict says "not
    decided" with the starts that would likely decide it, or decided (equivalent) if the noise allows."""
    db = tmp_path / "r.db"
    text = experiment_text(SAME_VARIANTS, concurrency=(1,), duration=0.5, starts=2, sequential=True,
                           output_tokens=8).replace("noise = 0.0", "noise = 0.05")
    text = text.replace("[measure]\n", "[measure]\nmax_starts = 3\n")
    lines: list[str] = []
    exp = parse_experiment(text, "e2e.toml")
    run_id = asyncio.run(run_experiment(exp, text, "e2e.toml", Store(db), progress=lines.append))
    store = Store(db)
    starts = [(s.variant, s.start_index) for s in store.starts(run_id)]
    record = stored_summary(store, run_id)
    assert record is not None
    (cv,) = [c for c in record.verdict.per_concurrency if c.metric == "tok/s"]
    (comp,) = cv.comparisons
    events = [r[0] for r in store.conn.execute(
        "SELECT message FROM events WHERE run_id=? AND kind='stopping_rule'", (run_id,))]
    assert events and "stopped after" in events[-1]
    if len(starts) == 6:  # undecided at the first look: one round added, interleaved
        assert starts[4:] == [("base", 2), ("same", 2)]
        assert any("adding start round 3" in str(x) for x in lines)
    assert len(starts) in (4, 6)
    assert comp.outcome in ("equivalent", "not decided", "faster", "slower")
    if comp.outcome == "not decided":
        more = comp.more_starts
        assert more is not None and more >= 1 and (f"about {more} more start" in comp.line if more <= 100
                                                    else "more than 100 more starts" in comp.line)
    assert record.stopping is not None and record.stopping.first_look == 2 and record.stopping.max_starts == 3


def test_plan_forecasts_starts_from_stored_noise_else_a_stated_default(tmp_path):
    """`truthput plan` says how many starts the stopping rule will likely need: from the start noise of
    earlier runs on this host in the store when there are some, else from the default CV it names."""
    exp = tmp_path / "e.toml"
    exp.write_text(experiment_text(SAME_VARIANTS, concurrency=(1,), starts=2, sequential=True)
                   .replace("[measure]\n", "[measure]\nmax_starts = 4\n"))
    out = subprocess.run([*TRUTHPUT, "plan", str(exp), "--store", str(tmp_path / "none.db")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "first look at 2 starts per variant, at most 4; 1 comparisons decided together" in text
    assert "a default start CV of 10%" in text and "100%: " in text
    assert not (tmp_path / "none.db").exists()  # plan reads a store, never creates one
    db = tmp_path / "r.db"
    _run(experiment_text(SAME_VARIANTS, concurrency=(1,), duration=0.5, starts=2, output_tokens=8)
         .replace("noise = 0.0", "noise = 0.05"), db)
    out = subprocess.run([*TRUTHPUT, "plan", str(exp), "--store", str(db)], capture_output=True, text=True,
                         timeout=120)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and "the start CV of 1 earlier run(s) here: " in text, text


def test_run_exits_non_zero_when_no_variant_produced_a_measurement(tmp_path):
    """Every start is refused (a max-model-len far above the model's): the failures are recorded as
    results, the run is stored failed, and `truthput run` says in one line that nothing was
    measured, exit 1."""
    variants = """
[[variant]]
name = "base"
set = { "--max-model-len" = 99999999 }
[[variant]]
name = "other"
set = { "--max-model-len" = 99999999, "--max-num-seqs" = 8 }
"""
    exp = tmp_path / "bad.toml"
    exp.write_text(experiment_text(variants, concurrency=(1,), duration=0.5))
    db = tmp_path / "bad.db"
    out = subprocess.run([*TRUTHPUT, "run", str(exp), "--store", str(db), "--no-reports"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "no variant produced a measurement (base: " in out.stderr
    store = Store(db)
    run_id = store.resolve_run("latest")  # the only run, though not a finished one
    assert store.run(run_id).status == "failed"
    assert {s.status for s in store.starts(run_id)} == {"failed"}


def test_a_full_disk_is_one_line_and_keeps_committed_trials(tmp_path):
    """The store cannot grow past a file-size limit (RLIMIT_FSIZE, as a full disk without root):
    `truthput run` ends with one line saying so and how to resume, exit 1, no traceback, no server
    left, and the trials committed before are still readable."""
    import resource

    limit = 1_500_000

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    exp = tmp_path / "full.toml"
    exp.write_text(experiment_text(BASE_VARIANTS, concurrency=(1, 4), duration=1.0, starts=3))
    db = tmp_path / "full.db"
    out = subprocess.run([*TRUTHPUT, "run", str(exp), "--store", str(db), "--no-reports"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, preexec_fn=small_files)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert "could not write (" in out.stderr and "a full disk" in out.stderr and "--resume" in out.stderr
    store = Store(db, read_only=True)
    run_id = store.resolve_run("latest")
    starts = store.starts(run_id)
    assert not _pids_alive([s.pid for s in starts if s.pid]), "a server outlived the failure"
    assert all(t.status in ("ok", "failed") for t in store.trial_results(run_id))


@pytest.mark.slow
def test_a_second_resume_of_a_running_run_is_refused_in_one_line(tmp_path):
    """While one truthput runs a run, `--resume` of the same run from another process fails at once
    with one line (no trial of the first is redone or lost); after it ends, the resume works."""
    proc, db = _start_run(tmp_path, "lock", 1)
    try:
        run_id = Store(db, read_only=True).resolve_run("latest")
        out = subprocess.run([*TRUTHPUT, "run", "--resume", run_id, "--store", str(db)], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
        assert out.returncode != 0 and "Traceback" not in out.stderr
        assert f"run {run_id} in {db} is being run or resumed by another truthput right now" in out.stderr
    finally:
        proc.communicate(timeout=240)
    assert proc.returncode == 0
    assert Store(db, read_only=True).run(run_id).status == "done"


@pytest.mark.slow
def test_a_second_signal_during_teardown_kills_the_servers_and_still_records(tmp_path):
    """Two SIGTERMs in quick succession (an impatient operator, a CI cancel that escalates): the first
    starts the teardown, the second SIGKILLs every server's process group; truthput still marks the
    run interrupted, prints the resume line, and leaves no server or port behind."""
    proc, db = _start_run(tmp_path, "twice", 1)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    text = out.decode()
    assert proc.returncode == 128 + signal.SIGTERM, text[-2000:]
    assert "Traceback" not in text and "stopped by SIGTERM" in text and "--resume" in text
    _assert_interrupted_and_nothing_left(db, "a server outlived two signals")


def test_a_leftover_server_is_stopped_only_when_it_is_the_recorded_process(tmp_path):
    """`stop_leftover_server` stops the recorded process (same identity, same program) and its group;
    a pid with another identity -- or, in a store without one, a start at another time -- is a
    stranger and is left alone."""
    from truthput.engines.process import _program_names, process_identity, process_started_at, stop_leftover_server

    spawned = time.time()
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        identity = process_identity(p.pid)
        assert identity and identity != process_identity(os.getpid())
        assert abs(process_started_at(p.pid) - spawned) < 5.0
        assert stop_leftover_server(p.pid, spawned - 100.0, ["sleep"]) == "not ours"
        assert stop_leftover_server(p.pid, spawned, ["sleep"], identity=identity.split("/")[0] + "/1") == "not ours"
        assert p.poll() is None
        # without an identity the program must match too
        assert stop_leftover_server(p.pid, spawned, ["/usr/bin/python3"]) == "not ours"
        assert p.poll() is None
        # (with the identity, the program may differ: a server started as `sh -c "exec ..."` is
        # still that very process)
        # the wall clock may have moved since the spawn (a stepped clock, a paused VM): the identity holds
        seen = (identity, process_identity(p.pid), Path(f"/proc/{p.pid}/cmdline").read_bytes(),
                _program_names(p.pid))
        assert seen[0] == seen[1], seen
        assert stop_leftover_server(p.pid, spawned + 3600.0, ["/bin/sleep", "300"], grace_s=5,
                                    identity=identity) == "stopped", seen
        p.wait(timeout=10)
        assert stop_leftover_server(p.pid, spawned, ["sleep"], identity=identity) == "gone"
    finally:
        if p.poll() is None:
            p.kill()


def test_a_leftover_is_known_by_its_command_name_where_proc_hides_its_cmdline(tmp_path, monkeypatch):
    """Some sandboxes' /proc give another process's cmdline as empty: the recorded server is then
    known by its command name (or the file it executes), and a stranger is still left alone."""
    import builtins

    from truthput.engines import process as proc_mod

    real_open = builtins.open

    def open_without_cmdlines(path, *a, **kw):  # a fake of such a sandbox's /proc, named as one
        if str(path).startswith("/proc/") and str(path).endswith("/cmdline"):
            return io.BytesIO(b"")
        return real_open(path, *a, **kw)

    spawned = time.time()
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        identity = proc_mod.process_identity(p.pid)
        monkeypatch.setattr(builtins, "open", open_without_cmdlines)
        assert "sleep" in [os.path.basename(n) for n in proc_mod._program_names(p.pid)]
        assert identity  # a store without one falls back to the start time and the program's name
        assert proc_mod.stop_leftover_server(p.pid, spawned, ["/usr/bin/python3"]) == "not ours"
        assert p.poll() is None
        assert proc_mod.stop_leftover_server(p.pid, spawned, ["/bin/sleep", "300"], grace_s=5) == "stopped"
        p.wait(timeout=10)
    finally:
        monkeypatch.undo()
        if p.poll() is None:
            p.kill()


def _procs_with(arg: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if arg.encode() in f.read().split(b"\0"):
                        out.append(int(name))
            except OSError:
                pass
    return out


def test_a_servers_daemon_child_in_its_own_session_is_stopped_too(tmp_path):
    """The server's command starts a child that leaves its process group and session (setsid, its
    parent gone): truthput, as subreaper, still finds it at teardown; nothing of the run survives."""
    marker = f"{7000 + os.getpid() % 1000}.5"
    sim = [sys.executable, "-m", "truthput.sim", "serve", "--host", "127.0.0.1", "--port", "{port}",
           "--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b", "--sim-startup-s", "0.1"]
    script = f"(setsid sleep {marker} &) ; exec " + " ".join(sim)
    exp = tmp_path / "daemon.toml"
    exp.write_text(experiment_text('[[variant]]\nname = "base"\n', concurrency=(1,), duration=0.5,
                                   engine="command", command=["bash", "-c", script]))
    out = subprocess.run([*TRUTHPUT, "run", str(exp), "--store", str(tmp_path / "d.db"), "--no-reports"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    # a measured run, and --no-reports wrote nothing beside the store
    assert "report: " not in out.stdout and not (tmp_path / "reports").exists(), out.stdout[-1500:]
    deadline = time.monotonic() + 5
    while _procs_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _procs_with(marker)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, "a server's setsid child outlived the run"


def _fresh_run_on(db, tmp_path):
    """A new, short `truthput run` (not a resume) on the store `db`; it must succeed."""
    fresh = tmp_path / "fresh.toml"
    fresh.write_text(experiment_text(BASE_VARIANTS[:BASE_VARIANTS.index("[[variant]]\nname = \"spec1\"")] +
                                     '[[variant]]\nname = "b"\nset = { "--max-num-seqs" = 32 }\n',
                                     concurrency=(1,), duration=0.3))
    out = subprocess.run([*TRUTHPUT, "run", str(fresh), "--store", str(db), "--no-reports"], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_a_servers_daemon_child_left_by_a_killed_run_is_stopped_by_a_fresh_run(tmp_path):
    """kill -9 of truthput while its server has a child in its own session (setsid): the server dies
    with truthput (parent-death signal), the child gets no signal and lives on. A fresh `run` on the
    store stops it by the identity recorded with the start, and leaves a stranger alone."""
    marker = f"{8000 + os.getpid() % 1000}.25"
    sim = [sys.executable, "-m", "truthput.sim", "serve", "--host", "127.0.0.1", "--port", "{port}",
           "--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b", "--sim-startup-s", "0.1"]
    script = f"(setsid sleep {marker} &) ; exec " + " ".join(sim)
    variants = '[[variant]]\nname = "base"\n[[variant]]\nname = "other"\nset = { "--max-num-seqs" = 32 }\n'
    text = experiment_text(variants, concurrency=(1,), duration=0.5, starts=3, engine="command",
                           command=["bash", "-c", script])
    stranger = subprocess.Popen(["sleep", f"{marker}1"])  # not the server's: must survive
    try:
        proc, db = _start_run(tmp_path, "daemon9", 1, text=text)
        with sqlite3.connect(db) as c:
            infos = [json.loads(i or "{}") for (i,) in c.execute("SELECT info_json FROM starts")]
        assert any(i.get("descendants") for i in infos), infos
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        time.sleep(1.0)
        assert _procs_with(marker), "the setsid child should outlive kill -9 of truthput (test premise)"
        out = _fresh_run_on(db, tmp_path)
        left = _procs_with(marker)
        for p in left:
            os.kill(p, signal.SIGKILL)
        assert not left, "a fresh run left the killed run's server child running"
        assert stranger.poll() is None, "a process that was never the server's was stopped"
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.slow
def test_a_crash_under_load_ends_that_start_and_two_fail_the_variant(tmp_path):
    """A variant whose server is killed (SIGKILL) a moment into its first trial: each such start ends
    as `crash_under_load` with its own class, the other variant is unaffected, and after two crashes
    the variant is failed instead of started a third time."""
    sim = [sys.executable, "-m", "truthput.sim", "serve", "--host", "127.0.0.1", "--port", "{port}",
           "--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b", "--sim-startup-s", "0.1"]
    script = (" ".join(sim) + ' & s=$!; if [ -n "$CRASH_AFTER" ]; then sleep "$CRASH_AFTER"; kill -9 $s; fi; '
              "wait $s")
    variants = '[[variant]]\nname = "base"\n[[variant]]\nname = "crashy"\nenv = { CRASH_AFTER = "2.5" }\n'
    exp = tmp_path / "crash.toml"
    exp.write_text(experiment_text(variants, concurrency=(1,), duration=3.0, starts=3, engine="command",
                                   command=["bash", "-c", script]))
    db = tmp_path / "c.db"
    out = subprocess.run([*TRUTHPUT, "run", str(exp), "--store", str(db), "--no-reports"],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    # crashy never measured: the run says so and exits 3 (base's figures are kept and reported)
    assert out.returncode == 3, out.stderr[-3000:]
    assert "variant(s) never measured (crashy: " in out.stderr
    store = Store(db, read_only=True)
    run_id = store.resolve_run("latest")
    starts = {(s.variant, s.start_index): s for s in store.starts(run_id)}
    crashed = [k for k, s in starts.items() if s.failure_class == "crash_under_load"]
    assert crashed == [("crashy", 0), ("crashy", 1)], {k: (s.status, s.failure_class) for k, s in starts.items()}
    assert all(starts[k].status == "failed" for k in crashed)
    assert ("crashy", 2) not in starts  # not started a third time
    assert [k for k in starts if k[0] == "base"] == [("base", 0), ("base", 1), ("base", 2)]
    assert "crashy: failed" in " ".join(stored_summary(store, run_id).verdict.lines())


def test_a_variant_that_never_measures_exits_non_zero_and_says_why(tmp_path):
    """Its own flags keep a variant's server from starting (too little GPU memory for the model's
    weights: the simulator fails at start-up, as vLLM does; plan cannot know the weights' size on
    the real card): the others are measured and reported, the run exits 3 naming the variant and the
    reason in the terminal; a run where nothing measured exits 1, is stored `failed`, and `latest`
    names it: the newest run, in every command."""
    variants = """
[[variant]]
name = "base"
[[variant]]
name = "tiny-ctx"
set = { "--gpu-memory-utilization" = 0.05 }
"""
    (tmp_path / "e.toml").write_text(experiment_text(variants, concurrency=(1,), duration=0.5))
    proc = subprocess.run([*TRUTHPUT, "run", str(tmp_path / "e.toml"), "--store", str(tmp_path / "r.db"), "--no-reports"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if "never measured" in ln]
    assert "tiny-ctx" in line and "No available memory for the cache blocks" in line, line
    store = Store(tmp_path / "r.db")
    good = store.resolve_run("latest")
    assert store.run(good).status == "done"

    nothing = """
[[variant]]
name = "base"
set = { "--gpu-memory-utilization" = 0.05 }
[[variant]]
name = "other"
set = { "--gpu-memory-utilization" = 0.06 }
"""
    (tmp_path / "n.toml").write_text(experiment_text(nothing, concurrency=(1,), duration=0.5, starts=2,
                                                     sequential=True))
    proc = subprocess.run([*TRUTHPUT, "run", str(tmp_path / "n.toml"), "--store", str(tmp_path / "r.db"), "--no-reports"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "no variant produced a measurement" in proc.stderr, proc.stderr[-2000:]
    store = Store(tmp_path / "r.db")
    runs = store.runs()
    assert [r.status for r in runs] == ["done", "failed"]
    failed = store.resolve_run("latest")  # the newest run, whatever its status, in every command
    assert failed == runs[-1].id != good
    # nothing to compare: no start round is added after the first look
    # (a server that cannot start for want of memory is not started again: its start 0 at most)
    assert {s.start_index for s in store.starts(failed)} <= {0, 1}
    report = subprocess.run([*TRUTHPUT, "report", "--store", str(tmp_path / "r.db")], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path, env=dict(os.environ, COLUMNS="200"))
    assert report.returncode == 0 and failed in report.stdout, report.stdout
    said = report.stdout[report.stdout.index("nothing was measured"):]
    assert "No available memory for the cache blocks" in said and "What to try" in said and "┃" not in report.stdout
    assert "None" not in report.stdout and "roofline" not in report.stdout


@pytest.mark.slow
def test_a_fresh_run_stops_a_server_an_earlier_killed_run_left(tmp_path):
    """A server that ignores SIGTERM outlives kill -9 of its truthput (the parent-death signal is
    SIGTERM). A fresh `run` on the same store (not a resume) finds the dead run by its free lock,
    stops that very server (recorded identity) and marks the old run interrupted."""
    # sh ignores SIGTERM and waits on the server (which itself stops on SIGTERM, as aiohttp does);
    # its output goes to /dev/null: a server writing to the dead truthput's pipe could die of that
    stub = (f"{sys.executable} {ROOT / 'tests' / 'stubserver.py'} --tokens-per-chunk 1 --token-delay-s 0.002 "
            "--port {port} >/dev/null 2>&1 & wait")
    cmd = ["sh", "-c", "trap '' TERM; " + stub]
    variants = '[[variant]]\nname = "base"\n[[variant]]\nname = "other"\nset = { "--tokens-per-chunk" = 2 }\n'
    text = experiment_text(variants, concurrency=(1,), engine="command", command=cmd, duration=0.5, starts=3,
                           extra='ready_url = "/v1/models"')
    proc, db = _start_run(tmp_path, "ignore-term", 1, text=text)
    time.sleep(0.5)
    with sqlite3.connect(db) as c:
        (pid,) = c.execute("SELECT pid FROM starts WHERE status IN ('starting', 'ready') ORDER BY id DESC "
                           "LIMIT 1").fetchone()
        (old_run,) = c.execute("SELECT id FROM runs").fetchone()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    time.sleep(1.0)
    assert _running([pid]), "the SIGTERM-ignoring server should have outlived kill -9 (test premise)"
    out = _fresh_run_on(db, tmp_path)
    assert not _running([pid]), "a fresh run left the earlier run's server running"
    assert f"(pid {pid}) was still running and was stopped" in out.stderr, out.stderr[:3000]
    assert Store(db, read_only=True).run(old_run).status == "interrupted"


def test_a_variant_that_changes_nothing_is_refused_before_any_start(tmp_path):
    """`set` to the value the baseline already has: plan and run refuse it in one line naming both
    variants, exit 2, and nothing is started or stored."""
    variants = '[[variant]]\nname = "base"\n[[variant]]\nname = "dup"\nset = { "--max-num-seqs" = 64 }\n'
    (tmp_path / "d.toml").write_text(experiment_text(variants, concurrency=(1,)))
    for cmd in ("plan", "run"):
        out = subprocess.run([*TRUTHPUT, cmd, str(tmp_path / "d.toml"), "--store", str(tmp_path / "d.db")],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 2, (cmd, out.stderr)
        assert "'dup' starts the same server as 'base'" in out.stderr and out.stderr.count("\n") == 1
    assert not (tmp_path / "d.db").exists()
