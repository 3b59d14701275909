"""`truthput decide` on a run's exported per-start values gives the run's verdict: the same function
decides both (`truthput.analyze.values.decide`), and a user can recompute it from a file."""

from __future__ import annotations

import json
import subprocess
import sys

from report_fixture import restore_quickstart_db

from truthput.report.data import run_summary
from truthput.store.db import Store


def _decisions(lines: list[str]) -> list[str]:
    """A verdict's comparison lines without what the values cannot carry (the output guard, flags)."""
    return [ln.removeprefix("simulated: ").split("; output guard:")[0].split("; flagged")[0] for ln in lines
            if " vs " in ln or " is " in ln and " than " in ln or "equivalent" in ln]


def test_decide_on_the_exported_values_reproduces_the_runs_verdict(tmp_path):
    db = restore_quickstart_db(tmp_path / "q.db")
    store = Store(db, read_only=True)
    rid = store.resolve_run("latest")
    verdict = run_summary(store, rid).verdict
    run_lines = verdict.lines()
    decisions = [line for cv in verdict.per_concurrency for line in cv.decision]
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
        # the decision of each level too (winner / no winner), not only the comparisons under it
        # (a CSV does not say the run was simulated, so its lines carry no "simulated: ")
        printed = [ln.removeprefix("simulated: ") for ln in got.stdout.splitlines()]
        assert decisions and all(d.removeprefix("simulated: ") in printed for d in decisions), (decisions, printed)
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


def test_a_decision_once_reached_is_kept_and_its_share_of_alpha_passes_to_the_open_ones():
    """Two levels. At look 3 the change at c=1 is decided (x2, tight starts) and c=8 is not; a 4th
    start at c=1 far off the others would undo the c=1 decision if every look re-decided the
    whole family from scratch. It stays decided as it was at look 3 (its interval then), and c=8
    is tested from then on at the whole alpha (Hochberg over what is still open), not half of it."""
    from truthput.analyze.values import StartValues, decide
    from truthput.experiment.file import MeasureSection

    def starts(variant, level, values):
        return [StartValues("tok/s", variant, level, r, (v,)) for r, v in enumerate(values)]

    base1, fast1 = [100.0, 101.0, 99.0, 100.5], [200.0, 202.0, 198.0, 60.0]  # 4th start: an outlier
    base8, var8 = [400.0, 430.0, 370.0, 410.0], [460.0, 500.0, 430.0, 470.0]
    values = starts("a", 1, base1) + starts("b", 1, fast1) + starts("a", 8, base8) + starts("b", 8, var8)
    measure = MeasureSection(starts=3, max_starts=6)
    at3 = decide([v for v in values if v.round < 3], "a", measure, look=3)
    at4 = decide(values, "a", measure, look=4)
    c1_at3 = [c for lv in at3.per_concurrency if lv.level == 1 for c in lv.comparisons][0]
    c1_at4 = [c for lv in at4.per_concurrency if lv.level == 1 for c in lv.comparisons][0]
    assert c1_at3.outcome == "faster"
    assert c1_at4.outcome == "faster" and c1_at4.estimate.ratio == c1_at3.estimate.ratio  # kept as reached
    # re-deciding look 4 from scratch (one look, the same boundary) would not decide c=1: the premise
    from truthput.analyze.stopping import StoppingRule
    from truthput.analyze.values import grouped
    from truthput.analyze.verdict import _estimates

    rule = StoppingRule(max_starts=6, min_starts=3)
    raw = _estimates({"tok/s": grouped(values)["tok/s"]}, "a", {})[0]
    _reason, fresh, _a = rule.decide_estimates(raw, 4)
    assert [d.kind for k, d in fresh.items() if k.level == 1] == ["not decided"]
    # c=8 is tested at look 4 over a family of one (what is still open)
    c8 = [c for lv in at4.per_concurrency if lv.level == 8 for c in lv.comparisons][0]
    assert "1 decided earlier" in c8.estimate.correction


def _decide(tmp_path, rows: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "v.csv").write_text("\n".join(["metric,variant,concurrency,rate,round,trial,value", *rows]) + "\n")
    return subprocess.run([sys.executable, "-m", "truthput", "decide", str(tmp_path / "v.csv"), "--baseline", "base",
                           *args], capture_output=True, text=True, timeout=120)


TWO_ROUNDS = ["tok/s,base,4,,0,0,300", "tok/s,new,4,,0,0,600", "tok/s,base,4,,1,0,302", "tok/s,new,4,,1,0,606"]


def test_decide_refuses_what_no_run_produces(tmp_path):
    assert _decide(tmp_path, TWO_ROUNDS).returncode == 0
    # the same start twice would count as a third start (and decide at "2" starts what needs 3)
    dup = _decide(tmp_path, [*TWO_ROUNDS, "tok/s,new,4,,1,0,606"], "--look", "2")
    assert dup.returncode == 2 and "appears twice" in dup.stderr and dup.stdout == "", dup.stderr
    # a round missing: rounds 0 and 2 but not 1
    gap = _decide(tmp_path, [r.replace(",1,0,", ",2,0,") for r in TWO_ROUNDS])
    assert gap.returncode == 2 and "not 1" in gap.stderr and dup.stdout == "", gap.stderr
    # a look beyond the starts present
    far = _decide(tmp_path, TWO_ROUNDS, "--look", "3")
    assert far.returncode == 2 and "--look 3" in far.stderr and "2 start(s)" in far.stderr, far.stderr
    assert _decide(tmp_path, TWO_ROUNDS, "--look", "0").returncode == 2


def test_decide_refuses_a_json_start_given_twice(tmp_path):
    import json as _json

    doc = {"schema": "truthput-values/1", "baseline": "base", "starts": [
        {"metric": "tok/s", "variant": v, "concurrency": 4, "rate": None, "round": r, "values": [x]}
        for v, r, x in [("base", 0, 300.0), ("new", 0, 600.0), ("base", 1, 301.0), ("new", 1, 601.0),
                        ("new", 1, 601.0)]]}
    (tmp_path / "v.json").write_text(_json.dumps(doc))
    got = subprocess.run([sys.executable, "-m", "truthput", "decide", str(tmp_path / "v.json")], capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 2 and "round 1 twice" in got.stderr and got.stdout == "", got.stderr
