"""A figure known to be wrong never decides a comparison (principle 3): the verdict leaves its cell
out and says why; with another client on one arm's server, the comparison is made on truthput's own
tokens, so the sharing arm is never named a winner it is not. Known truth: the servers' ledgers
(tests/truthserver.py) and identical server configurations on both arms."""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass

from truthput.analyze.summary import summarize
from truthput.experiment.file import MeasureSection
from truthput.measure.model import TrialResults
from truthput.measure.trial import measure_trial

from truthserver import TruthConfig, simulate


@dataclass
class Trial:
    variant: str
    start_index: int
    results: TrialResults
    concurrency: int = 4
    trial_index: int = 0
    status: str = "ok"
    error: str | None = None
    rate: float | None = None
    id: int = 0


def _trial(variant: str, start: int, rng: random.Random, no_usage: bool = False, **extra: object) -> Trial:
    cfg = dict({"concurrency": 4, "requests": 64, "max_tokens": 40,
                "step_s": 0.01 * rng.uniform(0.97, 1.03), "prefill_s": 0.05 + 0.002 * start}, **extra)
    sim = simulate(TruthConfig(**cfg))
    if no_usage:  # a server that sends no usage counts at all
        for r in sim.records:
            r.completion_tokens = None
            r.chunk_tokens = array("q", [-1] * len(r.chunk_times))
    return Trial(variant, start, measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4))


def _summary(trials: list[Trial], starts: int):  # type: ignore[no-untyped-def]
    return summarize(trials, ["quiet", "shared"], {}, "quiet", MeasureSection(starts=starts, sequential=False),
                     simulated=False)


def test_one_arm_sharing_its_server_is_never_named_the_winner():
    """Ten experiments of the same server twice, one arm beside another client at half its rate,
    streams without running usage (a gateway that drops it): no winner named in any."""
    false_winners, decided_on_counter = 0, 0
    for seed in range(10):
        rng = random.Random(seed)
        trials = []
        for start in range(3):
            trials.append(_trial("quiet", start, rng, continuous_usage=False))
            own = _trial("shared", start, random.Random(seed * 100 + start), continuous_usage=False)
            trials.append(_trial("shared", start, random.Random(seed * 100 + start), continuous_usage=False,
                                 foreign_tps=0.5 * own.results.headline().number()))
        s = _summary(trials, 3)
        shared = next(c for c in s.cells if c.variant == "shared")
        assert shared.source == "usage" and "foreign_traffic" in {f.code for f in shared.flags_on("counter")}
        comp = s.comparison("shared", 4)
        assert comp is not None
        false_winners += comp.outcome == "faster" or any(cv.winner == "shared" for cv in s.verdict.per_concurrency)
        decided_on_counter += shared.source == "server_counter"
        assert abs(comp.estimate.pct) < 10, comp.line  # the same server: no 50% difference
    assert false_winners == 0 and decided_on_counter == 0


def test_a_cell_whose_figure_is_wrong_is_shown_but_not_compared():
    """A /metrics one scrape behind and no usage at all (nothing of truthput's own to fall back on): the
    lagging arm's headline stays the flagged counter, shown with `stale_counter`, never compared."""
    rng = random.Random(1)
    trials = []
    for start in range(3):
        trials.append(_trial("quiet", start, rng, continuous_usage=False))
        trials.append(_trial("shared", start, rng, no_usage=True, continuous_usage=False, metrics_lag_scrapes=True))
    s = _summary(trials, 3)
    lagging = next(c for c in s.cells if c.variant == "shared")
    assert lagging.wrong == ["stale_counter"] and lagging.source == "server_counter"
    assert s.comparison("shared", 4) is None
    assert not any(cv.winner for cv in s.verdict.per_concurrency)
    assert any("shared c=4: not compared on tok/s" in n for n in s.verdict.decision_lines())


def test_a_variant_whose_requests_were_cut_short_is_flagged_unequal_work_and_not_decided():
    """The `-c`/`-np` case: a variant whose server stops each request at 12 of the 40 tokens asked
    (a context limit: finish_reason length) runs faster per token or slower per request, but its
    tok/s is not the baseline's quantity: flagged `unequal_work` in its cell, never compared."""
    rng = random.Random(7)
    trials = []
    for start in range(3):
        trials.append(_trial("quiet", start, rng))
        trials.append(_trial("shared", start, rng, max_tokens=12))
    s = summarize(trials, ["quiet", "shared"], {}, "quiet", MeasureSection(starts=3, sequential=False),
                  simulated=False)
    cut = next(c for c in s.cells if c.variant == "shared")
    (flag,) = [f for f in cut.flags if f.code == "unequal_work"]
    assert "got 12 completion tokens each against quiet's 40" in flag.reason, flag.reason
    assert cut.wrong == ["unequal_work"]
    assert not s.verdict.comparisons() and not s.verdict.winners()
    assert any("shared c=4: not compared on tok/s: its requests did other work" in n for n in s.verdict.notes)
    # the same work on both arms: no flag
    same = [t for t in trials if t.variant == "quiet"]
    same += [Trial("shared", t.start_index, t.results) for t in same]
    s2 = summarize(same, ["quiet", "shared"], {}, "quiet", MeasureSection(starts=3, sequential=False), simulated=False)
    assert not any(f.code == "unequal_work" for c in s2.cells for f in c.flags)
    # the arms swapped: the baseline is the one cut short, and it is still flagged, and nothing compared
    s3 = summarize(trials, ["shared", "quiet"], {}, "shared", MeasureSection(starts=3, sequential=False),
                   simulated=False)
    cut = next(c for c in s3.cells if c.variant == "shared")
    assert cut.wrong == ["unequal_work"] and not s3.verdict.comparisons()
    assert not any(f.code == "unequal_work" for c in s3.cells if c.variant == "quiet" for f in c.flags)


def test_writing_a_configuration_the_verdict_decided_slower_than_another_is_warned_both_ways():
    """`truthput unit --variant NAME` warns whenever the verdict decided NAME slower than another:
    a variant slower than the baseline, and the baseline itself where a variant was decided faster
    (known truth: the fast arm's server steps in half the time)."""
    rng = random.Random(3)
    trials = []
    for start in range(3):
        trials.append(_trial("quiet", start, rng))
        trials.append(_trial("shared", start, rng, step_s=0.005))  # twice as fast a server
    s = _summary(trials, 3)
    assert s.verdict.winners() == {"shared": [4]}, s.verdict.lines()
    written, said = s.said_of("quiet")
    assert written == "quiet" and len(said) == 1 and said[0].startswith("the verdict decided shared "), said
    assert "faster than quiet at c=4" in said[0]
    assert s.said_of("shared") == ("shared", []) and s.said_of(None) == ("shared", [])
