"""`truthput load` end to end against benchmarks/leanstub.py (a fake engine with exact /metrics
counters, in its own process): token totals equal the server counter, trials are stored, worker
processes merge exactly, the self-check flags an injected slow chunk path, the API key stays out.
"""

from __future__ import annotations

import os

import asyncio
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from leanstub import LeanStubProcess  # noqa: E402

from truthput.errors import InputError  # noqa: E402
from truthput.run.load import LoadOptions, run_load  # noqa: E402
from truthput.load.goodput import SLO  # noqa: E402
from truthput.load.workers import TrialLoad, WorkerPool, share, split_evenly  # noqa: E402
from truthput.load.workload import Workload, WorkloadSpec  # noqa: E402
from truthput.store.db import Store  # noqa: E402


@pytest.fixture(scope="module")
def stub():
    with LeanStubProcess(tokens_per_chunk=3, token_delay_ms=0.5) as s:
        yield s


def opts(url: str, **kw) -> LoadOptions:
    base = dict(url=url, concurrency=[4], requests=24,
                workload=WorkloadSpec(input_tokens=16, output_tokens=40))
    base.update(kw)
    return LoadOptions(**base)


def test_load_counts_every_token_and_stores_the_trials(stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRUTHPUT_SECRET_KEY", "sk-very-secret-123")
    db = Store(tmp_path / "t.db")
    before = stub.stats()["generation_tokens"]
    o = opts(stub.url, concurrency=[2, 5], api_key_env="TRUTHPUT_SECRET_KEY", slo=SLO(ttft_ms=5000, itl_ms=1000))
    run = asyncio.run(run_load(o, db))
    assert stub.stats()["generation_tokens"] - before == 2 * 24 * 40
    rows = run.rows()
    assert [r.level for r in rows] == [2, 5]
    for r in rows:
        assert r.requests == 24 and r.failed == 0
        assert r.client_tokens == 24 * 40 and r.tokens_equal  # usage sum == counter delta, exactly
        assert r.counter_tps and r.counter_tps > 0
        assert r.good_fraction == 1.0  # generous targets: every request is good
    trials = db.trial_results(run.run_id)
    assert [(t.concurrency, t.status) for t in trials] == [(2, "ok"), (5, "ok")]
    assert trials[0].results.to_json_dict()["integrity"]["holds"] is True
    assert trials[0].results.to_json_dict()["load"]["mode"] == "closed"
    assert len(db.requests(trials[0].id)) == 24
    assert {s.phase for s in db.scrapes(trials[1].id)} == {"pre", "window_start", "window_end", "post"}
    runrow = db.run(run.run_id)
    assert runrow.status == "done" and runrow.engine == "external" and not runrow.simulated
    assert "TRUTHPUT_SECRET_KEY" in runrow.experiment_toml
    blob = Path(tmp_path / "t.db").read_bytes()
    assert b"sk-very-secret-123" not in blob  # the key itself is never stored


def test_open_loop_trial_through_the_driver(stub) -> None:
    o = opts(stub.url, rate=[200.0], arrival="constant", max_in_flight=6, requests=30)
    run = asyncio.run(run_load(o))
    (row,) = run.rows()
    assert row.mode == "open" and row.requests == 30 and row.client_tokens == 30 * 40 and row.tokens_equal
    assert run.outcomes[0].load.max_in_flight <= 6


def test_sweep_through_the_driver_stops_at_max_level() -> None:
    # a stub paced at 4 ms per token is far from saturated at 1..4 streams (at 0.5 ms, 4 streams
    # need some 2,700 chunks/s, more than a stub starved by a busy 2-core host sends): throughput
    # about doubles per step, so the sweep runs to its max level and says it did not saturate
    with LeanStubProcess(tokens_per_chunk=3, token_delay_ms=4.0) as slow_stub:
        o = opts(slow_stub.url, concurrency=[1], sweep=True, sweep_max=4, requests=8)
        run = asyncio.run(run_load(o))
    assert [x.level for x in run.outcomes] == [1, 2, 4]
    tps = [x.counter_tps for x in run.outcomes]
    assert tps[1] > 1.3 * tps[0] and tps[2] > 1.3 * tps[1]
    sweep = run.summary.sweep
    assert sweep is not None and not sweep.saturated and sweep.saturation_level == 4
    assert all(r.tokens_equal for r in run.rows())


def test_injected_slow_chunk_path_is_flagged_client_bound(stub) -> None:
    fast = asyncio.run(run_load(opts(stub.url, requests=12)))
    slow = asyncio.run(run_load(opts(stub.url, requests=12, test_chunk_spin_s=0.004)))
    (f,), (s,) = fast.rows(), slow.rows()
    assert s.client_bound, s
    assert "lag" in s.client_reason or "CPU" in s.client_reason
    assert s.tokens_equal and f.tokens_equal  # still exact: slow, not lossy
    # The flag follows the injected delay (on a quiet machine the fast run is not flagged; on a
    # loaded shared one the OS may stall it too, so compare rather than assert its absence).
    assert s.lag_p99_ms > f.lag_p99_ms and s.lag_p99_ms > 20


def test_split_and_share_are_exact() -> None:
    assert split_evenly(32, 3) == [11, 11, 10] and sum(split_evenly(7, 7)) == 7
    parts = share(TrialLoad(concurrency=5, max_requests=37), 2)
    assert [p.concurrency for p in parts] == [3, 2] and [p.max_requests for p in parts] == [19, 18]
    parts = share(TrialLoad(concurrency=2, max_requests=10), 4)  # more workers than streams
    assert len(parts) == 2 and [p.concurrency for p in parts] == [1, 1]
    parts = share(TrialLoad(mode="open", rate=9.0, max_in_flight=5, max_requests=20), 3)
    assert [p.rate for p in parts] == [3.0, 3.0, 3.0] and [p.max_in_flight for p in parts] == [2, 2, 1]


def test_worker_processes_merge_exactly(stub) -> None:
    pool = WorkerPool(LoadOptions(url=stub.url, requests=1).client_config(), 3).start()
    try:
        async def go():
            wl = Workload(WorkloadSpec(input_tokens=16, output_tokens=30), seed=5)
            calls = []

            async def ws() -> None:
                calls.append("ws")

            async def we() -> None:
                calls.append("we")

            before = stub.stats()["generation_tokens"]
            closed = await pool.run(wl, TrialLoad(concurrency=7, max_requests=41), ws, we)
            mid = stub.stats()["generation_tokens"]
            timed = await pool.run(wl, TrialLoad(concurrency=6, duration_s=0.4), ws, we)
            after = stub.stats()["generation_tokens"]
            opened = await pool.run(wl, TrialLoad(mode="open", rate=300.0, arrival="constant", max_in_flight=4,
                                                  max_requests=25), ws, we)
            return closed, timed, calls, mid - before, after - mid, wl, opened

        closed, timed, calls, sent1, sent2, wl, opened = asyncio.run(go())
    finally:
        pool.close()
    # every one of the 41 requests, each index once, bodies identical to a single process's
    assert [r.idx for r in closed.records] == list(range(41))
    assert sum(r.completion_tokens for r in closed.records) == 41 * 30 == sent1
    assert {r.worker for r in closed.records} == {0, 1, 2}
    assert all(r.status == "ok" for r in closed.records)
    assert calls == ["ws", "we", "ws", "we", "ws", "we"]
    # open loop across 3 workers: every request once, exact tokens, the cap split 2+1+1
    assert [r.idx for r in opened.records] == list(range(25))
    assert sum(r.completion_tokens for r in opened.records) == 25 * 30
    assert opened.max_in_flight <= 4
    assert closed.t_window_start < closed.t_window_end
    # window opened only once every worker's streams were generating: all 7 had a first token by then
    first_tokens = sorted(r.t_first for r in closed.records)
    assert first_tokens[6] <= closed.t_window_start
    # timed trial: merged token total is what the server sent, nothing dropped
    assert sum(r.completion_tokens or 0 for r in timed.records) == sent2
    assert timed.t_window_end - timed.t_window_start == pytest.approx(0.4, abs=0.15)
    assert len({r.idx for r in timed.records}) == len(timed.records)


def test_cli_load_runs_and_prints_the_summary(stub, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from truthput.cli import app

    res = CliRunner().invoke(app, ["load", stub.url, "-c", "3", "-n", "9", "--output-tokens", "20",
                                   "--input-tokens", "uniform:4:12", "--store", str(tmp_path / "c.db"),
                                   "--slo-ttft-ms", "2000"])
    assert res.exit_code == 0, res.output
    assert "180 / 180" in res.output and "equal" in res.output
    bad = CliRunner().invoke(app, ["load", stub.url, "-n", "2", "--input-tokens", "zipf:3", "--no-store"])
    assert bad.exit_code != 0 and isinstance(bad.exception, InputError) and "--input-tokens" in str(bad.exception)


def test_load_options_need_a_stop_condition() -> None:
    with pytest.raises(InputError, match="--requests"):
        LoadOptions(url="http://x")
    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        with pytest.raises(InputError, match="--duration .*: expected a finite number of seconds > 0"):
            LoadOptions(url="http://x", duration_s=bad)
    with pytest.raises(InputError, match="--rate"):
        LoadOptions(url="http://x", duration_s=1.0, rate=[float("inf")])
    toml = opts("http://h:1", rate=[2.5]).toml()
    import tomllib

    parsed = tomllib.loads(toml)
    assert parsed["load"]["mode"] == "open" and parsed["load"]["rate"] == [2.5]
    assert parsed["load"]["workload"]["input_tokens"] == {"kind": "fixed", "value": 16} or \
        parsed["load"]["workload"]["input_tokens"] == 16
    assert json.dumps(parsed)  # plain data


def test_driver_with_worker_processes_counts_exactly(stub, tmp_path: Path) -> None:
    # uvloop in the parent as `truthput load` runs it, and results larger than a pipe's buffer
    # (uvloop makes watched fds non-blocking: a big pickled result once failed with EAGAIN)
    import uvloop

    o = opts(stub.url, concurrency=[8], requests=160, workers=2,
             workload=WorkloadSpec(input_tokens=16, output_tokens=150))
    pool = WorkerPool(o.client_config(), 2).start()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            run = runner.run(run_load(o, Store(tmp_path / "w.db"), pool))
    finally:
        pool.close()
    (row,) = run.rows()
    assert row.requests == 160 and row.client_tokens == 160 * 150 and row.tokens_equal
    assert {r.worker for r in run.outcomes[0].load.records} == {0, 1}
    assert run.outcomes[0].results.integrity.model_dump()["holds"] is True


@pytest.mark.slow
def test_sigterm_ends_truthput_load_keeping_finished_trials(stub, tmp_path: Path) -> None:
    import os
    import signal
    import sqlite3
    import subprocess
    import time

    db = tmp_path / "t.db"
    proc = subprocess.Popen([sys.executable, "-m", "truthput", "load", stub.url, "-c", "1,2", "--duration", "30",
                             "--output-tokens", "16", "--store", str(db)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    running = False
    while time.monotonic() < deadline and not running:  # until the run is under way
        time.sleep(0.2)
        if db.exists():
            try:
                with sqlite3.connect(db) as c:
                    running = c.execute("SELECT count(*) FROM runs WHERE status='running'").fetchone()[0] == 1
            except sqlite3.OperationalError:
                pass
    time.sleep(2.0)  # inside the first 30 s trial
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    assert b"stopped by SIGTERM" in err
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"


def test_load_exits_non_zero_when_every_request_failed(tmp_path: Path) -> None:
    """Nothing listens at the URL: every request is refused; the load ends at its error budget (not
    after the whole duration), says why in one line, and exits 1."""
    import time

    from typer.testing import CliRunner

    from truthput.cli import app

    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["load", "http://127.0.0.1:9", "-c", "2", "--duration", "60", "--model", "m",
                                   "--no-store"])
    assert res.exit_code == 1, res.output
    assert "every request failed" in res.output and "127.0.0.1:9" in res.output
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_a_hostile_server_cannot_grow_the_client_or_the_store(tmp_path):
    """A server (the stub, a FAKE) whose second chunk is one 8 MB event and whose /metrics carries a
    20 MB line: every request fails with the cap named, the client's peak memory stays far below
    what holding the events would take, and the store keeps no megabyte line."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stub = subprocess.Popen([sys.executable, str(root / "tests" / "stubserver.py"), "--port", str(port), "--metrics",
                             "--huge-event-bytes", "8000000", "--metrics-junk-bytes", "20000000",
                             "--token-delay-s", "0.001"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from simhelpers import wait_listening

        wait_listening(port, 20)
        # the load runs in a child that reports its own peak resident memory (KiB) on its last line
        wrapper = ("import resource, sys\nfrom truthput.cli import main\nsys.argv = ['truthput'] + sys.argv[1:]\n"
                   "try:\n    main()\nexcept SystemExit:\n    pass\n"
                   "print('peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n")
        proc = subprocess.run([sys.executable, "-c", wrapper, "load", f"http://127.0.0.1:{port}", "--engine",
                               "command", "--store", str(tmp_path / "l.db"), "-c", "4", "-n", "12",
                               "--output-tokens", "32"], capture_output=True, text=True, timeout=180, cwd=tmp_path)
        peak_kib = int(proc.stderr.strip().splitlines()[-1].split()[1])
    finally:
        stub.terminate()
        stub.wait(10)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    import sqlite3

    db = sqlite3.connect(tmp_path / "l.db")
    errors = [e for (e,) in db.execute("SELECT error FROM requests")]
    assert errors and all(e and "4 MiB" in e for e in errors), errors[:3]
    longest = db.execute("SELECT max(length(text)) FROM scrapes").fetchone()[0] or 0
    assert longest < 1_000_000, longest
    assert "over 64 KiB not stored" in db.execute("SELECT text FROM scrapes LIMIT 1").fetchone()[0]
    # 12 events of 8 MB held would be ~100 MB of text alone (24 of them peaked at 1.78 GB before the
    # caps: about 0.9 GB for 12, above the bound)
    print(f"peak resident memory of the load: {peak_kib / 1024:.0f} MiB")
    assert peak_kib < 600 * 1024, peak_kib


def _stub_process(*args: str):
    """tests/stubserver.py (a FAKE server with set timings) on a free port, as `load` meets it."""
    import socket
    import subprocess

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(root / "tests" / "stubserver.py"), "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from simhelpers import wait_listening

    wait_listening(port, 20)
    return proc, f"http://127.0.0.1:{port}"


def _load_cli(*args: str, cwd: Path):
    import subprocess

    return subprocess.run([sys.executable, "-m", "truthput", "load", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "COLUMNS": "160"})


def test_load_prints_latency_percentiles_that_match_the_servers_timings(tmp_path: Path) -> None:
    """The stub waits 60 ms before the first token, then 10 ms per token, one token per chunk: TTFT
    is 70 ms, TPOT and ITL 10 ms, E2E 60 + 24 x 10 = 300 ms. A sleep only overshoots, so each figure
    is at least its truth; on a host busy with the rest of the suite 25 sleeps overshoot by up to a
    few ms each, so the upper bounds allow 30%. `--json` and the table both carry them."""
    proc, url = _stub_process("--metrics", "--token-delay-s", "0.01", "--prefill-delay-s", "0.06")
    try:
        done = _load_cli(url, "-c", "2", "-n", "10", "--output-tokens", "24", "--json", "--no-store", cwd=tmp_path)
        table = _load_cli(url, "-c", "2", "-n", "4", "--output-tokens", "24", "--store", "l.db", cwd=tmp_path)
    finally:
        proc.terminate()
        proc.wait(10)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    row = doc["levels"][0]
    lat = row["latency_ms"]
    for q in ("mean", "p50"):
        assert 69 <= lat["ttft"][q] <= 91, lat["ttft"]
        assert 9.9 <= lat["tpot"][q] <= 13, lat["tpot"]
        assert 9.5 <= lat["itl"][q] <= 13, lat["itl"]
        assert 299 <= lat["e2e"][q] <= 390, lat["e2e"]
    assert lat["e2e"]["p99"] >= lat["e2e"]["p90"] >= lat["e2e"]["p50"]
    # two streams, each request ~0.3 s: ~6.5 req/s; every token counted by the server's counter
    assert 5.0 <= row["requests_per_s"] <= 7.0, row
    assert row["client_tokens"] == 10 * 24 and row["tokens_equal"] and row["headline_source"] == "server_counter"
    assert row["total_tps"] > row["headline_tps"] > 0
    assert table.returncode == 0, table.stderr[-2000:]
    for label in ("TTFT", "TPOT", "ITL", "E2E", "p50", "p90", "p99", "req/s", "total tok/s"):
        assert label in table.stdout, (label, table.stdout)
    # `report` on the stored load run shows what applies: percentiles, no comparison, no verdict
    import subprocess

    report = subprocess.run([sys.executable, "-m", "truthput", "report", "--store", "l.db"], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    for label in ("TTFT", "TPOT", "ITL", "E2E", "p50", "p90", "p99", "req/s", "total tok/s"):
        assert label in report.stdout, (label, report.stdout)  # what `load` printed
    for absent in ("vs baseline", "Verdict", "server starts per variant", "roofline"):
        assert absent not in report.stdout, (absent, report.stdout)


def test_load_says_why_there_is_no_counter_and_no_client_token_count(tmp_path: Path) -> None:
    """A /metrics without the token counter, and a server that sends no usage: the views say both,
    instead of a bare '-' against a DIFFER or a client count of 0."""
    proc, url = _stub_process("--metrics", "--metrics-without-counter", "--continuous-usage", "none",
                              "--token-delay-s", "0.001")
    try:
        done = _load_cli(url, "-c", "2", "-n", "6", "--output-tokens", "16", "--no-store", cwd=tmp_path)
        as_json = _load_cli(url, "-c", "2", "-n", "6", "--output-tokens", "16", "--no-store", "--json", cwd=tmp_path)
    finally:
        proc.terminate()
        proc.wait(10)
    out = " ".join(done.stdout.split())
    assert "no server counter figure: metric not exposed: the server's /metrics has no vllm:generation_tokens_total" \
        in out, out
    row = json.loads(as_json.stdout)["levels"][0]
    assert row["counter_tokens"] is None and "vllm:generation_tokens_total" in row["counter_missing"]
    assert row["client_tokens"] is None
    assert "the server sent no usage counts: client tokens unknown" in out
    assert "DIFFER" not in out and " 0 / -" not in out
    # ITL's bare '-' says why too: no token counts per chunk (a chunk is not a token)
    assert "2 streams: no ITL figures: missing data: no per-chunk token counts" in out, out
    assert "no per-chunk token counts" in row["latency_missing"]["itl"] and "ttft" not in row["latency_missing"]


def test_report_of_a_stored_load_run_decides_nothing(stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load run compares nothing: its report, in every form, computes no verdict (counted)."""
    from typer.testing import CliRunner

    import truthput.analyze.summary as summary
    from truthput.cli import app

    db = tmp_path / "l.db"
    run = asyncio.run(run_load(opts(stub.url, concurrency=[2], requests=8), Store(db)))
    calls: list[str] = []
    for name in ("summarize", "decide"):
        real = getattr(summary, name)
        monkeypatch.setattr(summary, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name),
                                                                                    _real(*a, **k))[1])
    runner = CliRunner()
    for extra in ([], ["--json", str(tmp_path / "l.json")], ["--md", str(tmp_path / "l.md")],
                  ["--html", str(tmp_path / "l.html")]):
        res = runner.invoke(app, ["report", str(run.run_id), "--store", str(db), *extra])
        assert res.exit_code == 0, res.output
    assert calls == []
    doc = json.loads((tmp_path / "l.json").read_text())
    assert doc["verdict"]["detail"]["per_concurrency"] == [] and "load run" in doc["verdict"]["from"]
    # the counters count: the same inputs decided as a comparison call both
    from truthput.analyze.summary import summary_of
    from truthput.store.summary import summary_inputs

    given = summary_inputs(Store(db), str(run.run_id))
    given.compares = True
    summary_of(given, fresh=True)
    assert calls == ["summarize", "decide"]
