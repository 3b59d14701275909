"""The typed results model against a store recorded by the code before it, and the views a user
reads agreeing with each other.

tests/fixtures/results/recorded.sql.gz (made by record_store.py beside it) holds three runs with
raw scrapes, request rows and server logs: `truthput run` on the simulator (spec decode, 2 starts),
`truthput run` against a server without /metrics, and `truthput load` against `truthput sim serve`.
Every trial is recomputed from those raw rows and must give the stored figures exactly.
"""

from __future__ import annotations

from simhelpers import flagged_figures

import gzip
import json
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from truthput.errors import StoreError
from truthput.load.records import RequestRecord
from truthput.measure.model import RESULTS_SCHEMA, TrialResults
from truthput.measure.prom import Scrape
from truthput.measure.trial import measure_trial
from truthput.experiment.argv import ServerArgv, speculative_settings
from truthput.store.db import Store, decode_chunks

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "results" / "recorded.sql.gz"
NEW_IN_SCHEMA_2 = ("server_samples", "validity")
"""Sections the recorded code did not compute (nothing to compare them with)."""


def restore(path: Path) -> Store:
    conn = sqlite3.connect(path)
    conn.executescript(gzip.open(FIXTURE, "rt", encoding="utf-8").read())
    conn.close()
    return Store(path)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    return restore(tmp_path_factory.mktemp("recorded") / "r.db")


def run_id(store: Store, name: str) -> str:
    return next(r.id for r in store.runs() if r.name == name)


def _records(store: Store, trial_id: int) -> list[RequestRecord]:
    out = []
    for r in store.requests(trial_id):
        t, running, text = decode_chunks(r.chunks_json)
        out.append(RequestRecord(idx=r.idx, t_start=r.t_start, t_end=r.t_end or r.t_start, t_first=r.t_first,
                                 chunk_times=t, chunk_tokens=running, chunk_texts=text,
                                 prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                                 finish_reason=r.finish_reason, status=r.status, http_status=r.http_status,
                                 error=r.error))
    return out


def _comparable(doc: dict) -> dict:
    """The recomputable part of a results document: what measure_trial computes, without the
    figure `window` labels (added by this schema) and the sections the old code did not have."""
    def strip(x):
        if isinstance(x, dict):
            is_figure = "value" in x and "unit" in x and "source" in x
            # an interval row's `slack` (the bound it was judged by) and the requests' work (completion
            # and prompt tokens each, finish reasons) are newer than the recording
            return {k: strip(v) for k, v in x.items() if not (is_figure and k in ("window", "flags"))
                    and not (k == "slack" and "usage_arrived" in x)
                    and not (k in ("completion_tokens_mean", "prompt_tokens_mean", "finish_reasons",
                                   "completion_tokens_sd", "prompt_tokens_sd") and "failed_mid_stream" in x)}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    keep = {k: v for k, v in doc.items() if k not in NEW_IN_SCHEMA_2 and k not in
            ("simulated", "telemetry", "client", "load", "goodput")}
    return strip(keep)


def recompute(store: Store, rid: str, raw: bool = False) -> list:
    """(stored, recomputed) results documents of every trial of a run, in the order they ran."""
    run = store.run(rid)
    engine = {"sim": "vllm", "command": "command", "external": "vllm"}[run.engine]
    spec = {v.name: speculative_settings(ServerArgv.parse(v.argv))
            for v in store.variants(rid)} if run.engine != "external" else {}
    out = []
    flushed: dict[int | None, float] = {}
    for row in sorted(store.trial_results(rid), key=lambda r: r.t0_mono):
        logs = None
        if row.start_id is not None and run.engine != "external":
            # the runner saw the lines it had read since its last flush, up to the end of the trial
            lo = max(row.t0_mono - 1.0, flushed.get(row.start_id, float("-inf")))
            end = row.t_end if row.t_end is not None else float("inf")
            logs = [(x.t_mono, x.line) for x in store.logs(row.start_id) if lo < x.t_mono <= end]
            flushed[row.start_id] = end
        scrapes = [Scrape(s.phase, s.t_mono, s.text, s.error) for s in store.scrapes(row.id)]
        new = measure_trial(_records(store, row.id), scrapes, logs, (row.window_start, row.window_end),
                            row.concurrency, engine=engine, speculative=spec.get(row.variant))
        old = row.results
        out.append((old, new) if raw else (_comparable(old.to_json_dict()), _comparable(new.to_json_dict())))
    return out


