"""Hostile but legal servers x the views a user reads: every figure is within 0.5% of the known
truth or carries the flag named for its condition, wherever the user reads it; where usage
placed in time exists the headline is within 0.5% of truth; clean conditions carry no flag.

The servers are tests/truthserver.py's known-truth fake (every token on a ledger), played in
virtual time; each condition's trials are committed to a real store and read back through the
terminal table, the report document (JSON), markdown, HTML, CSV, compare and the audit matrix.
"""

from __future__ import annotations

import dataclasses
import time
from array import array
from pathlib import Path

import pytest
from rich.console import Console

from truthput.measure.prom import Scrape
from truthput.measure.trial import measure_trial
from truthput.store.db import Store, TrialKey

from truthserver import TruthConfig, simulate

TOL = 0.005


def _whole_responses_in_one_read(sim):
    """The client received each response in one read: every chunk at the response's end."""
    for r in sim.records:
        if r.chunk_times:
            last = r.chunk_times[-1]
            r.chunk_times = array("d", [last] * len(r.chunk_times))
            r.t_first = last


def _client_reads_late(sim, late_s=0.02):
    """A busy client host: every chunk is read two decode steps after the server sent it, so a
    window's edge scrapes count tokens whose chunks this client reads on the other side."""
    for r in sim.records:
        r.chunk_times = array("d", [t + late_s for t in r.chunk_times])
        r.t_first = r.t_first + late_s if r.t_first is not None else None
        r.t_end = r.t_end + late_s if r.t_end is not None else None


def _no_usage_at_all(sim):
    """A server that never sends usage: no final counts, no running counts."""
    for r in sim.records:
        r.completion_tokens = None
        r.chunk_tokens = array("q", [-1] * len(r.chunk_times))


def _busy_host(results):
    """Another process used 1.5 of 2 cores in the window: what the pipeline's host sampler reports,
    judged by the same check `run` applies after measuring (every window figure flagged)."""
    from truthput.measure.methods import figure
    from truthput.measure.validity import check_interference

    results.interference.host_other_cores = figure(1.5, "cores", "client_clock", window="window")
    results.interference.host_cores = 2
    check_interference(results)


def _metrics_gone_at_window_end(sim):
    """/metrics stops answering: the window_end scrape fails."""
    sim.scrapes[2] = Scrape("window_end", sim.scrapes[2].t_mono, None, "GET /metrics failed: connection refused")


@dataclasses.dataclass
class Condition:
    name: str
    cfg: dict
    flag: str | None = None
    """The flag the headline must carry when it is off by more than 0.5% (None: clean)."""
    per_stream_flag: str | None = None
    usage: bool = True
    post: object = None
    reset_between: tuple[str, str] | None = None
    """Put the counter reset between these two scrapes (found by a dry run of the same config)."""
    after: object = None
    """Applied to each trial's results after measuring (as the pipeline's host checks are)."""
    engine: str = "vllm"
    """"command": a server truthput knows nothing of (tokens per chunk unknown, no chunk bound)."""


def _cfg(**kw):
    return dict({"concurrency": 4, "requests": 48, "max_tokens": 40}, **kw)


