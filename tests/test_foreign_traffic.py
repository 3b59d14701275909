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
@pytest.mark.parametrize("engine", ["vllm", "command", "llamacpp-style"])
@pytest.mark.parametrize("share", SHARES, ids=[f"{s:.0%}" for s in SHARES])
def test_another_client_is_named_and_the_headline_is_truthputs_own(share, engine, continuous):
    """vLLM's counter (per token), any server's (`command`), and llama.cpp's kind: a counter that
    adds a request's tokens when it ends (the same scrapes, read as llama.cpp's are read)."""
    from dataclasses import replace

    from truthput.measure.names import metric_names

    cfg = {"concurrency": 4, "requests": 96, "max_tokens": 40, "continuous_usage": continuous}
    own = _own_rate(cfg)
    sim = simulate(TruthConfig(**cfg, foreign_tps=share * own))
    if engine == "llamacpp-style":
        names = replace(metric_names("vllm"), counter_moves="per_request")
        res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4, names=names)
    else:
        res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4, engine=engine)
    ws, we = sim.window
    truth = sim.ledger.between(ws, we) / (we - ws)
    head = res.headline()
    assert head.source == "usage" and abs(head.number() - truth) <= 0.01 * truth, (head, truth)
    # the cell's note says how its headline was counted: there was a counter (set aside), and the
    # tokens were placed by running usage only where the stream carried it
    from truthput.analyze.cells import headline_basis_note

    basis = headline_basis_note(res, head)
    assert "no server counter" not in basis and ("running usage" in basis) == continuous, basis
    assert ("final usage" in basis) == (not continuous), basis
    (flag,) = [f for f in res.throughput.counter_window.flags if f.code == "foreign_traffic"]
    said = re.search(r"([\d.]+) tok/s more than truthput's own requests can have produced, \+(\d+)%", flag.reason)
    assert said, flag.reason
    # the excess it names is the other client's, give or take the edges of the interval it was seen in
    assert float(said.group(2)) / 100 <= share * 1.5 + 0.05, flag.reason
    # the audit names the cause of the server-side counts that are off: the other client, not the window
    (pre_post,) = [m for m in res.methods if m.method == "counter pre->post"]
    assert pre_post.cause == ("another client" if share >= 0.3 else pre_post.cause), pre_post


@pytest.mark.parametrize("continuous", [False, True], ids=["usage only at the end", "running usage"])
def test_a_bursty_client_is_sized_by_its_rate_over_the_window_not_one_interval(continuous):
    """Issue 62: another client whose tokens land in bursts (a request every 1.5 s) was sized by the
    one 0.1-s scrape interval that caught a burst, many times its real rate. The flag now names the
    excess over the whole window: within 50% of the other client's mean rate."""
    cfg = {"concurrency": 4, "requests": 160, "max_tokens": 40, "continuous_usage": continuous,
           "periodic_scrapes": 30}
    own = _own_rate(cfg)
    foreign = 0.3 * own
    sim = simulate(TruthConfig(**cfg, foreign_tps=foreign, foreign_every_s=1.5))
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4, engine="vllm")
    (flag,) = [f for f in res.throughput.counter_window.flags if f.code == "foreign_traffic"]
    said = re.search(r"([\d.]+) tok/s more than truthput's own requests", flag.reason)
    assert said and float(said.group(1)) <= 1.5 * foreign, (foreign, flag.reason)


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


