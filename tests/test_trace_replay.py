"""Recorded traffic replayed: the formats read from the file (Mooncake, Azure, BurstGPT, the user's own
timestamped JSONL), bad input as one line with file and line, the replay's schedule (speed-up, gap cap,
slice), text shared exactly where the trace's hash ids are, and a replay on the simulator on schedule
with the server's hits where the hash ids put them.

Known truth: the bundled samples' own fields (scripts/make_trace_samples.py) and files written here.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from truthput.errors import InputError
from truthput.load.trace import TraceOptions, read_trace
from truthput.load.workload import Workload, WorkloadSpec

SAMPLES = Path(__file__).resolve().parents[1] / "src" / "truthput" / "load" / "data" / "traces"


@pytest.mark.parametrize("name, fmt, n", [("mooncake_sample.jsonl", "mooncake", 60), ("azure_sample.csv", "azure", 60),
                                          ("burstgpt_sample.csv", "burstgpt", 57), ("user_sample.jsonl", "jsonl", 40)])
def test_each_format_is_read_from_its_fields(name, fmt, n):
    trace = read_trace(SAMPLES / name)
    assert trace.format == fmt and len(trace.requests) == n
    assert trace.requests[0].t == 0.0 and all(a.t <= b.t for a, b in zip(trace.requests, trace.requests[1:]))
    first = (SAMPLES / name).read_text().splitlines()[1 if name.endswith(".csv") else 0]
    if fmt == "mooncake":
        row = json.loads(first)
        assert (trace.requests[0].input_tokens, trace.requests[0].hash_ids) == (row["input_length"],
                                                                                  tuple(row["hash_ids"]))
    if fmt == "burstgpt":
        assert trace.notes == ["3 requests with a 0-token response (failures in BurstGPT) left out"]
    if fmt == "jsonl":
        assert trace.requests[0].body["prompt"] == json.loads(first)["prompt"]


BAD = {
    "missing field": ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                      '{"timestamp": 5, "output_length": 5}\n', ":2: missing input_length"),
    "time goes back": ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                       '{"timestamp": 500, "input_length": 10, "output_length": 5}\n'
                       '{"timestamp": 400, "input_length": 10, "output_length": 5}\n', ":3: the timestamp goes back"),
    "negative time": ('{"timestamp": -3, "input_length": 10, "output_length": 5}\n', ":1: timestamp -3 is negative"),
    "zero length": ('{"timestamp": 0, "input_length": 0, "output_length": 5}\n', ":1: input_length 0: a length must"),
    "unknown shape": ('{"when": 0, "tokens": 10}\n', "fields tokens, when: not a trace truthput reads"),
    "no text of the user's": ('{"timestamp": 1, "prompt": "hi"}\n{"timestamp": 2, "body": {"model": "m"}}\n',
                              ":2: no prompt or messages"),
    "a CSV of other columns": ("time,tokens\n1,2\n", "a CSV with columns time, tokens: not a trace"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_with_its_file_and_line(case, tmp_path):
    text, said = BAD[case]
    path = tmp_path / ("t.csv" if text[0] != "{" else "t.jsonl")
    path.write_text(text)
    with pytest.raises(InputError, match=None) as exc:
        read_trace(path)
    assert said in str(exc.value) and str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_a_slice_with_no_request_and_a_request_too_long_for_the_context_are_refused():
    from truthput.load.trace import context_check

    trace = read_trace(SAMPLES / "mooncake_sample.jsonl")
    with pytest.raises(InputError, match="the slice from 500 s holds no request"):
        trace.replayed(TraceOptions(start_s=500))
    with pytest.raises(InputError, match=r"mooncake_sample.jsonl:1: 705 prompt \+ 42 output tokens exceed the model's "
                                         r"context of 512"):
        context_check(trace, 512)


def test_the_schedule_is_the_recorded_one_sped_up_capped_and_sliced():
    trace = read_trace(SAMPLES / "mooncake_sample.jsonl")
    t = [r.t for r in trace.requests]
    assert trace.replayed(TraceOptions()).offsets == pytest.approx(t)
    assert trace.replayed(TraceOptions(speedup=4)).offsets == pytest.approx([x / 4 for x in t])
    capped = trace.replayed(TraceOptions(max_gap_s=0.1)).offsets
    assert max(b - a for a, b in zip(capped, capped[1:])) == pytest.approx(0.1)
    sliced = trace.replayed(TraceOptions(start_s=5, duration_s=10))
    kept = [x for x in t if 5 <= x < 15]
    assert sliced.offsets == pytest.approx([x - kept[0] for x in kept])


def test_equal_hash_ids_get_equal_text_and_another_trial_gets_other_text():
    spec = WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source=f"trace:{SAMPLES / 'mooncake_sample.jsonl'}")
    wl = Workload(spec, seed=1)
    reqs = wl.trace.requests
    i, j = next((i, j) for i in range(len(reqs)) for j in range(i + 1, len(reqs))
                if reqs[i].hash_ids[0] == reqs[j].hash_ids[0])
    a, b = wl.body(i)["prompt"], wl.body(j)["prompt"]
    block = len(wl._trace_prompt(i, 512, reqs[i].hash_ids[:1]))  # the shared block's text (words)
    assert a[:block] == b[:block] and a[block:] != b[block:]
    assert wl.body(i)["max_tokens"] == reqs[i].output_tokens
    assert Workload(spec, seed=2).body(i)["prompt"][:block] != a[:block]  # trials of one server share nothing
    other = next(k for k in range(len(reqs)) if reqs[k].hash_ids[0] != reqs[i].hash_ids[0])
    assert wl.body(other)["prompt"][:50] != a[:50]


def test_a_mooncake_slice_replays_on_the_simulator_on_schedule_with_the_hits_its_hash_ids_imply(tmp_path):
    """The simulator with the word cache (no tokenizer: 384 words a 512-token block): every request
    sent, p99 lateness within 20 ms on this host, the window's hit rate near the hash ids' sharing."""
    from simhelpers import running_sim
    from truthput.run.load import LoadOptions, run_load
    from truthput.store.db import Store

    source = f"trace:{SAMPLES / 'mooncake_sample.jsonl'}"
    spec = WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source=source, trace=TraceOptions(speedup=2))

    async def go():
        async with running_sim(["--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b", "--max-model-len", "4096",
                                "--sim-startup-s", "0", "--noise", "0"]) as srv:
            opts = LoadOptions(url=f"http://127.0.0.1:{srv.port}", workload=spec)
            return await run_load(opts, Store(tmp_path / "t.db"))

    run = asyncio.run(go())
    (out,) = run.outcomes
    res = out.results
    replay = Workload(spec, seed=0).trace
    assert res.replay.scheduled == res.replay.sent == 60 and res.requests.ok == 60
    behind = [f for f in res.throughput.counter_window.flags if f.code == "replay_behind"]
    lag = res.client.selfcheck.loop_lag_p99_ms if res.client.selfcheck is not None else None
    if lag is not None and lag <= 10:  # the client had its CPU: on schedule, unflagged
        assert res.replay.lateness_p99_ms <= 20 and not behind, (res.replay, lag)
    else:  # the rest of the suite starved the client on these 2 cores: late sends are flagged, not hidden
        assert bool(behind) == (res.replay.lateness_p99_ms > 50), (res.replay, lag, behind)
    assert res.replay.achieved_rate == pytest.approx(replay.rate, rel=0.1)
    implied = replay.shared_share()
    assert res.server_samples.prefix_cache_hit_rate.value == pytest.approx(implied, abs=0.1), implied


def test_a_replay_held_back_by_a_cap_on_requests_in_flight_is_flagged_and_not_compared(tmp_path):
    """One request in flight at a time, the trace 8x faster than recorded: the sends fall behind."""
    from simhelpers import running_sim
    from truthput.measure.model import NOT_COMPARED_FLAGS
    from truthput.run.load import LoadOptions, run_load

    spec = WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source=f"trace:{SAMPLES / 'azure_sample.csv'}",
                        trace=TraceOptions(speedup=8, duration_s=4))

    async def go():
        async with running_sim(["--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b", "--max-model-len", "4096",
                                "--sim-startup-s", "0", "--noise", "0"]) as srv:
            return await run_load(LoadOptions(url=f"http://127.0.0.1:{srv.port}", workload=spec, max_in_flight=1), None)

    res = asyncio.run(go()).outcomes[0].results
    assert res.replay.lateness_p99_ms > 50 and res.replay.achieved_rate < res.replay.requested_rate
    (flag,) = [f for f in res.throughput.counter_window.flags if f.code == "replay_behind"]
    assert "ms late at p99" in flag.reason and "replay_behind" in NOT_COMPARED_FLAGS


def test_an_ab_on_a_trace_slice_feeds_both_arms_the_same_requests_and_shows_fidelity_and_hits(tmp_path):
    from simhelpers import run_experiment
    from truthput.analyze.summary import summary_of
    from truthput.experiment.file import parse_experiment
    from truthput.store.db import Store
    from truthput.store.summary import summary_inputs

    text = (Path(__file__).resolve().parents[1] / "examples" / "trace.toml").read_text()
    text = text.replace("src/truthput/load/data/traces/mooncake_sample.jsonl", str(SAMPLES / "mooncake_sample.jsonl"))
    text = text.replace("speedup = 2 ", "speedup = 4\nduration_s = 12 ").replace("[measure]\n", "[measure]\nrepeats = 1\n")
    n = len(Workload.of_experiment(parse_experiment(text, "trace.toml"), 0).trace.requests)
    store = Store(tmp_path / "t.db")
    run_id = asyncio.run(run_experiment(parse_experiment(text, "trace.toml"), text, "trace.toml", store,
                                        progress=lambda m: None))
    trials = store.trial_results(run_id)
    assert len(trials) == 4 and all(t.status == "ok" for t in trials)
    for t in trials:  # every arm, every start: the whole slice, on schedule
        assert t.results.replay.sent == t.results.replay.scheduled == n
        assert t.results.replay.lateness_p99_ms < 50
    bodies = {}
    for t in trials:  # the same requests to both arms of a round
        bodies.setdefault(t.start_index, set()).add(tuple(r.prompt_tokens for r in store.requests(t.id)))
    assert all(len(b) == 1 for b in bodies.values()), bodies
    summary = summary_of(summary_inputs(store, run_id))
    rows = {c.variant: c for c in summary.cells}
    assert all(c.prefix_cache_hit_rate()[0] > 0.3 for c in rows.values())  # the trace's shared blocks hit
    assert all(c.replay_lateness_p99() is not None for c in rows.values())
    assert summary.verdict.comparisons()
