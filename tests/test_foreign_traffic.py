"""Another client on the same server: truthput knows every token it asked for and received, so a
counter that rose by more than truthput's own requests can have produced is flagged
`foreign_traffic` (its excess in tok/s and %), set aside, and the headline is truthput's own tokens:
running usage placed in time where the stream carries it, else each request's final usage placed
on its chunks. Known truth: the server's ledger of the tokens it sent this client
(tests/truthserver.py), which never counts the other client's."""

from __future__ import annotations

import re

import pytest

from truthput.measure.trial import measure_trial

from truthserver import TruthConfig, simulate

SHARES = (0.05, 0.30, 1.00)
"""The other client's rate as a share of truthput's own."""


def _own_rate(cfg: dict) -> float:
    sim = simulate(TruthConfig(**cfg))
    ws, we = sim.window
    return sim.ledger.between(ws, we) / (we - ws)


@pytest.mark.parametrize("continuous", [True, False], ids=["running usage", "usage only at the end"])
@pytest.mark.parametrize("engine", ["vllm", "command"])
@pytest.mark.parametrize("share", SHARES, ids=[f"{s:.0%}" for s in SHARES])
def test_another_client_is_named_and_the_headline_is_truthputs_own(share, engine, continuous):
    cfg = {"concurrency": 4, "requests": 96, "max_tokens": 40, "continuous_usage": continuous}
    own = _own_rate(cfg)
    sim = simulate(TruthConfig(**cfg, foreign_tps=share * own))
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4, engine=engine)
    ws, we = sim.window
    truth = sim.ledger.between(ws, we) / (we - ws)
    head = res.headline()
    assert head.source == "usage" and abs(head.number() - truth) <= 0.01 * truth, (head, truth)
    (flag,) = [f for f in res.throughput.counter_window.flags if f.code == "foreign_traffic"]
    said = re.search(r"([\d.]+) tok/s more than truthput's own requests can have produced, \+(\d+)%", flag.reason)
    assert said, flag.reason
    # the excess it names is the other client's, give or take the edges of the interval it was seen in
    assert float(said.group(2)) / 100 <= share * 1.5 + 0.05, flag.reason


def test_a_quiet_server_raises_no_flag_with_or_without_running_usage():
    for continuous in (True, False):
        cfg = {"concurrency": 4, "requests": 96, "max_tokens": 40, "continuous_usage": continuous}
        sim = simulate(TruthConfig(**cfg))
        res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
        assert not res.throughput.counter_window.flags and res.headline().source == "server_counter"


def test_a_server_that_sends_no_usage_cannot_bound_its_counter_and_says_so():
    cfg = {"concurrency": 4, "requests": 96, "max_tokens": 40, "continuous_usage": False}
    sim = simulate(TruthConfig(**cfg, foreign_tps=200.0))
    for r in sim.records:
        r.completion_tokens = None
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
    assert any("no usage counts" in n for n in res.validity.not_applied)