@pytest.mark.parametrize("name", ["recorded-sim", "recorded-nometrics", "load"])
def test_recorded_trials_recompute_to_the_stored_figures_exactly(store, name):
    pairs = recompute(store, run_id(store, name))
    assert pairs
    for old, new in pairs:
        assert new == old


@pytest.mark.parametrize("name", ["recorded-sim", "recorded-nometrics", "load"])
def test_clean_recorded_trials_carry_no_validity_flag(store, name):
    for _old, new in recompute(store, run_id(store, name), raw=True):
        assert flagged_figures(new) == []
        assert new.headline().source == ("usage" if name == "recorded-nometrics" else "server_counter")


def test_recorded_store_opens_converted_and_a_newer_one_is_refused(store, tmp_path):
    rid = run_id(store, "recorded-sim")
    trials = store.trial_results(rid)
    assert len(trials) == 12 and all(t.results.schema_version == RESULTS_SCHEMA for t in trials)
    t = trials[0]
    # schema 1 kept whole-trial figures under `throughput`; they are read into their own section
    assert t.results.whole_trial.usage_trial.value is not None
    assert t.results.whole_trial.counter_trial.source == "server_counter"
    assert any(r.method == "word probe per request" for r in t.results.methods)
    newer = restore(tmp_path / "newer.db")
    newer.conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    newer.conn.commit()
    newer.close()
    with pytest.raises(StoreError, match="schema 99 is newer"):
        Store(tmp_path / "newer.db")
    with pytest.raises(StoreError, match="newer than this truthput reads"):
        TrialResults.from_stored({"schema": RESULTS_SCHEMA + 1})


def test_usage_fallback_is_labelled_usage_in_every_export(store, tmp_path):
    from truthput.report.data import build_report_data
    from report_fixture import read_csv
    from truthput.report.export import write_csv
    from truthput.report.html import render_html

    rid = run_id(store, "recorded-nometrics")
    doc_model = build_report_data(store, rid)
    doc = doc_model.to_dict()
    cells = [c for c in doc["cells"] if c["status"] == "ok"]
    assert cells and all(c["tokps"]["source"] == "usage" and "no server counter" in c["tokps"]["note"]
                         for c in cells)
    assert all(t["headline_tokps"]["source"] == "usage" and t["counter_tokps"]["value"] is None
               for t in doc["trials"])
    rows = read_csv(next(p for p in write_csv(doc_model, tmp_path / "csv") if p.name == "cells.csv"))
    assert rows and all(r["tokps_source"] == "usage" for r in rows)
    html = render_html(doc_model)
    assert "no server counter figure: running usage count differences" in html


def test_compare_of_a_usage_run_with_itself_has_its_rows(store):
    from truthput.report.data import compare_runs

    rid = run_id(store, "recorded-nometrics")
    cmp_model = compare_runs(store, rid, store, rid)
    cmp = cmp_model.to_dict()
    assert len(cmp["rows"]) == 2  # base and again, c=2
    for row in cmp["rows"]:
        assert row["a"]["source"] == row["b"]["source"] == "usage"
        assert row["ratio"]["value"] == pytest.approx(1.0) and row["ratio"]["lo"] <= 1.0 <= row["ratio"]["hi"]


