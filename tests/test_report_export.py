"""Exports round-trip: the JSON loads back to the same numbers as the store; CSVs carry the same
figures with their provenance columns; write_reports and `truthput report` write what they say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from report_fixture import restore_quickstart_db


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from truthput.store.db import Store

    return Store(restore_quickstart_db(tmp_path_factory.mktemp("export") / "q.db"))


@pytest.fixture(scope="module")
def doc(store):
    from truthput.report.data import build_report_data

    return build_report_data(store, "latest")


def test_json_round_trip_equals_store(store, doc, tmp_path):
    from truthput.report.data import run_summary
    from truthput.report.document import ReportDocument
    from truthput.report.export import write_json

    path = write_json(doc, tmp_path / "r.json")
    assert ReportDocument.from_json(json.loads(path.read_text())).to_dict() == doc.to_dict()
    back = json.loads(path.read_text())
    rid = store.resolve_run("latest")
    # cells: same numbers as the terminal table computes from the store
    summary = run_summary(store, rid)
    rows = {c.key: c for c in summary.cells}
    for c in back["cells"]:
        r = rows[(c["variant"], c["concurrency"])]
        assert c["tokps"]["value"] == r.estimate.mean
        assert (c["tokps"]["lo"], c["tokps"]["hi"]) == (r.estimate.lo, r.estimate.hi)
        comp = summary.comparison(r.variant, r.level)
        if comp is not None:
            assert c["delta_pct"]["value"] == comp.estimate.pct
    # raw trials: every trial's counter figure, exactly as stored
    stored = {t.id: t.results.throughput.counter_window.value for t in store.trial_results(rid)}
    assert {t["trial_id"]: t["counter_tokps"]["value"] for t in back["trials"]} == stored
    assert len(back["trials"]) == 12


def test_csv_round_trip(doc, tmp_path):
    from report_fixture import read_csv
    from truthput.report.export import write_csv

    paths = write_csv(doc, tmp_path / "csv")
    doc = doc.to_dict()
    names = {p.stem for p in paths}
    assert {"cells", "audit", "roofline", "spec_decode", "trials", "latency_requests", "failures",
            "telemetry", "goodput", "variants", "claims"} <= names
    cells = read_csv(tmp_path / "csv" / "cells.csv")
    for row, c in zip(cells, doc["cells"]):
        assert float(row["tokps"]) == c["tokps"]["value"]
        assert float(row["tokps_lo"]) == c["tokps"]["lo"]
        assert row["tokps_source"] == "simulator" and row["tokps_read_via"] == "server_counter"
        assert row["tokps_unit"] == "tok/s"
    roof = read_csv(tmp_path / "csv" / "roofline.csv")
    assert len(roof) == 6
    for row, r in zip(roof, doc["roofline"]["cells"]):
        assert float(row["pct_of_tightest"]) == pytest.approx(r["pct_of_tightest"]["value"])
        assert row["pct_of_tightest_source"] == "model"
    reqs = read_csv(tmp_path / "csv" / "latency_requests.csv")
    assert len(reqs) == sum(len(c["ttft_ms"]) + len(c["itl_ms"]) for c in doc["latency"])


def test_write_reports_and_cli(store, tmp_path):
    from typer.testing import CliRunner

    from truthput.cli import app
    from truthput.report.data import build_report_data
    from truthput.report.files import ReportTargets, write_reports

    rid = store.resolve_run("latest")
    paths = write_reports(build_report_data(store, rid), ReportTargets.run_folder(tmp_path / "rep", rid))
    assert [p.suffix for p in paths] == [".html", ".md"]
    assert all(p.stat().st_size > 1000 for p in paths)
    runner = CliRunner()
    res = runner.invoke(app, ["report", "latest", "--store", store.path, "--json", str(tmp_path / "o.json"),
                              "--md", str(tmp_path / "o.md"), "--csv", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "o.json").read_text())["schema"] == "truthput-report/1"
    assert "c=1: nospec is 54% slower than original" in (tmp_path / "o.md").read_text()
    assert (tmp_path / "o" / "cells.csv").exists()
    # no output option: the terminal summary, nothing written
    before = set(tmp_path.iterdir())
    res = runner.invoke(app, ["report", "latest", "--store", store.path])
    assert res.exit_code == 0 and "SIMULATED" in res.output and "Verdict" in res.output
    assert set(tmp_path.iterdir()) == before


def test_runs_lists_the_stores_runs(store):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "truthput", "runs", "--store", store.path, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (run,) = json.loads(out.stdout)
    row = store.run(store.resolve_run("latest"))
    assert (run["id"], run["name"], run["status"], run["engine"]) == (row.id, row.name, row.status, row.engine)
    assert run["variants"] == ["original", "spec1", "nospec"] and run["simulated"] is True
    # the decision of the quickstart's (older) stored summary: its first line
    assert run["verdict"] == row.summary["verdict_lines"][0]
    table = subprocess.run([sys.executable, "-m", "truthput", "runs", "--store", store.path], capture_output=True,
                           text=True, timeout=60, env={**__import__("os").environ, "COLUMNS": "250"})
    assert table.returncode == 0 and row.id in table.stdout