@pytest.mark.parametrize("continuous", [True, False], ids=["running usage", "usage only at the end"])
@pytest.mark.parametrize("share", SHARES, ids=[f"{s:.0%}" for s in SHARES])
def test_another_model_on_the_same_server_is_read_apart_and_needs_no_flag(share, continuous):
    """The counter is summed over every `model_name` unless read per model: truthput reads the
    model it asked for and names the other one's traffic."""
    cfg = {"concurrency": 4, "requests": 96, "max_tokens": 40, "continuous_usage": continuous}
    own = _own_rate(cfg)
    sim = simulate(TruthConfig(**cfg, other_model_tps=share * own))
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4, model="truth")
    ws, we = sim.window
    truth = sim.ledger.between(ws, we) / (we - ws)
    head = res.headline()
    assert head.source == "server_counter" and abs(head.number() - truth) <= 0.01 * truth, (head, truth)
    assert not res.throughput.counter_window.flags
    (said,) = [w for w in res.warnings if w.startswith("other traffic")]
    rate = float(re.search(r"moved at ([\d.]+) tok/s", said).group(1))
    assert "other" in said and rate == pytest.approx(share * own, rel=0.1), said
    # the running-requests gauge is truthput's model's too (the other model's 3 are not counted)
    assert res.server_samples.running_max is None or res.server_samples.running_max.number() <= 4
    # without the model it asked for, the sum over both models is what a reader would get: flagged
    blind = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4)
    assert [f.code for f in blind.throughput.counter_window.flags] == ["foreign_traffic"]


def test_a_model_name_the_series_do_not_carry_is_said_not_guessed():
    sim = simulate(TruthConfig(concurrency=4, requests=48, max_tokens=40, other_model_tps=100.0))
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4, model="served-under-another-name")
    assert any("none of them 'served-under-another-name'" in w for w in res.warnings), res.warnings


@pytest.mark.parametrize("share", (0.0, 0.05, 0.10, 0.30, 1.00), ids=lambda s: f"{s:.0%}")
def test_a_counter_that_moves_at_request_end_names_another_client_and_its_own_kind(share):
    """A vLLM-named counter that adds a request's tokens when it ends (a gateway's, an exporter's),
    final usage only, another client whose requests end every second: the per-token bound alone
    called the counter stale and stopped there, so another client at 5% went unnamed and a server
    with none got "/metrics is behind". Now: `foreign_traffic` sized by its rate wherever there is
    another client, the counter's own kind named, the headline truthput's own tokens."""
    cfg = {"concurrency": 4, "requests": 96, "max_tokens": 40, "continuous_usage": False, "counter_at_end": True,
           "periodic_scrapes": 5}
    own = _own_rate(cfg)
    sim = simulate(TruthConfig(**cfg, foreign_tps=share * own, foreign_every_s=1.0))
    res = measure_trial(sim.records, sim.scrapes, sim.log_lines, sim.window, 4, engine="vllm")
    ws, we = sim.window
    truth = sim.ledger.between(ws, we) / (we - ws)
    head = res.headline()
    assert head.source == "usage" and abs(head.number() - truth) <= 0.01 * truth, (head, truth)
    flags = {f.code: f.reason for f in res.throughput.counter_window.flags}
    if share == 0:
        assert "foreign_traffic" not in flags and "moves when a request ends" in flags["stale_counter"], flags
        return
    said = re.search(r"([\d.]+) tok/s more than truthput's own requests can have produced, \+(\d+)%",
                     flags.get("foreign_traffic", ""))
    assert said, flags
    assert float(said.group(2)) / 100 <= share * 1.5 + 0.05, flags
    assert "/metrics is behind" not in flags.get("stale_counter", ""), flags


def _load_beside(tmp_path, foreign_tps: float):  # type: ignore[no-untyped-def]
    """`truthput load` (two levels) on a server another client uses at `foreign_tps`."""
    import asyncio

    from truthput.load.workload import WorkloadSpec
    from truthput.run.load import LoadOptions, run_load
    from truthput.store.db import Store
    from truthserver import TruthServer

    said: list[str] = []

    async def go():  # type: ignore[no-untyped-def]
        server = await TruthServer(TruthConfig(concurrency=2, max_tokens=20, step_s=0.01,
                                               foreign_tps=foreign_tps)).start()
        try:
            opts = LoadOptions(url=server.url, concurrency=[1, 2], duration_s=0.8, sample_interval_s=0,
                               workload=WorkloadSpec(input_tokens=16, output_tokens=20))
            return await run_load(opts, Store(tmp_path / "l.db"), progress=said.append)
        finally:
            await server.stop()

    return asyncio.run(go()), said


