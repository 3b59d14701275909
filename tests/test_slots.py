"""llama.cpp's `/slots` places tokens in time where its counter cannot (it moves only when a
request ends): read at the window's two edges, each running task's own progress plus the requests
that ended inside the window. Known truth: the fake server's ledger of every token it sent
(tests/truthserver.py), for both shapes builds give `next_token` (an object, or a list of one)."""

from __future__ import annotations

import asyncio

import pytest

from truthput.measure.slots import SlotsRead, parse_slots, slots_window
from truthput.store.db import Store

from truthserver import TruthConfig, TruthServer


def _load(tmp_path, engine: str, **cfg):  # type: ignore[no-untyped-def]
    from truthput.load.workload import WorkloadSpec
    from truthput.run.load import LoadOptions, run_load

    async def go():  # type: ignore[no-untyped-def]
        server = await TruthServer(TruthConfig(concurrency=3, step_s=0.004, tokens_per_chunk=(1,), **cfg)).start()
        try:
            opts = LoadOptions(url=server.url, concurrency=[3], duration_s=1.5, sample_interval_s=0, engine=engine,
                               workload=WorkloadSpec(input_tokens=16, output_tokens=60))
            return server, await run_load(opts, Store(tmp_path / "l.db"))
        finally:
            await server.stop()

    return asyncio.run(go())


@pytest.mark.parametrize("shape", ["list", "object"])
def test_slots_place_tokens_in_time_within_one_percent_of_the_ledger(tmp_path, shape):
    server, run = _load(tmp_path, "command", slots=shape)
    res = run.outcomes[0].results
    fig = res.throughput.slots_window
    assert fig is not None and fig.source == "server_slots" and f"next_token {shape}" in (fig.note or ""), fig
    ws, we = res.window.start, res.window.end
    truth = server.ledger.between(ws, we) / (we - ws)
    assert fig.value == pytest.approx(truth, rel=0.02), (fig, truth)
    usage = res.throughput.usage_window.number()
    assert fig.value == pytest.approx(usage, rel=0.02)
    (row,) = [r for r in res.methods if r.method == "slots placed in time (window)"]
    assert row.cause == "agrees" and row.source == "server_slots"


def test_a_server_without_slots_costs_one_read_and_gives_no_figure(tmp_path):
    _server, run = _load(tmp_path, "command")
    res = run.outcomes[0].results
    assert res.throughput.slots_window is None
    assert not [r for r in res.methods if r.method.startswith("slots")]


def test_the_window_sum_is_progress_at_the_end_plus_what_ended_minus_progress_at_the_start():
    from truthput.load.records import RequestRecord

    start = SlotsRead("window_start", 10.0, {1: 30, 2: 5})
    end = SlotsRead("window_end", 12.0, {3: 40, 4: 7}, shape="next_token list")
    done = [RequestRecord(idx=0, t_start=9.0, t_end=11.0, completion_tokens=100),   # task 1: 70 in the window
            RequestRecord(idx=1, t_start=9.5, t_end=11.5, completion_tokens=50),    # task 2: 45 in the window
            RequestRecord(idx=2, t_start=8.0, t_end=9.9, completion_tokens=80)]     # ended before: none
    fig = slots_window([start, end], done)
    assert fig.value == pytest.approx((40 + 7 + 100 + 50 - 30 - 5) / 2.0)


def test_both_shapes_parse_and_idle_slots_count_nothing():
    listed = [{"id": 0, "is_processing": True, "id_task": 7, "next_token": [{"n_decoded": 12}]},
              {"id": 1, "is_processing": False, "next_token": [{"n_decoded": 0}]}]
    obj = [{"id": 0, "is_processing": True, "id_task": 7, "next_token": {"n_decoded": 12}}]
    assert parse_slots(listed) == ({7: 12}, "next_token list")
    assert parse_slots(obj) == ({7: 12}, "next_token object")
    with pytest.raises(ValueError):
        parse_slots({"error": "not supported"})


def test_a_request_the_server_finished_just_before_a_read_counts_once():
    """The server released its slot before the window's end read, the client read its last chunk
    just after: it is not among the read's tasks, so its whole usage counts (the client's count
    of requests in flight beyond the read's tasks says which); and the same at the start, where
    such a request is left out (its tokens were all made before the window)."""
    from truthput.load.records import RequestRecord

    start = SlotsRead("window_start", 10.0, {7: 20})
    end = SlotsRead("window_end", 12.0, {9: 40})
    records = [RequestRecord(idx=0, t_start=9.0, t_end=10.02, completion_tokens=64),   # done at the server before 10.0
               RequestRecord(idx=1, t_start=9.5, t_end=11.0, completion_tokens=64),    # task 7: 44 in the window
               RequestRecord(idx=2, t_start=11.0, t_end=12.03, completion_tokens=50),  # done before 12.0: 50 in it
               RequestRecord(idx=3, t_start=11.5, t_end=13.0, completion_tokens=64)]   # task 9: 40 in it
    fig = slots_window([start, end], records)
    assert fig.value == pytest.approx((44 + 50 + 40) / 2.0)