def test_table_verdict_and_report_show_one_interval(store):
    from rich.console import Console

    from truthput.report.data import build_report_data
    from truthput.report.data import run_summary
    from truthput.report.terminal import print_run

    rid = run_id(store, "recorded-sim")
    summary = run_summary(store, rid)
    doc_model = build_report_data(store, rid)
    doc = doc_model.to_dict()
    con = Console(record=True, width=250)
    print_run(store, rid, console=con)
    text = con.export_text()
    compared = 0
    for cv in summary.verdict.per_concurrency:
        for comp in cv.comparisons:
            e = comp.estimate
            cell = next(c for c in doc["cells"] if c["variant"] == comp.variant and c["concurrency"] == cv.level)
            assert (cell["delta_pct"]["lo"], cell["delta_pct"]["hi"]) == pytest.approx((e.pct_lo, e.pct_hi))
            hi = f"{e.pct_hi:+.1f}" if e.pct_hi <= 999 else ">+999.0"  # past reading, printed as a bound
            assert f"{e.pct:+.1f}% ({e.pct_lo:+.1f}..{hi})" in text
            assert comp.line in doc["verdict"]["lines"]
            compared += 1
    assert compared == 4  # spec1 and nospec vs base, at c=1 and c=4


def _with_client_bound_trial(store: Store, tmp_path: Path) -> Store:
    import shutil

    copy = tmp_path / "bound.db"
    shutil.copy(store.path, copy)
    conn = sqlite3.connect(copy)
    tid, text = conn.execute("SELECT id, results_json FROM trials WHERE variant='spec1' ORDER BY id LIMIT 1").fetchone()
    doc = json.loads(text)
    doc["client"]["selfcheck"] = {**(doc["client"].get("selfcheck") or {}), "client_bound": True,
                                  "reason": "event-loop lag p99 42.0 ms"}
    conn.execute("UPDATE trials SET results_json=? WHERE id=?", (json.dumps(doc), tid))
    conn.commit()
    conn.close()
    return Store(copy)


def test_client_bound_warning_reaches_every_report_format(store, tmp_path):
    from rich.console import Console

    from truthput.report.data import build_report_data
    from report_fixture import read_csv
    from truthput.report.export import write_csv
    from truthput.report.html import render_html
    from truthput.report.markdown import render_markdown
    from truthput.report.terminal import print_run

    s = _with_client_bound_trial(store, tmp_path)
    rid = run_id(s, "recorded-sim")
    needle = "client-bound (event-loop lag p99 42.0 ms)"
    doc_model = build_report_data(s, rid)
    doc = doc_model.to_dict()
    assert any(needle in w for w in doc["warnings"])
    assert any(needle in w for c in doc["cells"] for w in c["warnings"])
    assert needle in render_markdown(doc_model)
    assert needle in render_html(doc_model)
    rows = read_csv(next(p for p in write_csv(doc_model, tmp_path / "csv") if p.name == "warnings.csv"))
    assert any(needle in r["warning"] for r in rows)
    con = Console(record=True, width=250)
    print_run(s, rid, console=con)
    assert needle in con.export_text()


def test_audit_matrix_gives_each_cell_its_own_cause(store):
    from rich.console import Console

    from truthput.analyze.audit import audit_of, audit_rows
    from truthput.report.terminal import print_audit_matrix

    rid = run_id(store, "recorded-sim")
    con = Console(record=True, width=300)
    print_audit_matrix(audit_of(store.trial_results(rid), True), console=con)
    text = con.export_text()
    rows = audit_rows(store.trial_results(rid))
    for r in rows:
        if r.cause not in ("reference",) and r.error_pct_vs_counter is not None:
            assert f"{r.error_pct_vs_counter:+.1f}% {r.cause}" in text
    # the variant order of the throughput table, then concurrency
    keys = list(dict.fromkeys((r.variant, r.key) for r in rows))
    assert keys == [("base", 1), ("base", 4), ("spec1", 1), ("spec1", 4), ("nospec", 1), ("nospec", 4)]


