"""Load modes: open loop (arrivals, max in flight), sweep (saturation point), goodput (SLOs).

Open-loop runs use tests/stubserver.py in process (exact tokens per request); sweep and goodput
are checked on constructed inputs whose right answer is known by hand.
"""

from __future__ import annotations

import asyncio

import pytest
from stubserver import StubConfig, StubServer

from truthput.errors import InputError
from truthput.load.client import ClientConfig, StreamClient
from truthput.load.goodput import SLO, goodput, is_good, request_itl_ms
from truthput.load.records import RequestRecord
from truthput.load.schedule import OpenLoop, Sweep
from truthput.load.workload import Workload, WorkloadSpec


def run_open(cfg: StubConfig, n_tokens: int = 10, **kw):
    async def go():
        server = await StubServer(cfg).start()
        try:
            async with StreamClient(ClientConfig(server.url)) as client:
                wl = Workload(WorkloadSpec(input_tokens=8, output_tokens=n_tokens), seed=1)
                loop = OpenLoop(client, wl, **kw)
                calls: list[str] = []

                async def ws() -> None:
                    calls.append("start")

                async def we() -> None:
                    calls.append("end")

                res = await loop.run(ws, we)
                return res, loop, server, calls
        finally:
            await server.stop()

    return asyncio.run(go())


def test_open_loop_constant_rate_sends_every_request_on_schedule() -> None:
    res, loop, server, calls = run_open(StubConfig(token_delay_s=0.001), rate=100.0, arrival="constant",
                                        max_requests=30)
    assert [r.idx for r in res.records] == list(range(30))
    assert all(r.status == "ok" and r.completion_tokens == 10 for r in res.records)
    assert server.stats.tokens_sent == 300
    starts = sorted(r.t_start for r in res.records)
    span = starts[-1] - starts[0]
    assert span == pytest.approx(29 / 100.0, abs=0.08)  # 10 ms apart, whatever the server does
    assert calls == ["start", "end"] and res.t_window_start < res.t_window_end
    assert loop.delayed_arrivals == 0


def test_open_loop_max_in_flight_caps_and_counts_delayed_arrivals() -> None:
    res, loop, server, _ = run_open(StubConfig(token_delay_s=0.005), n_tokens=20, rate=500.0, arrival="constant",
                                    max_in_flight=3, max_requests=15)
    assert len(res.records) == 15 and server.stats.tokens_sent == 300
    assert server.stats.max_active == 3 and res.max_in_flight == 3
    # each request lasts >= 100 ms (20 tokens x 5 ms) and only 3 run at once, so the 15 starts
    # span >= 4 x 100 ms although the offered schedule spans 28 ms
    starts = sorted(r.t_start for r in res.records)
    assert starts[-1] - starts[0] >= 0.4
    assert loop.delayed_arrivals >= 4
    assert any("waited for a free slot" in n for n in res.notes)


def test_poisson_arrivals_are_seeded_and_have_the_right_mean() -> None:
    a = OpenLoop(None, None, 50.0, "poisson", max_requests=4000, seed=3)  # type: ignore[arg-type]
    b = OpenLoop(None, None, 50.0, "poisson", max_requests=4000, seed=3)  # type: ignore[arg-type]
    c = OpenLoop(None, None, 50.0, "poisson", max_requests=4000, seed=4)  # type: ignore[arg-type]
    from itertools import islice

    def first(loop: OpenLoop, n: int) -> list[float]:
        return list(islice(loop.arrival_offsets(), n))

    ta = first(a, 4000)
    assert ta == first(b, 4000) and ta != first(c, 4000)
    gaps = [y - x for x, y in zip(ta, ta[1:])]
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(1 / 50.0, rel=0.05)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert cv == pytest.approx(1.0, abs=0.07)  # exponential gaps: coefficient of variation 1


def test_open_loop_rejects_bad_arguments() -> None:
    with pytest.raises(InputError, match="rate 0"):
        OpenLoop(None, None, 0)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="arrival 'burst'"):
        OpenLoop(None, None, 1, "burst", max_requests=1)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="duration_s or max_requests"):
        OpenLoop(None, None, 1)  # type: ignore[arg-type]


# --- sweep ------------------------------------------------------------------------------------


def drive(sweep: Sweep, curve) -> list[float]:
    levels = []
    while (level := sweep.next_level()) is not None:
        levels.append(level)
        sweep.record(level, curve(level))
    return levels


def test_sweep_stops_when_throughput_plateaus_and_finds_the_knee() -> None:
    # Throughput rises linearly to 1000 tok/s at 16 streams, then stays flat.
    sweep = Sweep(start=1, max_level=1024)
    levels = drive(sweep, lambda c: 62.5 * min(c, 16))
    assert levels == [1, 2, 4, 8, 16, 32]
    assert sweep.saturated and sweep.saturation().level == 16 and sweep.saturation().throughput == 1000


