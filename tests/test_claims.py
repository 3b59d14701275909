"""Claims against physics and against known-truth runs: the seed's figures get the right verdicts."""

from __future__ import annotations

from dataclasses import dataclass

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from truthput.analyze.claims import check_claims
from truthput.cli import app
from truthput.errors import InputError
from truthput.measure.model import TrialResults
from truthput.measure.trial import measure_trial
from truthput.experiment.claims import Claim, load_claims_file, parse_claims

from truthserver import TruthConfig, simulate

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-claims.toml"


def verdicts(results):
    return {r.text: r for r in results}


def test_seed_claims_physics_only():
    claims, bounds = load_claims_file(str(SEED))
    res = verdicts(check_claims(claims, None, bounds))
    assert res["+107% single-stream with spec-tokens 1 over no-spec"].verdict == "impossible"
    assert "+100%" in res["+107% single-stream with spec-tokens 1 over no-spec"].reason
    wall = res["340 tok/s is the physical bandwidth wall for 18.6 GB / 1.87 TB/s"]
    assert wall.verdict == "contradicted" and wall.bound["ceiling_tps_no_spec"] == pytest.approx(1870 / 18.6 * 8)
    over = next(r for t, r in res.items() if t.startswith("the logger over-counts"))
    assert over.verdict == "contradicted" and "k = 1" in over.reason
    words = res["75.9 tok/s at 1 stream (word probe), spec-tokens 1"]
    assert words.verdict == "untestable" and words.likely_cause == "unit"
    counter = res["339.9 tok/s real generation at 8 streams (counter delta), spec-tokens 1"]
    assert counter.verdict == "plausible" and counter.bound["ceiling_tps"] == pytest.approx(805 * 2)


@dataclass
class Measured:
    """A trial as analysis sees it (the fields of a stored trial it reads)."""

    variant: str
    concurrency: int
    results: TrialResults
    status: str = "ok"
    start_index: int = 0
    trial_index: int = 0
    error: str | None = None


def _measure(variant: str, spec_k: int | None, conc: int) -> Measured:
    cfg = TruthConfig(concurrency=conc, requests=conc * 8, max_tokens=40, prefill_s=0.2, step_s=0.01,
                      tokens_per_chunk=(1,), spec_k=spec_k, accept_pattern=(1, 1, 0, 1), log_interval_s=0.25)
    sim = simulate(cfg)
    spec = {"method": "mtp", "num_speculative_tokens": spec_k} if spec_k else None
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, conc, speculative=spec)
    return Measured(variant, conc, res)


@pytest.fixture(scope="module")
def run():
    return [_measure("nospec", None, 1), _measure("spec1", 1, 1), _measure("spec1", 1, 4), _measure("spec3", 3, 4)]


def _fig(run, variant, conc, method):
    item = next(i for i in run if i.variant == variant and i.concurrency == conc)
    return next(r.tokps for r in item.results.methods if r.method == method)


def test_claims_against_a_run(run):
    counter1 = _fig(run, "spec1", 1, "counter (window)")
    base1 = _fig(run, "nospec", 1, "counter (window)")
    probe1 = _fig(run, "spec1", 1, "word probe per request")
    gain = (counter1 / base1 - 1) * 100
    claims = parse_claims([
        {"text": "counter ok", "figure": {"value": round(counter1 * 1.01, 1)}, "method": "counter",
         "conditions": {"concurrency": 1, "spec_tokens": 1}},
        {"text": "word probe", "figure": {"value": round(probe1, 1)}, "method": "words",
         "conditions": {"concurrency": 1, "spec_tokens": 1}},
        {"text": "unknown method", "figure": {"value": round(probe1, 1)}, "method": "unknown",
         "conditions": {"concurrency": 1, "spec_tokens": 1}},
        {"text": "true gain", "figure": {"value": round(gain, 1), "unit": "%"}, "method": "counter",
         "conditions": {"kind": "speedup", "concurrency": 1, "spec_tokens": 1, "baseline_spec_tokens": 0}},
        {"text": "inflated gain", "figure": {"value": round(gain + 30, 1), "unit": "%"},
         "conditions": {"kind": "speedup", "concurrency": 1, "spec_tokens": 1, "baseline_spec_tokens": 0}},
        {"text": "107", "figure": {"value": 107, "unit": "%"},
         "conditions": {"kind": "speedup", "concurrency": 1, "spec_tokens": 1, "baseline_spec_tokens": 0}},
        {"text": "wall below measurement", "figure": {"value": round(counter1 * 0.8, 1)}, "method": "counter",
         "conditions": {"kind": "ceiling", "concurrency": 1, "spec_tokens": 1}},
        {"text": "logger overcounts", "figure": {"value": 100.0}, "method": "log_line",
         "conditions": {"kind": "log_overcount", "concurrency": 4, "spec_tokens": 1}},
        {"text": "logger overcounts k3", "figure": {"value": 100.0}, "method": "log_line",
         "conditions": {"kind": "log_overcount", "concurrency": 4, "spec_tokens": 3}},
        {"text": "no such cell", "figure": {"value": 10.0}, "method": "counter", "conditions": {"concurrency": 64}},
    ])
    res = verdicts(check_claims(claims, run, {}))
    assert res["counter ok"].verdict == "plausible"
    wp = res["word probe"]
    assert wp.verdict == "contradicted" and wp.likely_cause == "unit"
    assert wp.measured["counter_tps"] == pytest.approx(counter1)
    assert "word probe per request" in wp.reason  # it reproduces the seed's method
    assert res["unknown method"].likely_cause == "word probe per request"
    assert 0 < gain < 100  # k = 1, 3 of 4 drafts accepted; the long prefill dilutes the gain
    assert res["true gain"].verdict == "plausible"
    assert res["true gain"].measured["gain_pct"] == pytest.approx(gain)
    assert res["inflated gain"].verdict == "contradicted"
    assert res["107"].verdict == "impossible"
    assert res["wall below measurement"].verdict == "contradicted"
    lo = res["logger overcounts"]
    assert lo.verdict == "contradicted" and lo.likely_cause == "definition" and "identity" in lo.reason
    assert lo.measured["drafted_plus_accepted_tps"] is not None
    lo3 = res["logger overcounts k3"]
    assert lo3.verdict == "contradicted"
    assert abs(lo3.measured["error_pct"]) < 10 < abs(lo3.measured["error_pct_vs_drafted_plus_accepted"])
    assert res["no such cell"].verdict == "untestable"


