"""The stale-counter bounds on clean multi-token and speculative streams: no false flag, and a
lagging /metrics still caught.

The server is tests/truthserver.py's known-truth fake (a FAKE, every token on a ledger) in virtual
time, with the two imperfections every real run has: the client reads each chunk a little late
(a random walk of 0-20 ms, two decode steps, per chunk), and a scrape's moment on the server is not
the request/response midpoint the client records (uniform within +-4 ms, inside the 5 ms the
check assumes at least). Periodic scrapes every 0.25 s inside the window, as `run` takes them.
This noise model is ours: a claim measured here is a claim about this stand-in.
"""

from __future__ import annotations

import random
from array import array

import pytest

from truthput.measure.prom import Scrape
from truthput.measure.trial import measure_trial

from truthserver import TruthConfig, simulate

SHAPES = [((16,), None), ((32,), None), ((1,), 3)]  # tokens per chunk; speculative k (3 of 3 mostly accepted)


def _trial(seed: int, tpc: tuple[int, ...], spec: int | None, c: int, lag_s: float = 0.0):
    rng = random.Random(seed)
    cfg = TruthConfig(concurrency=c, requests=6 * c, max_tokens=80 * tpc[0] * (3 if spec else 1),
                      tokens_per_chunk=tpc, spec_k=spec, accept_pattern=(3, 2, 3, 3, 1) if spec else (1,),
                      prefill_s=0.05 + 0.003 * rng.random(), metrics_lag_s=lag_s)
    sim = simulate(cfg)
    for r in sim.records:
        late, times = 0.0, []
        for t in r.chunk_times:
            late = max(0.0, min(0.02, late + rng.uniform(-0.005, 0.005)))
            times.append(t + late)
        r.chunk_times = array("d", times)
        r.t_first = times[0]
        r.t_end = max(r.t_end, times[-1] + 0.0005)
    ws, we = sim.window
    moments = [(s.phase, s.t_mono) for s in sim.scrapes]
    t = ws + 0.25
    while t < we - 0.1:
        moments.append(("periodic", t))
        t += 0.25
    scrapes = [Scrape(ph, tt, sim.metrics.scrape(tt + rng.uniform(-0.004, 0.004))) for ph, tt in moments]
    res = measure_trial(sim.records, scrapes, sim.log_lines, sim.window, c)
    return res, sim.ledger.between(ws, we) / (we - ws)


def _codes(res) -> set[str]:
    return {f.code for fig in (res.throughput.counter_window, res.throughput.usage_window) for f in fig.flags}


@pytest.mark.parametrize("tpc,spec", SHAPES, ids=["16 per chunk", "32 per chunk", "speculative k=3"])
def test_clean_multi_token_streams_carry_no_stale_flag(tpc, spec):
    for c in (4, 8):
        for seed in range(4):  # 3 shapes x 2 levels x 4 = 24 runs
            res, truth = _trial(seed, tpc, spec, c)
            assert not _codes(res) & {"stale_counter", "foreign_traffic"}, (c, seed, res.scrape_intervals.note)
            assert res.scrape_intervals.stale_suspected is False
            head = res.throughput.counter_window.number()
            assert head is not None and abs(head - truth) <= 0.005 * truth, (c, seed, head, truth)


@pytest.mark.parametrize("tpc,spec", SHAPES, ids=["16 per chunk", "32 per chunk", "speculative k=3"])
def test_a_metrics_lagging_80ms_is_still_caught_on_the_same_streams(tpc, spec):
    for c in (4, 8):
        for seed in range(2):
            res, _truth = _trial(seed, tpc, spec, c, lag_s=0.08)
            assert "stale_counter" in _codes(res), (c, seed)
