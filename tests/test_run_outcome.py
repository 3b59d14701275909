"""`run_and_report`, the library entry point `truthput run` is a shell around: how a run ended, its
files, and its summary computed once per look of the stopping rule (once, without one), then handed
to every view instead of being recomputed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from truthput.experiment.file import parse_experiment
from truthput.store.db import Store

from test_run_e2e import experiment_text

TWO = """
[[variant]]
name = "base"
[[variant]]
name = "spec1"
set = { "--spec-tokens" = 1 }
"""


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import truthput.analyze.summary as stored

    calls: list[int] = []
    real = stored.summarize

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(stored, "summarize", counted)
    return calls


def _run_and_report(text: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    from truthput.report.files import RunFiles
    from truthput.run.outcome import run_and_report

    db = tmp_path / "r.db"
    store = Store(db)
    out = asyncio.run(run_and_report(parse_experiment(text, "e.toml"), text, "e.toml", store, db,
                                     progress=lambda m: None, write_files=RunFiles(tmp_path / "reports")))
    return store, out


def test_a_run_computes_its_summary_once_and_its_files_use_it(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    store, out = _run_and_report(experiment_text(TWO, concurrency=(1,), duration=0.6), tmp_path)
    assert len(calls) == 1  # the run's end; the report, its roofline and the units were handed it
    assert out.status == "done" and out.exit_status == 0 and out.problem() is None
    assert out.measured == ["base", "spec1"] and out.never_measured == [] and out.failed == {}
    assert sorted(p.suffix for p in out.files) == [".html", ".md"]
    assert all(p.exists() and p.stat().st_size > 1000 for p in out.files)
    # the summary handed over is the one stored with the run's status, typed: read back equal
    from truthput.analyze.summary import SUMMARY_SCHEMA
    from truthput.analyze.summary import StoredSummary, summary_of
    from truthput.report.data import run_summary
    from truthput.store.summary import summary_inputs

    record = StoredSummary.from_json(store.run(out.run_id).summary_json)
    assert record is not None and record.schema == SUMMARY_SCHEMA
    assert record.to_json() == out.summary.stored().to_json()  # (NaN estimates: equal as text, not as floats)
    # a view reads it back (decides nothing again) ...
    viewed = run_summary(store, out.run_id)
    assert len(calls) == 1 and viewed.verdict.lines() == out.summary.verdict.lines() and "stored" in viewed.origin
    assert viewed.stored().to_json() == record.to_json()
    assert [c.per_start for c in viewed.cells] == [c.per_start for c in out.summary.cells]
    # ... and it is what the stored trials decide
    assert summary_of(summary_inputs(store, out.run_id), fresh=True).verdict.lines() == out.summary.verdict.lines()


def test_with_the_stopping_rule_each_look_computes_it_once_and_the_last_is_the_runs(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    text = experiment_text(TWO, concurrency=(1,), duration=0.5, starts=2, sequential=True)
    text = text.replace("[measure]\n", "[measure]\nmax_starts = 3\n")
    store, out = _run_and_report(text, tmp_path)
    looks = len(store.starts(out.run_id)) // 2 - 1  # a look after 2 starts per variant, then one per round
    assert len(calls) == looks >= 1