CONDITIONS = [
    Condition("clean", _cfg()),
    Condition("clean, 3 tokens per chunk", _cfg(tokens_per_chunk=(3,))),
    Condition("clean, usage only at the end", _cfg(continuous_usage=False), usage=False),
    Condition("clean, a request fails mid-stream", _cfg(fail_request=5)),
    Condition("clean, the client reads two steps late", _cfg(), post=_client_reads_late),
    Condition("clean, the client reads two steps late, speculative", _cfg(spec_k=3), post=_client_reads_late),
    Condition("another client's tokens on the counter", _cfg(foreign_tps=64.0), flag="foreign_traffic"),
    Condition("metrics lag by time, with usage", _cfg(metrics_lag_s=0.08), flag="stale_counter"),
    # without running usage only the chunk bound speaks, and it is tight where a chunk is one
    # token (vLLM without speculation); with several tokens per chunk it is loose (said in `validity`)
    Condition("metrics lag by time, usage only at the end", _cfg(metrics_lag_s=0.08, continuous_usage=False,
                                                                 tokens_per_chunk=(1,)),
              flag="stale_counter", usage=False),
    Condition("metrics one scrape behind, with usage", _cfg(metrics_lag_scrapes=True), flag="stale_counter"),
    # an unknown engine (tokens per chunk unknown) with final usage only: whole requests bound it
    Condition("command engine, metrics lag by time, usage only at the end",
              _cfg(metrics_lag_s=0.3, continuous_usage=False, requests=96), flag="stale_counter", usage=False,
              engine="command"),
    Condition("command engine, clean, usage only at the end", _cfg(continuous_usage=False, requests=96),
              usage=False, engine="command"),
    # a stale counter never stays the headline beside usage flagged only for the host's conditions
    Condition("metrics one scrape behind, with usage, on a busy host", _cfg(metrics_lag_scrapes=True),
              flag="stale_counter", after=_busy_host),
    Condition("metrics one scrape behind, usage only at the end", _cfg(metrics_lag_scrapes=True,
                                                                       continuous_usage=False),
              flag="stale_counter", usage=False),
    Condition("counter reset inside the window, with usage", _cfg(reset_at=102.0), flag="counter_reset"),
    Condition("counter reset inside the window, usage only at the end", _cfg(reset_at=102.0, continuous_usage=False),
              flag="counter_reset", usage=False),
    Condition("counter reset before the window", _cfg(reset_at=100.02)),  # after `pre`, before the window
    Condition("counter reset inside the window, no _created series", _cfg(reset_at=102.0, created_series=False),
              flag="counter_reset"),
    # a replica far behind (reads ~0) answers one scrape: a dip, not a restart (which would count the
    # next scrape's whole value again, far above truthput's own tokens)
    Condition("a stale scrape near zero inside the window, no _created series",
              _cfg(periodic_scrapes=5, stale_scrapes=(3,), stale_lag_s=100.0, created_series=False)),
    Condition("counter reset after the window", _cfg(), reset_between=("window_end", "post")),
    Condition("counter restart seen only in _created (the value rose)", _cfg(), flag="counter_reset",
              reset_between=("window_start", "window_start+")),
    Condition("whole responses in one read", _cfg(), per_stream_flag="burst_delivery",
              post=_whole_responses_in_one_read),
    Condition("usage never sent", _cfg(continuous_usage=False), usage=False, post=_no_usage_at_all),
    Condition("/metrics gone at the window's end", _cfg(), post=_metrics_gone_at_window_end),
]


def _reset_time(cfg: dict, between: tuple[str, str]) -> float:
    times = {s.phase: s.t_mono for s in simulate(TruthConfig(**cfg)).scrapes}
    if between[1] == "window_start+":  # just after window_start: the post-restart count overtakes it
        return times["window_start"] + 0.005
    return (times[between[0]] + times[between[1]]) / 2


def _store(path: Path, cond: Condition) -> tuple[Store, str, float]:
    db = Store(path)
    rid = db.create_run(cond.name, "external", False, None, "", 0, {})
    db.put_variant(rid, "v", 0, True, ["serve"], {"lines": []}, {})
    truths = []
    for start in range(2):
        cfg = dict(cond.cfg, prefill_s=0.05 + 0.002 * start)
        if cond.reset_between:
            cfg["reset_at"] = _reset_time(cfg, cond.reset_between)
        sim = simulate(TruthConfig(**cfg))
        if cond.post:
            cond.post(sim)
        res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, cond.cfg["concurrency"],
                            engine=cond.engine)
        if cond.after:
            cond.after(res)
        ws, we = sim.window
        truths.append(sim.ledger.between(ws, we) / (we - ws))
        db.commit_trial(rid, "v", None, TrialKey("v", start, cond.cfg["concurrency"], 0), "ok", time.time(), 0.0,
                        sim.window, we, res, sim.records, sim.scrapes)
    db.set_run_status(rid, "done")
    return db, rid, sum(truths) / len(truths)


def _audit(db, rid):
    from truthput.analyze.audit import audit_of

    return audit_of(db.trial_results(rid), bool(db.run(rid).simulated))


