"""A /metrics that misbehaves: a dip (a lagging replica answers one scrape), a dip at the window's
edge, a read that fails (HTTP 503) at the edges or every third time. Each trial's figure is right
(within 1% of the server's ledger of truthput's own tokens) or flagged, and a load with no figure
from any source exits 4. Known truth: tests/truthserver.py's ledger."""

from __future__ import annotations

import asyncio

import pytest

from truthput.measure.model import COUNT_WRONG_FLAGS
from truthput.measure.trial import measure_trial
from truthput.store.db import Store

from truthserver import TruthConfig, TruthServer, simulate

BASE = {"concurrency": 4, "requests": 96, "max_tokens": 40, "periodic_scrapes": 5}
# simulate()'s scrapes in time order: 0 pre, 1 window_start, 2..6 periodic, 7 window_end, 8 post


def _trial(**cfg):  # type: ignore[no-untyped-def]
    sim = simulate(TruthConfig(**{**BASE, **cfg}))
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
    ws, we = res.window.start, res.window.end
    return res, sim.ledger.between(ws, we) / (we - ws)


@pytest.mark.parametrize("stale", [(3,), (2, 4), (5,)], ids=["one dip", "two dips", "a dip late in the window"])
def test_a_dip_inside_the_window_is_dropped_and_costs_nothing(stale):
    # a replica 1.5 s behind: below the scrape before it (the periodic scrapes are ~1 s apart)
    res, truth = _trial(stale_scrapes=stale, stale_lag_s=1.5)
    counter = res.throughput.counter_window
    assert counter.source == "server_counter" and not counter.flags, counter
    assert abs(counter.number() - truth) <= 0.01 * truth, (counter, truth)
    # the seed's method stands: the headline is the counter
    assert res.headline().source == "server_counter"


@pytest.mark.parametrize("created", [True, False], ids=["with _created", "without _created"])
@pytest.mark.parametrize("stale", [(3,), (3, 4)], ids=["one scrape", "two in a row"])
def test_a_dip_to_near_zero_is_not_a_restart_and_raises_no_other_client(stale, created):
    """A replica 100 s behind (before the server's first token: it reads ~0) answers inside the
    window. Read as a restart, the next scrape's whole value would count again: a counter far
    above truthput's own tokens, flagged `foreign_traffic` on a server nobody else uses."""
    res, truth = _trial(stale_scrapes=stale, stale_lag_s=100.0, created_series=created)
    counter = res.throughput.counter_window
    assert not counter.flags and abs(counter.number() - truth) <= 0.01 * truth, (counter, truth)
    assert res.headline().source == "server_counter"


@pytest.mark.parametrize("continuous", [True, False], ids=["running usage", "usage only at the end"])
def test_a_dip_at_the_window_end_loses_the_edge_the_counter_is_flagged_and_set_aside(continuous):
    res, truth = _trial(stale_scrapes=(7,), stale_lag_s=1.5, continuous_usage=continuous)
    counter = res.throughput.counter_window
    reasons = {f.code: f.reason for f in counter.flags}
    # (with running usage the window's count is first seen trailing usage; either reason names it stale)
    assert "stale_counter" in reasons and ("last scrape was stale" in reasons["stale_counter"]
                                           or "/metrics is behind" in reasons["stale_counter"]), reasons
    head = res.headline()
    # truthput's own tokens (usage placed in time) take its place, within 1% of the ledger
    assert head.source == "usage" and abs(head.number() - truth) <= 0.01 * truth, (head, truth)


@pytest.mark.parametrize("every", [2, 3])
def test_a_metrics_failing_every_nth_read_gives_a_right_or_flagged_figure(every):
    res, truth = _trial(failing_scrapes_every=every)
    head = res.headline()
    if head.value is None:
        assert "no headline figure" in (head.note or "")
    else:
        right = abs(head.number() - truth) <= 0.01 * truth
        assert right or head.flagged, (head, truth)
        if head.source == "server_counter":
            assert right and not any(f.code in COUNT_WRONG_FLAGS for f in head.flags)


