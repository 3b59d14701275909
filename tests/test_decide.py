"""`truthput decide` on a run's exported per-start values gives the run's verdict: the same function
decides both (`truthput.analyze.values.decide`), and a user can recompute it from a file."""

from __future__ import annotations

import json
import subprocess
import sys

from report_fixture import restore_quickstart_db

from truthput.report.runsummary import run_summary
from truthput.store.db import Store


def _decisions(lines: list[str]) -> list[str]:
    """A verdict's comparison lines without what the values cannot carry (the output guard, flags)."""
    return [ln.removeprefix("simulated: ").split("; output guard:")[0].split("; flagged")[0] for ln in lines
            if " vs " in ln or " is " in ln and " than " in ln or "equivalent" in ln]


def test_decide_on_the_exported_values_reproduces_the_runs_verdict(tmp_path):
    db = restore_quickstart_db(tmp_path / "q.db")
    store = Store(db, read_only=True)
    rid = store.resolve_run("latest")
    run_lines = run_summary(store, rid).verdict.lines()
    for name in ("v.json", "v.csv"):
        out = tmp_path / name
        made = subprocess.run([sys.executable, "-m", "truthput", "report", "latest", "--store", str(db),
                               "--values", str(out)], capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr[-1500:]
        extra = []
        if name.endswith(".csv"):  # a CSV carries no design: the run's experiment file gives it
            (tmp_path / "exp.toml").write_text(store.run(rid).experiment_toml)
            extra = ["--experiment", str(tmp_path / "exp.toml")]
        got = subprocess.run([sys.executable, "-m", "truthput", "decide", str(out), *extra], capture_output=True,
                             text=True, timeout=120)
        assert got.returncode == 0, got.stderr[-1500:]
        want = _decisions(run_lines)
        assert want and _decisions(got.stdout.splitlines()) == want, (got.stdout, run_lines)
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["schema"] == "truthput-values/1" and all(len(s["values"]) >= 1 for s in doc["starts"])
    assert {s["round"] for s in doc["starts"]} >= {0, 1}


def test_the_worked_example_in_docs_statistics_is_what_decide_prints(tmp_path):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "statistics.md").read_text()
    rows = ["metric,variant,concurrency,rate,round,trial,value"]
    for r, (b, n) in enumerate([(300.2, 331.0), (296.1, 322.5), (304.0, 327.9)]):
        rows += [f"tok/s,base,4,,{r},0,{b}", f"tok/s,new,4,,{r},0,{n}"]
    (tmp_path / "v.csv").write_text("\n".join(rows) + "\n")
    got = subprocess.run([sys.executable, "-m", "truthput", "decide", str(tmp_path / "v.csv"), "--baseline", "base"],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    first = got.stdout.splitlines()[0]
    assert first in doc, first