def test_sweep_knee_within_tolerance_and_decline_past_it() -> None:
    # 48 adds only 3 % over 24: the sweep stops there; 24 is within 5 % of the best, so it is the knee.
    table = {3: 300.0, 6: 600.0, 12: 900.0, 24: 970.0, 48: 1000.0, 96: 800.0}
    sweep = Sweep(start=3, max_level=1000)
    assert drive(sweep, table.__getitem__) == [3, 6, 12, 24, 48]
    assert sweep.saturation().level == 24
    # with patience 2 it tries one level more, sees the decline, and keeps the same knee
    sweep2 = Sweep(start=3, max_level=1000, patience=2)
    assert drive(sweep2, table.__getitem__) == [3, 6, 12, 24, 48, 96]
    assert sweep2.saturation().level == 24


def test_sweep_hitting_max_level_is_not_saturated_and_rates_may_be_fractional() -> None:
    sweep = Sweep(start=0.5, max_level=4, integer=False)
    assert drive(sweep, lambda r: 100 * r) == [0.5, 1.0, 2.0, 4.0]
    assert not sweep.saturated and sweep.saturation().level == 4.0
    with pytest.raises(InputError):
        Sweep(start=0)


# --- goodput ------------------------------------------------------------------------------------


def rec(idx: int, ttft_s: float, itl_s: float, tokens: int, t0: float = 0.0, per_chunk: int = 1,
        status: str = "ok") -> RequestRecord:
    r = RequestRecord(idx=idx, t_start=t0)
    n_chunks = -(-tokens // per_chunk)
    for k in range(n_chunks):
        r.chunk_times.append(t0 + ttft_s + k * itl_s * per_chunk)
        r.chunk_tokens.append(min(tokens, (k + 1) * per_chunk))
        r.chunk_texts.append("x")
    r.t_first = r.chunk_times[0]
    r.t_end = r.chunk_times[-1]
    r.completion_tokens = tokens if status == "ok" else None
    r.status = status
    return r


def test_itl_is_per_token_even_with_multi_token_chunks() -> None:
    assert request_itl_ms(rec(0, 0.1, 0.02, 31)) == pytest.approx(20.0)
    # the latency block's rule: 11 chunks of 3 tokens (the last brings 1); the first chunk's 3
    # tokens add no interval, the other 28 tokens share the 10 gaps of 60 ms
    assert request_itl_ms(rec(0, 0.1, 0.02, 31, per_chunk=3)) == pytest.approx(600.0 / 28)


def test_without_token_counts_itl_and_goodput_under_an_itl_target_are_missing() -> None:
    from array import array

    records = [rec(i, 0.1, 0.01, 11) for i in range(4)]
    for r in records:  # a server that sends neither usage nor running counts
        r.completion_tokens = None
        r.chunk_tokens = array("q", [-1] * len(r.chunk_tokens))
    assert request_itl_ms(records[0]) is None  # a chunk is not a token
    gp = goodput(records, SLO(itl_ms=30), window=(0.0, 2.0))
    assert gp["good_fraction"]["value"] is None and "missing data" in gp["good_fraction"]["note"]
    assert goodput(records, SLO(ttft_ms=200), window=(0.0, 2.0))["good_fraction"]["value"] == 1.0


def test_goodput_counts_requests_meeting_both_targets() -> None:
    records = [
        rec(0, 0.10, 0.010, 11, t0=0.0),   # good
        rec(1, 0.50, 0.010, 11, t0=0.0),   # TTFT 500 ms > 200
        rec(2, 0.10, 0.050, 11, t0=0.0),   # ITL 50 ms > 30
        rec(3, 0.05, 0.020, 21, t0=0.2),   # good, 21 tokens
        rec(4, 0.05, 0.020, 5, t0=0.1, status="error"),  # failed: never good
    ]
    slo = SLO(ttft_ms=200, itl_ms=30)
    assert [is_good(r, slo) for r in records] == [True, False, False, True, False]
    gp = goodput(records, slo, window=(0.0, 2.0))
    assert gp["good_requests"] == 2 and gp["missed_ttft"] == 1 and gp["missed_itl"] == 1
    assert gp["good_fraction"]["value"] == pytest.approx(2 / 5)
    assert gp["goodput_rps"]["value"] == pytest.approx(2 / 2.0)
    assert gp["good_tokens_per_s"]["value"] == pytest.approx((11 + 21) / 2.0)
    # a window that ends before request 3 finished (0.2 + 0.05 + 20 * 0.02 = 0.65 s) leaves it out
    assert goodput(records, slo, window=(0.0, 0.6))["goodput_rps"]["value"] == pytest.approx(1 / 0.6)
    # no targets: every finished request is good
    assert goodput(records, SLO(), None)["good_requests"] == 4
    with pytest.raises(InputError):
        SLO(ttft_ms=0)


def test_goodput_counts_the_end_to_end_target_as_the_other_targets() -> None:
    # end to end = request sent .. last chunk: 0.1 + 10 x 0.01 = 0.2 s; 0.1 + 10 x 0.05 = 0.6 s;
    # 0.05 + 20 x 0.02 = 0.45 s
    records = [rec(0, 0.10, 0.010, 11), rec(1, 0.10, 0.050, 11), rec(2, 0.05, 0.020, 21, t0=0.2)]
    slo = SLO(e2e_ms=500)
    assert [is_good(r, slo) for r in records] == [True, False, True]
    gp = goodput(records, slo, window=(0.0, 2.0))
    assert gp["good_requests"] == 2 and gp["missed_e2e"] == 1 and gp["slo"]["e2e_ms"] == 500
    assert gp["good_tokens_per_s"]["value"] == pytest.approx((11 + 21) / 2.0)
    assert goodput(records, SLO(e2e_ms=300), window=(0.0, 2.0))["good_requests"] == 1
    # the experiment's [slo] e2e_ms is the target run, report and load count against
    from truthput.experiment.file import parse_experiment

    exp = parse_experiment('[experiment]\nname = "e"\nbaseline = "a"\n[server]\nengine = "sim"\n'
                           'command = ["vllm", "serve", "m"]\n[[variant]]\nname = "a"\n[slo]\ne2e_ms = 500\n', "e.toml")
    assert SLO.of(exp.slo) == slo
    with pytest.raises(InputError):
        SLO(e2e_ms=-1)


def test_open_loop_duration_window_and_exact_tokens() -> None:
    # 2 ms per token x 10 tokens: the first request finishes ~20 ms after the start, the window
    # opens then and lasts 0.3 s; arrivals stop at its end and every request sent still finishes.
    res, loop, server, calls = run_open(StubConfig(token_delay_s=0.002), rate=100.0, arrival="constant",
                                        duration_s=0.3)
    assert calls == ["start", "end"]
    # the window lasts its duration; a busy host's event loop can only close it late
    length = res.t_window_end - res.t_window_start
    assert 0.3 - 0.005 <= length <= 0.3 + 0.25, length
    assert all(r.status == "ok" for r in res.records)
    assert sum(r.completion_tokens for r in res.records) == server.stats.tokens_sent == 10 * len(res.records)
    # 100 requests a second from the first arrival until the window closed, and none after
    span = res.t_window_end - min(r.t_start for r in res.records)
    assert abs(len(res.records) - 100.0 * span) <= 3, (len(res.records), span)
    first_end = min(r.t_end for r in res.records)
    assert res.t_window_start >= first_end


def test_itl_is_known_where_each_text_chunk_is_one_token_though_no_running_count_came() -> None:
    """llama.cpp's streams: no running usage, one token per chunk, the final usage at the end. A
    request with as many text chunks as completion tokens has its chunk times as token times (every
    text chunk brings at least one token), so the ITL distribution is the gaps; one whose chunk
    held two tokens (a UTF-8 character's bytes held back) is left out, and the note says how many."""
    from array import array

    import numpy as np

    from truthput.measure.latency import client_latency
    from truthput.measure.methods import build_chunk_table, usage_tokens_per_chunk

    records = [rec(i, 0.1, 0.010 * (i + 1), 21) for i in range(3)]  # gaps of 10, 20 and 30 ms
    held = rec(3, 0.1, 0.5, 21)  # its 21 tokens came in 20 chunks: not one token each
    held.chunk_times, held.chunk_texts = held.chunk_times[:-1], held.chunk_texts[:-1]
    for r in [*records, held]:
        r.chunk_tokens = array("q", [-1] * len(r.chunk_times))
    table = build_chunk_table([*records, held])
    lat = client_latency([*records, held], table, usage_tokens_per_chunk(table), None)
    # 20 intervals per counted request (the first chunk's token adds none): 10, 20 and 30 ms
    assert lat.itl.n == 60
    assert lat.itl.p50.value == pytest.approx(0.020) and lat.itl.mean.value == pytest.approx(0.020)
    assert float(np.max([lat.itl.p99.value])) < 0.031  # the held request's 500 ms gaps are not in it
    assert lat.itl.tokens_source == "text chunks"
    assert "3 request(s) without running counts had as many text chunks" in lat.itl.mean.note
    assert "1 request(s) without per-chunk token counts" in lat.itl.mean.note
