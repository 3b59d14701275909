"""Every view, the terminal's included, on a recorded `load` run and a recorded `run` whose figures
carry each kind of flag: `truthput report` (terminal, --md, --html, --json, --csv, --values),
`audit` and `runs` exit 0 and name the flag. (`report RUN` on a flagged load run once crashed in the
terminal view, which no test ran.)"""

from __future__ import annotations

import time
from array import array
from pathlib import Path

import pytest
from typer.testing import CliRunner

from truthput.cli import app
from truthput.measure.trial import measure_trial
from truthput.measure.validity import flag_window
from truthput.store.db import Store, TrialKey

from truthserver import TruthConfig, simulate

BASE = {"concurrency": 4, "requests": 48, "max_tokens": 40}


def _no_usage(sim):  # type: ignore[no-untyped-def]
    for r in sim.records:
        r.completion_tokens = None
        r.chunk_tokens = array("q", [-1] * len(r.chunk_times))


FLAGGED = {
    # flag code -> (the server's behaviour, what the client saw, what a host check found)
    "foreign_traffic": (dict(BASE, foreign_tps=300.0), None, None),
    "stale_counter": (dict(BASE, metrics_lag_scrapes=True, continuous_usage=False), _no_usage, None),
    "counter_reset": (dict(BASE, reset_at=102.0), None, None),
    "host_interference": (BASE, None, lambda res: flag_window(res, "host_interference", "a busy host (a test)")),
}


def _store(path: Path, code: str, load: bool) -> tuple[Store, str]:
    cfg, post, after = FLAGGED[code]
    db = Store(path)
    toml = "[load]\nurl = \"http://127.0.0.1:1\"\n" if load else ""
    rid = db.create_run(f"flagged-{code}", "external", False, None, toml, 0, {})
    names = ["v"] if load else ["base", "v"]
    for i, name in enumerate(names):
        db.put_variant(rid, name, i, i == 0, ["serve"], {"lines": []}, {})
    for start in range(2):
        for name in names:
            sim = simulate(TruthConfig(**dict(cfg if name == "v" else BASE, prefill_s=0.05 + 0.002 * start)))
            if post and name == "v":
                post(sim)
            res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
            if after and name == "v":
                after(res)
            db.commit_trial(rid, name, None, TrialKey(name, start, 4, 0), "ok", time.time(), 0.0, sim.window,
                            sim.window[1], res, sim.records, sim.scrapes)
    db.set_run_status(rid, "done")
    return db, rid


@pytest.mark.parametrize("load", [True, False], ids=["a load run", "a run"])
@pytest.mark.parametrize("code", sorted(FLAGGED))
def test_every_view_renders_and_names_the_flag(code, load, tmp_path):
    db, rid = _store(tmp_path / "s.db", code, load)
    store = str(db.path)
    db.close()
    runner = CliRunner()

    def ok(*args: str) -> str:
        res = runner.invoke(app, list(args))
        assert res.exit_code == 0, (args, res.output, res.exception)
        return res.output

    terminal = ok("report", rid, "--store", store)
    assert code in terminal
    ok("report", rid, "--store", store, "--md", str(tmp_path / "r.md"), "--html", str(tmp_path / "r.html"),
       "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "csv"), "--values", str(tmp_path / "v.json"))
    for written in ("r.md", "r.html", "r.json"):
        assert code in (tmp_path / written).read_text()
    assert code in ok("audit", rid, "--store", store)
    ok("runs", "--store", store)
