"""`truthput compare`: shared cells side by side; B/A ratios equal the known scaling of B's counters."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest

from report_fixture import restore_quickstart_db


@pytest.fixture(scope="module")
def db_a(tmp_path_factory):
    return restore_quickstart_db(tmp_path_factory.mktemp("cmp") / "a.db")


def _scaled_copy(src: Path, dst: Path, factor: float, drop_variant: str | None = None) -> Path:
    """B = A with every counter figure x factor (a known truth: the ratio is exactly factor)."""
    shutil.copy(src, dst)
    conn = sqlite3.connect(dst)
    for tid, text in conn.execute("SELECT id, results_json FROM trials").fetchall():
        r = json.loads(text)
        r["throughput"]["counter_window"]["value"] *= factor
        conn.execute("UPDATE trials SET results_json = ? WHERE id = ?", (json.dumps(r), tid))
    if drop_variant:
        conn.execute("DELETE FROM trials WHERE variant = ?", (drop_variant,))
    conn.commit()
    conn.close()
    return dst


def test_same_run_ratio_is_one(db_a):
    from truthput.report.data import compare_runs
    from truthput.store.db import Store

    s = Store(db_a)
    res_model = compare_runs(s, "latest", s, "latest")
    res = res_model.to_dict()
    assert len(res["rows"]) == 6
    for r in res["rows"]:
        assert r["ratio"]["value"] == pytest.approx(1.0)
        assert r["ratio"]["lo"] < 1.0 < r["ratio"]["hi"] and not r["ratio"]["significant"]
        assert r["a"]["value"] == r["b"]["value"] and r["same_argv"]
    assert "both runs are SIMULATED" in res["notes"][0]


def test_scaled_run_ratio_equals_factor(db_a, tmp_path):
    from truthput.report.data import compare_runs
    from truthput.store.db import Store

    b = _scaled_copy(db_a, tmp_path / "b.db", 1.25, drop_variant="spec1")
    res_model = compare_runs(Store(db_a), "latest", Store(b), "latest")
    res = res_model.to_dict()
    assert len(res["rows"]) == 4  # spec1's cells exist only in A
    assert sorted(map(tuple, res["only_a"])) == [("spec1", "c=1"), ("spec1", "c=8")]
    same_model = compare_runs(Store(db_a), "latest", Store(db_a), "latest")
    same = same_model.to_dict()
    width = {(r["variant"], r["concurrency"]): math.log(r["ratio"]["hi"] / r["ratio"]["lo"]) for r in same["rows"]}
    for r in res["rows"]:
        assert r["ratio"]["value"] == pytest.approx(1.25)
        assert r["b"]["value"] == pytest.approx(1.25 * r["a"]["value"])
        # scaling moves the interval, it does not widen it (fewer comparisons -> a bit narrower)
        assert math.log(r["ratio"]["hi"] / r["ratio"]["lo"]) <= width[(r["variant"], r["concurrency"])] + 1e-9
        assert r["ratio"]["lo"] < 1.25 < r["ratio"]["hi"]
    # the 4 shared cells are decided together (Hochberg): each interval at its step's level
    assert all("of 4 at family-wise 0.95" in r["ratio"]["correction"] for r in res["rows"])


def test_compare_cli(db_a, tmp_path):
    from typer.testing import CliRunner

    from truthput.cli import app

    b = _scaled_copy(db_a, tmp_path / "b.db", 0.8)
    runner = CliRunner()
    res = runner.invoke(app, ["compare", "latest", "latest", "--store", str(db_a), "--store-b", str(b)])
    assert res.exit_code == 0, res.output
    assert "-20.0%" in res.output and "SIMULATED" in res.output
    res = runner.invoke(app, ["compare", "latest", "latest", "--store", str(db_a), "--store-b", str(b), "--json"])
    data = json.loads(res.output)
    assert all(r["ratio"]["value"] == pytest.approx(0.8) for r in data["rows"])
    res = runner.invoke(app, ["compare", "latest", "latest", "--store", str(tmp_path / "none.db")])
    assert res.exit_code != 0


def test_fail_if_slower_gates_on_a_decided_slowdown_beyond_the_threshold(db_a, tmp_path):
    """B = A x 0.8 (20% slower in every cell, known truth): --fail-if-slower 3% exits 1 naming the
    cells; 25% does not (the slowdown is not beyond it); B = A does not."""
    from typer.testing import CliRunner

    from truthput.cli import app

    b = _scaled_copy(db_a, tmp_path / "b.db", 0.8)
    runner = CliRunner()
    args = ["compare", "latest", "latest", "--store", str(db_a), "--store-b", str(b)]
    res = runner.invoke(app, [*args, "--fail-if-slower", "3%"])
    assert res.exit_code == 1 and "B is slower than A by more than 3% in: " in res.output
    assert "nospec c=1" in res.output
    assert runner.invoke(app, [*args, "--fail-if-slower", "25%"]).exit_code == 0
    same = ["compare", "latest", "latest", "--store", str(db_a), "--fail-if-slower", "3"]
    assert runner.invoke(app, same).exit_code == 0
    bad = runner.invoke(app, [*args, "--fail-if-slower", "lots"])
    assert bad.exit_code != 0 and "--fail-if-slower 'lots'" in str(bad.exception)