def test_a_simulated_run_never_contradicts_a_measurement(run):
    """The same claims against the same figures, labelled simulated: what the run alone would
    contradict becomes untestable with the model's prediction as the reason; physics still speaks;
    a claim by a named method is set beside that method's figures only."""
    counter1 = _fig(run, "spec1", 1, "counter (window)")
    probe1 = _fig(run, "spec1", 1, "word probe per request")
    claims = parse_claims([
        {"text": "word probe", "figure": {"value": round(probe1, 1)}, "method": "words",
         "conditions": {"concurrency": 1, "spec_tokens": 1}},
        {"text": "counter off", "figure": {"value": round(counter1 * 0.5, 1)}, "method": "counter",
         "conditions": {"concurrency": 1, "spec_tokens": 1}},
        {"text": "107", "figure": {"value": 107, "unit": "%"},
         "conditions": {"kind": "speedup", "concurrency": 1, "spec_tokens": 1, "baseline_spec_tokens": 0}},
        {"text": "wall below measurement", "figure": {"value": round(counter1 * 0.8, 1)}, "method": "counter",
         "conditions": {"kind": "ceiling", "concurrency": 1, "spec_tokens": 1}},
    ])
    res = verdicts(check_claims(claims, run, {}, simulated=True))
    for name in ("word probe", "counter off", "wall below measurement"):
        r = res[name]
        assert r.verdict == "untestable", (name, r)
        assert r.reason.startswith("a simulated run cannot contradict a measurement; the simulator predicts")
        assert "SIMULATED" in r.measured["source"]
    assert res["107"].verdict == "impossible"  # physics, not the run
    wp = res["word probe"].reason
    assert "log line" not in wp and "word probe per request" in wp


def test_claim_validation_errors_name_the_entry():
    with pytest.raises(InputError, match=r"#2 .*figure.unit"):
        parse_claims([{"text": "a", "figure": {"value": 1}},
                      {"text": "b", "figure": {"value": 1, "unit": "furlongs"}}])
    with pytest.raises(InputError, match="method"):
        Claim  # noqa: B018 - the model exists for the lead's experiment file
        parse_claims([{"text": "c", "figure": {"value": 1}, "method": "vibes"}])


def test_check_claims_command_without_and_with_run(tmp_path, run):
    runner = CliRunner()
    out = runner.invoke(app, ["check-claims", str(SEED), "--json"])
    assert out.exit_code == 0, out.output
    verdict = {r["text"]: r["verdict"] for r in json.loads(out.output)}
    assert verdict["+107% single-stream with spec-tokens 1 over no-spec"] == "impossible"
    from truthput.store.db import Store, TrialKey

    db = Store(tmp_path / "c.db")
    rid = db.create_run("claims", "sim", True, None, "", 0, {})
    for i, item in enumerate(run):
        db.commit_trial(rid, item.variant, None, TrialKey(item.variant, 0, item.concurrency, 0), "ok",
                        0.0, 0.0, (0.0, 1.0), 1.0, item.results, [], [])
    db.close()
    out = runner.invoke(app, ["check-claims", str(SEED), "latest", "--store", str(tmp_path / "c.db")],
                        env={"COLUMNS": "220"})
    assert out.exit_code == 0, out.output
    assert "SIMULATED" in out.output and "impossible" in out.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[[claim]]\ntext = 'x'\nfigure = { value = 1, unit = 'parsecs' }\n")
    out = runner.invoke(app, ["check-claims", str(bad)])
    assert out.exit_code != 0 and "bad.toml" in str(out.exception)


def test_a_claims_figure_is_per_server_start_like_the_verdicts(run):
    """One start with one trial, another with three: the cell's figure is the geometric mean of the
    starts' means (what the verdict uses), not a mean over trials, which weighs the second start 3x."""
    a = next(i for i in run if i.variant == "nospec").results
    b = next(i for i in run if i.variant == "spec1" and i.concurrency == 1).results
    ha, hb = a.headline().number(), b.headline().number()
    trials = [Measured("x", 1, a, start_index=0),
              *(Measured("x", 1, b, start_index=1, trial_index=i) for i in range(3))]
    per_start = (ha * hb) ** 0.5
    claims = parse_claims([{"text": "c", "figure": {"value": round(per_start, 1)}, "method": "counter",
                            "conditions": {"concurrency": 1}}])
    (res,) = check_claims(claims, trials, {})
    assert res.measured["counter_tps"] == pytest.approx(per_start)
    assert res.measured["counter_tps"] != pytest.approx((ha + 3 * hb) / 4)
    assert res.measured["counter_tps"] != pytest.approx((ha * hb ** 3) ** 0.25)
    assert res.verdict == "plausible" and "server_counter" in res.measured["source"]