def test_missing_usage_is_missing_not_zero():
    from truthserver import TruthConfig, simulate

    from array import array

    sim = simulate(TruthConfig(concurrency=2, requests=8, continuous_usage=False))
    for r in sim.records:  # a server that never sends usage
        r.completion_tokens = None
        r.chunk_tokens = array("q", [-1] * len(r.chunk_times))
    res = measure_trial(sim.records, sim.scrapes, [], sim.window, 2)
    assert res.whole_trial.usage_trial.value is None and "missing" in (res.whole_trial.usage_trial.note or "")
    row = next(r for r in res.methods if r.method == "usage whole trial")
    assert row.tokps is None and row.error_pct_vs_counter is None and row.cause == "missing data"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_load_against_the_simulator_is_labelled_simulated_everywhere(tmp_path):
    from truthput.report.data import build_report_data, compare_runs

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "truthput", "sim", "serve", "--sim-gpu", "H100 SXM",
                               "--sim-model", "llama-3.1-8b", "--port", str(port), "--noise", "0",
                               "--sim-startup-s", "0.1", "/models/llama"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        from simhelpers import wait_listening

        wait_listening(port, 30)
        db = tmp_path / "l.db"
        out = subprocess.run([sys.executable, "-m", "truthput", "load", f"http://127.0.0.1:{port}", "-c", "2",
                              "--duration", "1", "--output-tokens", "24", "--store", str(db)],
                             capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin"})
    finally:
        server.terminate()
        server.wait(10)
    assert out.returncode == 0, out.stderr
    assert "SIMULATED" in out.stdout and "simulated" in out.stdout
    store = Store(db)
    rid = store.resolve_run("latest")
    assert store.run(rid).simulated == 1
    (trial,) = store.trial_results(rid)
    assert trial.results.simulated and trial.results.server_samples.n >= 1
    doc_model = build_report_data(store, rid)
    doc = doc_model.to_dict()
    assert doc["simulated"] and all(c["tokps"]["source"] == "simulator" for c in doc["cells"] if c["status"] == "ok")
    cmp_model = compare_runs(store, rid, store, rid)
    cmp = cmp_model.to_dict()
    assert cmp["rows"] and any("SIMULATED" in n for n in cmp["notes"])


def test_the_verdict_says_each_levels_decision_first_and_keeps_diagnostics_behind_verbose(store):
    """Under 'Verdict': one decision line per level (winner / no winner ...), then the comparisons;
    the noise-model lines only with verbose (a short note says where they are)."""
    from rich.console import Console

    from truthput.report.data import run_summary
    from truthput.report.terminal import print_run

    rid = run_id(store, "recorded-sim")
    verdict = run_summary(store, rid).verdict
    levels = {cv.level for cv in verdict.per_concurrency if cv.metric == "tok/s"}
    outputs = {}
    for verbose in (False, True):
        con = Console(record=True, width=250)
        print_run(store, rid, console=con, verbose=verbose)
        outputs[verbose] = con.export_text().splitlines()
    short = outputs[False]
    after = short[short.index("Verdict") + 1:]
    decisions = after[:len(levels)]
    assert all(("winner" in ln or "beat" in ln) for ln in decisions), decisions
    # then the run's own lines (its notes: here why speculation on generated text is cautioned), then
    # the comparisons, each indented under them
    rest = after[len(levels):]
    first = next(i for i, ln in enumerate(rest) if ln.startswith("    "))
    assert "!synthetic_text" in " ".join(rest[:first]) and not any(ln.startswith("    ") for ln in rest[:first])
    assert len([ln for ln in rest if ln.startswith("    ")]) == len(verdict.comparison_lines())
    assert not any(": noise: " in ln for ln in short)
    assert any("--verbose shows them" in ln for ln in short)
    assert any(": noise: " in ln for ln in outputs[True])