def _text(fn, *args) -> str:
    con = Console(record=True, width=400)
    fn(*args, console=con)
    return con.export_text()


@pytest.mark.parametrize("cond", CONDITIONS, ids=[c.name for c in CONDITIONS])
def test_every_view_is_right_or_flagged(cond, tmp_path):
    from truthput.report.data import build_report_data, compare_runs
    from report_fixture import read_csv
    from truthput.report.export import write_csv
    from truthput.report.html import render_html
    from truthput.report.markdown import render_markdown
    from truthput.report.terminal import print_audit_matrix, print_run

    db, rid, truth = _store(tmp_path / "s.db", cond)
    doc_model = build_report_data(db, rid)
    doc = doc_model.to_dict()
    (cell,) = [c for c in doc["cells"] if c["status"] == "ok"]
    value = cell["tokps"]["value"]
    right = abs(value - truth) <= TOL * truth
    codes = {f["code"] for f in cell["tokps"]["flags"]}
    # the document: right, or flagged with the condition's flag
    assert right or (cond.flag is not None and cond.flag in codes), (value, truth, codes)
    if cond.usage:
        assert right, f"usage placed in time exists: the headline must be right ({value} vs {truth})"
    set_aside = {f["code"] for f in cell.get("counter_set_aside") or []}
    if cond.flag is None:
        assert not codes and not set_aside
        if cond.per_stream_flag is None:
            assert not doc["flags"], doc["flags"]
    ps_codes = {f["code"] for f in cell["per_stream"]["flags"]}
    if cond.per_stream_flag:
        assert cond.per_stream_flag in ps_codes or cell["per_stream"]["value"] is None
    elif cond.flag is None:
        assert not ps_codes
    shown = codes | ps_codes
    # every other view shows the same flags, or none when there are none
    terminal = _text(print_run, db, rid)
    markdown = render_markdown(doc_model)
    # the page's tables and notes carry the flags; its plots are drawn on flagged runs by
    # test_every_view_of_flagged_runs (22 conditions x ~1 s of matplotlib would add nothing here)
    html = render_html(doc_model, plots={})
    rows = read_csv(next(p for p in write_csv(doc_model, tmp_path / "csv") if p.name == "cells.csv"))
    cmp_model = compare_runs(db, rid, db, rid)
    cmp = cmp_model.to_dict()
    audit = _text(print_audit_matrix, _audit(db, rid))
    for code in shown:
        assert f"!{code}" in terminal and "! flagged" in terminal
        assert f"!{code}" in markdown and code in html
        assert code in rows[0]["tokps_flags"] + rows[0].get("per_stream_flags", "")
        if code in codes:
            assert code in {f["code"] for f in cmp["rows"][0]["a"]["flags"]}
            assert any(code in n for n in cmp["notes"])
    for code in codes:
        assert f"!{code}" in audit
    for code in set_aside:  # the counter set aside for usage says why, in the terminal and the reports
        assert f"counter: {code}" in terminal and f"counter: {code}" in markdown and code in html
    if not shown and not set_aside:
        assert "flagged" not in terminal and " !" not in terminal
        assert "**flagged**" not in markdown and not rows[0]["tokps_flags"]
        assert not cmp["rows"][0]["a"]["flags"]
    # the headline's source is said: usage placed in time where the counter was set aside
    if cond.usage and cond.flag:
        assert cell["tokps"]["source"] == "usage" and "counter_set_aside" in cell
        assert "usage placed in time" in terminal