@pytest.mark.slow
def test_load_names_other_traffic_before_any_load_and_between_trials(tmp_path):
    """`truthput load` on a server another client uses at ~150 tok/s: two scrapes before the
    first level see the counter move with no load of truthput's, and so do the scrapes between
    two levels; both are said (a run event, a trial warning) with the rate seen."""
    from truthput.store.db import Store

    run, said = _load_beside(tmp_path, 150.0)
    before = [s for s in said if "serving other traffic" in s]
    assert before, said
    rate = float(re.search(r"rose by \d+ \(([\d.]+) tok/s\)", before[0]).group(1))
    assert rate == pytest.approx(150.0, rel=0.2), before
    events = Store(tmp_path / "l.db", read_only=True).conn.execute(
        "SELECT message FROM events WHERE kind='other_traffic'").fetchall()
    assert len(events) == 1
    (between,) = [w for w in run.outcomes[1].results.warnings if w.startswith("other traffic: the server's")]
    assert float(re.search(r"\(([\d.]+) tok/s from another client\)", between).group(1)) == pytest.approx(150, rel=0.3)


@pytest.mark.slow
def test_a_quiet_server_gets_no_other_traffic_warning(tmp_path):
    run, said = _load_beside(tmp_path, 0.0)
    assert not [s for s in said if "other traffic" in s]
    assert not [w for o in run.outcomes for w in o.results.warnings if "other traffic" in w]


def _external_experiment(tmp_path, url: str):  # type: ignore[no-untyped-def]
    exp = tmp_path / "ext.toml"
    exp.write_text("\n".join([
        "[experiment]", 'name = "shared"', 'baseline = "a"', "seed = 1", "",
        "[server]", 'engine = "external"', f'url = "{url}"', 'command = ["someone-elses-server"]', "",
        "[[variant]]", 'name = "a"', "", "[[variant]]", 'name = "b"', 'env = { X = "1" }', "",
        "[workload]", "concurrency = [2]", "duration_s = 0.3", "warmup_s = 0", "input_tokens = 16",
        "output_tokens = 20", "", "[measure]", "starts = 1", "sequential = false", "output_guard = false", ""]))
    return exp


@pytest.mark.slow
def test_plan_and_run_watch_a_server_they_did_not_start_before_any_load(tmp_path):
    """engine = "external": someone else's server. `plan` and each start of `run` watch its counter
    for a second before truthput sends anything, and say the other traffic they see (its tok/s):
    the fake server's other client sends 400 tok/s."""
    import asyncio
    import threading

    from typer.testing import CliRunner

    from truthput.cli import app
    from truthserver import TruthServer

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(TruthServer(TruthConfig(concurrency=2, max_tokens=20, step_s=0.005,
                                                             foreign_tps=400.0)).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        exp = _external_experiment(tmp_path, server.url)
        plan = CliRunner().invoke(app, ["plan", str(exp), "--store", str(tmp_path / "none.db")])
        assert plan.exit_code == 0, plan.output
        said = re.search(r"serving other traffic: over [\d.]+ s before any load from truthput its token counter rose by \d+ "
                          r"\(([\d.]+) tok/s\)", " ".join(plan.output.split()))
        assert said and float(said.group(1)) == pytest.approx(400, rel=0.15), plan.output
        run = CliRunner().invoke(app, ["run", str(exp), "--store", str(tmp_path / "r.db"), "--no-reports"])
        from truthput.store.db import Store

        db = Store(tmp_path / "r.db")
        events = [e.message for e in db.events(db.resolve_run("latest")) if e.kind == "other_traffic"]
        assert len(events) == 2 and all("serving other traffic" in e for e in events), (events, run.output[-2000:])
        db.close()
        # said in every view of the stored run, not only as the run went (issue 62)
        md = tmp_path / "r.md"
        for args in (["report", "latest", "--md", str(md)], ["report", "latest"], ["audit", "latest"]):
            out = CliRunner().invoke(app, [*args, "--store", str(tmp_path / "r.db")], env={"COLUMNS": "200"})
            assert out.exit_code == 0, out.output
            assert "serving other traffic" in " ".join(out.output.split()) or (
                args[2:3] == ["--md"] and "serving other traffic" in md.read_text()), (args, out.output[-1500:])
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
