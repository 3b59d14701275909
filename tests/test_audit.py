"""The audit over a results store filled with measured known-truth trials."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from truthput.analyze.audit import audit_rows
from truthput.cli import app
from truthput.measure.trial import measure_trial
from truthput.store.db import Store, TrialKey

from truthserver import TruthConfig, simulate

VARIANTS = {
    "nospec": (TruthConfig, {}, None),
    "spec1": (TruthConfig, {"spec_k": 1, "accept_pattern": (1, 1, 0, 1)}, {"method": "mtp", "num_speculative_tokens": 1}),
}


def fill_store(path: Path, simulated: bool = False) -> tuple[str, dict]:
    db = Store(path)
    run_id = db.create_run("audit-test", "sim" if simulated else "external", simulated, None, "", 0, {})
    truth: dict = {}
    for variant, (cls, extra, spec) in VARIANTS.items():
        for conc in (1, 4):
            for trial in range(2):
                cfg = cls(concurrency=conc, requests=conc * 6, prefill_s=0.05 + 0.01 * trial, **extra)
                sim = simulate(cfg)
                res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, conc, speculative=spec)
                ws, we = sim.window
                truth.setdefault((variant, conc), []).append(sim.ledger.between(ws, we) / (we - ws))
                db.commit_trial(run_id, variant, None, TrialKey(variant, 0, conc, trial), "ok", time.time(), 0.0,
                                sim.window, we, res, sim.records, sim.scrapes)
    db.set_run_status(run_id, "done")
    db.close()
    return run_id, truth


def test_audit_rows_pool_trials_against_truth(tmp_path):
    run_id, truth = fill_store(tmp_path / "t.db")
    db = Store(tmp_path / "t.db")
    rows = audit_rows(db.trial_results(run_id))
    db.close()
    by = {(r.variant, r.key, r.method): r.model_dump(mode="json") for r in rows}
    for (variant, conc), tps in truth.items():
        ref = by[(variant, conc, "counter (window)")]
        assert ref["cause"] == "reference" and ref["n_trials"] == 2
        assert ref["tokps"] == pytest.approx(sum(tps) / len(tps))
        words = by[(variant, conc, "whitespace words (window)")]
        assert words["cause"] == "unit" and words["error_pct_vs_counter"] == pytest.approx(-25, abs=3)
        assert by[(variant, conc, "usage placed in time (window)")]["cause"] == "agrees"
    assert ("spec1", 4, "drafted + accepted (counters)") in by
    assert ("nospec", 4, "drafted + accepted (counters)") not in by
    assert all(r.simulated is False for r in rows)


def test_audit_command_table_json_and_simulated_marking(tmp_path):
    db_path = tmp_path / "sim.db"
    run_id, _ = fill_store(db_path, simulated=True)
    runner = CliRunner()
    out = runner.invoke(app, ["audit", "latest", "--store", str(db_path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "SIMULATED" in out.output and "simulated" in out.output
    assert "whitespace words (window)" in out.output and "unit" in out.output
    assert "identity held in 2/2 trial(s)" in out.output
    js = runner.invoke(app, ["audit", run_id[:12], "--store", str(db_path), "--json"])
    data = json.loads(js.output)
    rows = data["methods"]
    assert data["simulated"] and rows and all(r["simulated"] and r["source"] == "simulator" for r in rows)
    assert all(c["identity_held"] == 2 and not c["spec_checks_failed"] for c in data["integrity"])


def test_audit_errors_are_one_line(tmp_path):
    db_path = tmp_path / "empty.db"
    Store(db_path).close()
    out = CliRunner().invoke(app, ["audit", "latest", "--store", str(db_path)])
    assert out.exit_code != 0 and "no runs" in str(out.exception)
    out = CliRunner().invoke(app, ["audit", "latest", "--store", str(tmp_path / "missing.db")])
    assert out.exit_code != 0 and "no results store" in str(out.exception)


def test_the_audit_and_the_cells_show_one_hit_rate_per_cell(tmp_path):
    """Three trials whose windows hit 5%, 10% and 90%: the cell table and the audit's identity line
    said 10% and 35% of the same cell (a median in one, a mean in the other); one figure now."""
    from truthput.analyze.audit import integrity_rows
    from truthput.analyze.cells import build_cells
    from truthput.measure.model import Figure

    run_id, _truth = fill_store(tmp_path / "t.db")
    db = Store(tmp_path / "t.db")
    sim = simulate(TruthConfig(concurrency=4, requests=24))
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
    db.commit_trial(run_id, "nospec", None, TrialKey("nospec", 0, 4, 2), "ok", time.time(), 0.0, sim.window,
                    sim.window[1], res, sim.records, sim.scrapes)
    trials = [t for t in db.trial_results(run_id) if t.variant == "nospec" and t.level == 4]
    db.close()
    assert len(trials) == 3
    for t, hit in zip(trials, (0.05, 0.10, 0.90)):
        t.results.server_samples.prefix_cache_hit_rate = Figure(value=hit, unit="fraction", source="server_counter")
    (row,) = integrity_rows(trials)
    (cell,) = build_cells(trials)
    assert row.prefix_cache_hit_rate == cell.prefix_cache_hit_rate()[0] == pytest.approx(0.10)