@pytest.mark.slow
@pytest.mark.parametrize("continuous", [True, False], ids=["with usage", "usage only at the end"])
def test_load_table_against_a_metrics_endpoint_one_scrape_behind(continuous, tmp_path, capsys):
    """`truthput load` over real HTTP: a /metrics answering what the previous scrape would have
    seen. With running usage, or without it (each request's final usage placed on its chunks), the
    table's headline is truthput's own tokens (within 0.5% of the server's ledger) and the counter
    is set aside with its reason."""
    import asyncio

    from truthput.load.workload import WorkloadSpec
    from truthput.run.load import LoadOptions, run_load
    from truthput.report.loadtable import print_summary
    from truthserver import TruthServer

    async def go():
        server = await TruthServer(TruthConfig(concurrency=4, max_tokens=40, step_s=0.01, metrics_lag_scrapes=True,
                                               continuous_usage=continuous, tokens_per_chunk=(1,))).start()
        try:
            opts = LoadOptions(url=server.url, concurrency=[4], duration_s=1.5,
                               workload=WorkloadSpec(input_tokens=16, output_tokens=40))
            run = await run_load(opts, Store(tmp_path / "l.db"))
        finally:
            await server.stop()
        return server, opts, run

    server, opts, run = asyncio.run(go())
    (row,) = run.rows()
    res = run.outcomes[0].results
    ws, we = res.window.start, res.window.end
    truth = server.ledger.between(ws, we) / (we - ws)
    capsys.readouterr()
    print_summary(run.summary)
    table = capsys.readouterr().out
    # with running usage, or without it (each request's final usage placed on its chunks): the
    # headline is truthput's own tokens, the stale counter set aside with its reason
    # the ledger dates a token when the server sent it, the client when it read it: over real HTTP
    # on a host the suite saturates, a stream's token at each window edge can land on either side
    edges = 2 * 4 / (we - ws)  # one token a stream at each of the two edges, in tok/s
    assert row.headline_source == "usage" and abs(row.headline_tps - truth) <= max(TOL * truth, edges), (row, truth)
    assert any(f.code == "stale_counter" and f.figure == "counter" for f in row.counter_set_aside)
    assert "counter set aside for usage placed in time: stale_counter" in table
    assert "usage placed in time" in table


def test_a_zero_trial_leaves_every_view_readable(tmp_path):
    """A /metrics far behind (state as of 10 s ago) and no running usage: the counter's window reads
    0.0 in one start. That trial keeps its 0.0 with its flag in the trial table; the cell leaves it
    out (a ratio to zero has no interval) and says so; the terminal, markdown, HTML, CSV, compare
    and audit all render."""
    from truthput.report.data import build_report_data, compare_runs
    from truthput.report.export import write_csv
    from truthput.report.html import render_html
    from truthput.report.markdown import render_markdown
    from truthput.report.terminal import print_audit_matrix, print_run

    db = Store(tmp_path / "z.db")
    rid = db.create_run("zero", "external", False, None, "", 0, {})
    db.put_variant(rid, "v", 0, True, ["serve"], {"lines": []}, {})
    for start, lag in enumerate((10.0, 0.0, 0.0)):
        cfg = dict(_cfg(continuous_usage=False, metrics_lag_s=lag), prefill_s=0.05 + 0.002 * start)
        sim = simulate(TruthConfig(**cfg))
        if start == 0:
            _no_usage_at_all(sim)  # nothing of truthput's own to fall back on: the counter's 0.0 stays
        res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
        if start == 0:
            assert res.headline().value == 0.0 and res.headline().flagged
        db.commit_trial(rid, "v", None, TrialKey("v", start, 4, 0), "ok", time.time(), 0.0, sim.window,
                        sim.window[1], res, sim.records, sim.scrapes)
    db.set_run_status(rid, "done")
    doc_model = build_report_data(db, rid)
    doc = doc_model.to_dict()
    (cell,) = doc["cells"]
    assert cell["status"] == "ok" and cell["n_starts"] == 2
    assert any("left out of the cell's figures" in w for w in doc["warnings"])
    zero = [t for t in doc["trials"] if t["start_index"] == 0][0]
    assert zero["headline_tokps"]["value"] == 0.0 and zero["headline_tokps"]["flags"]
    terminal = _text(print_run, db, rid)
    assert "left out of the cell's figures" in terminal
    assert "left out of the cell's figures" in render_markdown(doc_model)
    assert "left out of the cell" in render_html(doc_model)
    assert write_csv(doc_model, tmp_path / "csv")
    assert compare_runs(db, rid, db, rid).rows
    assert "v" in _text(print_audit_matrix, _audit(db, rid))
