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
from truthput.load.rows import RowUse
from truthput.measure.model import Figure
from truthput.measure.validity import check_rows, flag_window
from truthput.store.db import Store, TrialKey

from truthserver import TruthConfig, simulate

BASE = {"concurrency": 4, "requests": 48, "max_tokens": 40}


def _no_usage(sim):  # type: ignore[no-untyped-def]
    for r in sim.records:
        r.completion_tokens = None
        r.chunk_tokens = array("q", [-1] * len(r.chunk_times))


def _resent(res, name):  # type: ignore[no-untyped-def]
    """The file ran out: the variant's trial re-sent 12 rows to its server."""
    if name == "v":
        check_rows(res, RowUse(source="rows.jsonl", rows=10, first=10, last=21, sent=12, repeats=12))


def _cache_states(res, name):  # type: ignore[no-untyped-def]
    """The arms' windows at different prefix-cache hit rates (the server's counters, as a test sets them)."""
    res.server_samples.prefix_cache_hit_rate = Figure(value=0.9 if name == "v" else 0.1, unit="fraction",
                                                      source="server_counter", window="window")


FLAGGED = {
    # flag code -> (the server's behaviour, what the client saw, what a check found (trial, arm))
    "foreign_traffic": (dict(BASE, foreign_tps=300.0), None, None),
    "stale_counter": (dict(BASE, metrics_lag_scrapes=True, continuous_usage=False), _no_usage, None),
    "counter_reset": (dict(BASE, reset_at=102.0), None, None),
    "host_interference": (BASE, None, lambda res, name: name == "v" and flag_window(res, "host_interference",
                                                                                     "a busy host (a test)")),
    "workload_repeats": (BASE, None, _resent),
    "cache_state_differs": (BASE, None, _cache_states),
}
COMPARISON_ONLY = {"cache_state_differs"}
"""Said of a comparison (a run's verdict), not of a figure: a load run compares nothing."""


def _store(path: Path, code: str, load: bool) -> tuple[Store, str]:
    cfg, post, after = FLAGGED[code]
    db = Store(path)
    toml = "[load]\nurl = \"http://127.0.0.1:1\"\n" if load else ""
    # a run named without the flag's code: each view must say it (the name once did it for them)
    rid = db.create_run("flagged", "external", False, None, toml, 0, {})
    names = ["v"] if load else ["base", "v"]
    for i, name in enumerate(names):
        db.put_variant(rid, name, i, i == 0, ["serve"], {"lines": []}, {})
    for start in range(2):
        for name in names:
            sim = simulate(TruthConfig(**dict(cfg if name == "v" else BASE, prefill_s=0.05 + 0.002 * start)))
            if post and name == "v":
                post(sim)
            res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
            if after:
                after(res, name)
            db.commit_trial(rid, name, None, TrialKey(name, start, 4, 0), "ok", time.time(), 0.0, sim.window,
                            sim.window[1], res, sim.records, sim.scrapes)
    db.set_run_status(rid, "done")
    return db, rid


@pytest.mark.parametrize("load", [True, False], ids=["a load run", "a run"])
@pytest.mark.parametrize("code", sorted(FLAGGED))
def test_every_view_renders_and_names_the_flag(code, load, tmp_path):
    if load and code in COMPARISON_ONLY:
        pytest.skip("a load run compares nothing")
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
    audit = ok("audit", rid, "--store", store)
    # the audit names every flag on a figure; a comparison's caution is the verdict's, beside the cells' hit rates
    assert ("prefix-cache hits 90%" in audit) if code in COMPARISON_ONLY else (code in audit), audit[-800:]
    ok("runs", "--store", store)


def _labelled_store(path: Path, engine: str) -> tuple[str, str]:
    """A two-variant run whose every headline is `engine`'s: "vllm" (the counter) or "llamacpp"
    (a counter that moves per finished request: usage placed in time is every cell's figure)."""
    db = Store(path)
    rid = db.create_run(f"labels-{engine}", "external", False, None, "", 0, {})
    for i, name in enumerate(("base", "v")):
        db.put_variant(rid, name, i, i == 0, ["serve"], {"lines": []}, {})
    from truthput.measure.names import metric_names

    from dataclasses import replace

    names = metric_names("vllm")
    if engine == "llamacpp":  # the same scrapes, read as a counter that moves per finished request
        names = replace(names, counter_moves="per_request")
    for start in range(2):
        for name in ("base", "v"):
            sim = simulate(TruthConfig(**dict(BASE, prefill_s=0.05 + 0.002 * start)))
            res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4, names=names)
            db.commit_trial(rid, name, None, TrialKey(name, start, 4, 0), "ok", time.time(), 0.0, sim.window,
                            sim.window[1], res, sim.records, sim.scrapes)
    db.set_run_status(rid, "done")
    db.close()
    return str(path), rid


def test_headers_footnotes_and_the_audit_title_name_the_figures_own_source(tmp_path):
    """No view says "server counter" for a column of usage figures (llama.cpp), and the counter's
    own column still says it."""
    runner = CliRunner()
    for engine, label, other in (("llamacpp", "usage placed in time", "server counter"),
                                 ("vllm", "server counter", "usage placed in time")):
        store, rid = _labelled_store(tmp_path / f"{engine}.db", engine)
        from truthput.report.data import run_summary

        assert {c.source for c in run_summary(Store(store, read_only=True), rid).cells} == \
            {"usage" if engine == "llamacpp" else "server_counter"}
        res = runner.invoke(app, ["report", rid, "--store", store, "--md", str(tmp_path / f"{engine}.md"),
                                  "--html", str(tmp_path / f"{engine}.html")], env={"COLUMNS": "200"})
        assert res.exit_code == 0, res.output
        terminal = runner.invoke(app, ["report", rid, "--store", store], env={"COLUMNS": "200"}).output
        assert f"[{label}]" in terminal and f"[{other}]" not in terminal.split("tok/s per stream")[0]
        # the footnote defines the column's figure: truthput's own tokens, or the counter's rise
        assert ("Output tok/s = truthput's own tokens" in terminal) == (engine == "llamacpp"), terminal[-600:]
        assert ("Output tok/s = the rise of the server's emitted-token counter" in terminal) == (engine == "vllm")
        md = (tmp_path / f"{engine}.md").read_text()
        assert f"### Throughput (output tok/s: {label})" in md
        html = (tmp_path / f"{engine}.html").read_text()
        assert f"Output tok/s ({label})" in html
        audit = runner.invoke(app, ["audit", rid, "--store", store], env={"COLUMNS": "200"}).output
        want = "the server counter" if engine == "vllm" else "usage placed in time"
        assert f"every counting method vs {want}" in audit, audit[:400]
        assert f"Audit: other ways of counting vs {want}" in md