def test_a_failed_window_edge_moves_to_the_nearest_good_scrape_and_says_so():
    # 1 = window_start, 7 = window_end: both fail; the periodic scrapes inside carry the counter
    sim = simulate(TruthConfig(**BASE, stale_scrapes=()))
    for i in (1, 7):
        s = sim.scrapes[i]
        sim.scrapes[i] = type(s)(s.phase, s.t_mono, None, "GET /metrics answered HTTP 503")
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
    ws, we = res.window.start, res.window.end
    assert (ws, we) == (sim.scrapes[2].t_mono, sim.scrapes[6].t_mono)
    assert "window_start read failed" in res.window.basis and "window_end read failed" in res.window.basis
    truth = sim.ledger.between(ws, we) / (we - ws)
    counter = res.throughput.counter_window
    assert abs(counter.number() - truth) <= 0.01 * truth, (counter, truth)


@pytest.mark.slow
def test_load_over_http_retries_a_failing_edge_and_stays_right(tmp_path):
    """`truthput load` against a /metrics that answers 503 every third read: each edge is read
    again (within 0.15 s), the figure is the server's counter, within 1% of the ledger."""
    from truthput.load.workload import WorkloadSpec
    from truthput.run.load import LoadOptions, run_load

    async def go():  # type: ignore[no-untyped-def]
        server = await TruthServer(TruthConfig(concurrency=4, max_tokens=40, step_s=0.01, failing_scrapes_every=3,
                                               tokens_per_chunk=(1,))).start()
        try:
            opts = LoadOptions(url=server.url, concurrency=[4], duration_s=1.5, sample_interval_s=0,
                               workload=WorkloadSpec(input_tokens=16, output_tokens=40))
            run = await run_load(opts, Store(tmp_path / "l.db"))
        finally:
            await server.stop()
        return server, run

    server, run = asyncio.run(go())
    res = run.outcomes[0].results
    assert all(s.error is None for s in res.scrapes if s.phase in ("window_start", "window_end")), res.scrapes
    assert any("retried at the" in (s.error or "") for s in res.scrapes), res.scrapes
    ws, we = res.window.start, res.window.end
    truth = server.ledger.between(ws, we) / (we - ws)
    head = res.headline()
    assert head.source == "server_counter" and abs(head.number() - truth) <= 0.01 * truth, (head, truth)


def test_load_with_no_figure_from_any_source_exits_4(tmp_path, capsys):
    """Requests succeed, but /metrics never answers and the stream carries no usage: `load` says
    it could not make the measurement and exits 4 (docs/cli.md's exit codes)."""
    import typer

    from truthput.commands.load import _exit_if_nothing_measured
    from truthput.load.workload import WorkloadSpec
    from truthput.run.load import LoadOptions, run_load

    async def go():  # type: ignore[no-untyped-def]
        server = await TruthServer(TruthConfig(concurrency=2, max_tokens=20, step_s=0.005, failing_scrapes_every=1,
                                               continuous_usage=False, final_usage=False)).start()
        try:
            opts = LoadOptions(url=server.url, concurrency=[2], duration_s=0.8, sample_interval_s=0,
                               workload=WorkloadSpec(input_tokens=16, output_tokens=20))
            return await run_load(opts, Store(tmp_path / "l.db"))
        finally:
            await server.stop()

    run = asyncio.run(go())
    assert all(r.status == "ok" for r in run.outcomes[0].trial.load.records)
    with pytest.raises(typer.Exit) as stop:
        _exit_if_nothing_measured(run)
    assert stop.value.exit_code == 4
    assert "no tok/s figure" in capsys.readouterr().err


def test_a_failed_closing_scrape_is_said_as_the_missing_total_not_as_no_counter():
    """The scrape after the load (8, post) answers 503: the window's counter figure stands (the
    headline, from the server counter); what is missing is the counter's total over the load, which
    checks truthput's own tokens. The load view says that, not "no server counter figure"."""
    import io

    from rich.console import Console

    from truthput.analyze.loadrows import load_row
    from truthput.report.loadtable import _print_row_lines

    sim = simulate(TruthConfig(**BASE))
    s = sim.scrapes[8]
    assert s.phase == "post"
    sim.scrapes[8] = type(s)(s.phase, s.t_mono, None, "GET /metrics answered HTTP 503")
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
    assert res.headline().source == "server_counter" and res.integrity.counter_delta.value is None
    row = load_row(4, "closed", res, sim.records, "ok", None, sum(r.completion_tokens or 0 for r in sim.records))
    out = io.StringIO()
    _print_row_lines(Console(file=out, width=200), row, "4 streams")
    text = " ".join(out.getvalue().split())
    assert "no server counter figure" not in text, text
    assert "the server counter's total over the load (its first to its last scrape) is missing" in text, text
