"""The user's rows as they arrive: each row of a prompt file sent once per server, in one seeded
order per run, the arms of a round fed the same rows, a row sent again flagged; and the simulator's
prefix cache that a re-sent row would hit (vLLM's: hashed blocks, LRU within the KV capacity).

Known truth: which rows a load sends follows from the order and the offsets, so the tests count
them; the simulator's hits follow from its block size (a prompt sent twice hits every full block
but the one holding its last token).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from simhelpers import parse_prometheus, running_sim
from truthput.load.rows import RowLedger
from truthput.load.workload import Workload, WorkloadSpec
from truthput.run.load import LoadOptions, run_load
from truthput.sim.prefixcache import PrefixCache
from truthput.store.db import Store

SIM = ["--sim-gpu", "RTX 3090", "--sim-model", "llama-3.1-8b", "--max-model-len", "8192",
       "--sim-startup-s", "0", "--noise", "0"]


def rows_file(tmp_path: Path, n: int, words: int = 120) -> Path:
    path = tmp_path / f"rows{n}.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"row {i} " + " ".join(f"w{i}x{j}" for j in range(words))}) + "\n"
                            for i in range(n)))
    return path


def spec(path: Path) -> WorkloadSpec:
    return WorkloadSpec(input_tokens=128, output_tokens=8, prompt_source=str(path))


# ---- the order of rows ----------------------------------------------------------------------
def test_rows_go_on_through_one_seeded_order_and_a_warm_up_takes_them_from_its_end(tmp_path: Path) -> None:
    path = rows_file(tmp_path, 10)
    first = Workload(spec(path), seed=1, order_seed=7)
    rows = [first.row_of(i) for i in range(10)]
    assert sorted(rows) == list(range(10)) and rows != list(range(10))  # a permutation, shuffled
    # another trial's seed does not change the order; its offset goes on through it
    later = Workload(spec(path), seed=99, order_seed=7, rows_from=4)
    assert [later.row_of(i) for i in range(6)] == rows[4:]
    assert later.body(0)["prompt"] == first.body(4)["prompt"]
    lanes = [Workload(spec(path), seed=s, order_seed=7, rows_from=2, lane=j, lanes=3) for s, j in ((4, 0), (5, 2))]
    assert [lanes[0].row_of(i) for i in range(3)] == [rows[2], rows[5], rows[8]]  # lanes of one stretch ...
    assert [lanes[1].row_of(i) for i in range(2)] == [rows[4], rows[7]]  # ... share no row
    warm = Workload(spec(path), seed=5, order_seed=7, backward=True)
    assert [warm.row_of(i) for i in range(3)] == rows[::-1][:3]
    assert Workload(spec(path), seed=1, order_seed=8).row_of(0) is not None
    assert [Workload(spec(path), seed=1, order_seed=8).row_of(i) for i in range(10)] != rows
    assert Workload(WorkloadSpec(input_tokens=8, output_tokens=8), seed=1).row_of(0) is None


def test_the_ledger_counts_a_row_sent_twice_to_one_server(tmp_path: Path) -> None:
    path = rows_file(tmp_path, 6)
    ledger = RowLedger()
    warm = Workload(spec(path), seed=1, backward=True)
    assert ledger.record(warm, range(2)).repeats == 0  # the order's last two rows
    use = ledger.record(Workload(spec(path), seed=2, rows_from=ledger.reach), range(4))
    assert (use.first, use.sent, use.repeats, ledger.reach) == (0, 4, 0, 4)
    use = ledger.record(Workload(spec(path), seed=3, rows_from=ledger.reach), range(3))
    # places 4 and 5 are the warm-up's rows; place 6 wraps to the first row again
    assert (use.first, use.sent, use.repeats, ledger.reach) == (4, 3, 3, 7)
    assert "3 of the 3 requests re-sent a row" in use.said()
    assert RowLedger.continuing(4, warm).sent == {warm.row_at(p) for p in range(4)}


# ---- the simulator's prefix cache ---------------------------------------------------------------
def test_prefix_cache_blocks_chain_and_the_least_recently_freed_go_first() -> None:
    cache = PrefixCache(block_size=4, ids_per_block=4)
    a = cache.hashes(list(range(12)))
    b = cache.hashes([*range(8), 99, 98, 97, 96])
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert cache.hashes([1, *range(1, 12)])[1] != a[1]  # a block's hash covers every token before it
    cache.add(a)
    assert cache.cached(a, 12) == 2  # the block holding the last token is computed again
    assert cache.cached(b, 13) == 2
    assert cache.release(a) == 3 and list(cache.free) == a
    assert cache.take(a[:1]) == 1 and cache.release(a[:1]) == 1
    cache.evict(2)
    assert list(cache.free) == [a[0]]  # a[1], a[2] were freed before a[0] was freed again
    assert cache.reset() is True and not cache.free


async def _post(url: str, body: dict) -> dict:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return await r.json()


async def _counters(port: int) -> tuple[float, float]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        m = parse_prometheus(await r.text())
    key = next(k for k in m if k.startswith("vllm:prefix_cache_queries_total"))
    return m[key], m[key.replace("queries", "hits")]


def _prompt(tag: str, words: int = 300) -> str:
    return " ".join(f"{tag}{j}" for j in range(words))


@pytest.mark.parametrize("caching", [True, False])
def test_a_prompt_sent_again_is_served_from_the_simulators_cache(caching: bool) -> None:
    async def go() -> tuple[list[tuple[float, float]], int]:
        argv = SIM + ([] if caching else ["--no-enable-prefix-caching"])
        async with running_sim(argv) as srv:
            url = f"http://127.0.0.1:{srv.port}/v1/completions"
            seen = [await _counters(srv.port)]
            for text in (_prompt("a"), _prompt("a"), _prompt("b")):
                await _post(url, {"prompt": text, "max_tokens": 2})
                seen.append(await _counters(srv.port))
            return seen, srv.cfg.block_size

    seen, bs = asyncio.run(go())
    tokens = 400  # 300 words at 0.75 words a token
    if not caching:
        assert seen[-1] == (0.0, 0.0)  # vLLM counts no lookups with caching off
        return
    steps = [(q1 - q0, h1 - h0) for (q0, h0), (q1, h1) in zip(seen, seen[1:])]
    assert steps[0] == (tokens, 0)
    assert steps[1] == (tokens, (tokens - 1) // bs * bs)  # every full block but the last token's
    assert steps[2] == (tokens, 0)


def test_a_kv_cache_too_small_to_keep_a_prompt_forgets_it() -> None:
    async def go() -> float:
        async with running_sim(SIM, kv_capacity_tokens=1024) as srv:
            url = f"http://127.0.0.1:{srv.port}/v1/completions"
            await _post(url, {"prompt": _prompt("a"), "max_tokens": 2})
            for tag in "bcd":  # 3 x 400 tokens: more than the 1,024 the cache holds
                await _post(url, {"prompt": _prompt(tag), "max_tokens": 2})
            before = (await _counters(srv.port))[1]
            await _post(url, {"prompt": _prompt("a"), "max_tokens": 2})
            return (await _counters(srv.port))[1] - before

    assert asyncio.run(go()) == 0.0


def test_reset_is_refused_while_a_request_runs_and_empties_the_cache_when_idle(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")

    async def go() -> tuple[dict, dict, float]:
        async with running_sim(SIM) as srv:
            base = f"http://127.0.0.1:{srv.port}"
            await _post(base + "/v1/completions", {"prompt": _prompt("a"), "max_tokens": 2})
            running = asyncio.ensure_future(_post(base + "/v1/completions",
                                                  {"prompt": _prompt("z"), "max_tokens": 400}))
            await asyncio.sleep(0.3)
            refused = await _post(base + "/reset_prefix_cache", {})
            await running
            done = await _post(base + "/reset_prefix_cache", {})
            before = (await _counters(srv.port))[1]
            await _post(base + "/v1/completions", {"prompt": _prompt("a"), "max_tokens": 2})
            return refused, done, (await _counters(srv.port))[1] - before

    refused, done, hits = asyncio.run(go())
    assert refused == {"success": False} and done == {"success": True} and hits == 0.0


# ---- `truthput load`, twice on one server ---------------------------------------------------------
def test_a_second_load_on_one_server_sends_new_rows_and_a_third_that_must_resend_is_flagged(tmp_path: Path) -> None:
    path = rows_file(tmp_path, 24)
    store = Store(tmp_path / "t.db")

    async def go() -> list:
        async with running_sim(SIM) as srv:
            o = LoadOptions(url=f"http://127.0.0.1:{srv.port}", concurrency=[4], requests=12, workload=spec(path))
            return [await run_load(o, store) for _ in range(3)]

    runs = asyncio.run(go())
    results = [r.outcomes[0].results for r in runs]
    assert [(r.rows.first, r.rows.sent, r.rows.repeats) for r in results] == [(0, 12, 0), (12, 12, 0), (24, 12, 12)]
    hit = [r.server_samples.prefix_cache_hit_rate.value for r in results]
    assert hit[0] == 0.0 and hit[1] == 0.0 and hit[2] > 0.9
    assert not any(f.code == "workload_repeats" for r in results[:2] for f in r.throughput.counter_window.flags)
    flags = {f.code: f.reason for f in results[2].throughput.counter_window.flags}
    assert "workload_repeats" in flags and "12 of the 12 requests" in flags["workload_repeats"]


# ---- `truthput run`: the arms of a round get the same rows, the next round new ones -------------
def test_a_runs_rounds_go_on_through_the_rows_and_both_arms_of_a_round_send_the_same_rows(tmp_path: Path) -> None:
    from simhelpers import run_experiment
    from truthput.experiment.file import parse_experiment

    path = rows_file(tmp_path, 400)
    text = _ab_text("""
[[variant]]
name = "fewer"
set = { "--max-num-seqs" = 2 }
""", source=str(path)).replace("concurrency = [4]\nrequests = 16\nwarmup_s = 0\n",
                               "concurrency = [2]\nrequests = 6\nwarmup_s = 0.5\n")
    text = text.replace("output_guard = false", "output_guard = false\nrepeats = 2")
    store = Store(tmp_path / "t.db")
    run_id = asyncio.run(run_experiment(parse_experiment(text, "rows.toml"), text, "rows.toml", store,
                                        progress=lambda m: None))
    used = {(t.variant, t.start_index, t.trial_index): t.results.rows for t in store.trial_results(run_id)}
    assert len(used) == 8 and all(u is not None and u.repeats == 0 for u in used.values())
    for arm in ("base", "fewer"):  # each trial its own lane of the round's rows: places 0, 2, 4, ... and 1, 3, 5, ...
        assert [(u.first, u.last) for u in (used[(arm, 0, 0)], used[(arm, 0, 1)])] == [(0, 10), (1, 11)]
    round_two = max(u.reach for (v, s, t), u in used.items() if s == 0)
    assert round_two == 12 and {used[(a, 1, 0)].first for a in ("base", "fewer")} == {round_two}
    hits = [t.results.server_samples.prefix_cache_hit_rate.value for t in store.trial_results(run_id)]
    assert hits and all(h == 0.0 for h in hits)


# ---- the verdict: equal cache state, or it says why not -------------------------------------------
def _ab_text(variants: str, source: str = "shared-prefix") -> str:
    return f"""
[experiment]
name = "cache"
baseline = "base"
seed = 5
[server]
engine = "sim"
command = {json.dumps(["vllm", "serve", "/models/m", "--max-model-len", "8192", "--max-num-seqs", "8"])}
[model]
profile = "llama-3.1-8b"
[hardware]
gpu = "RTX 3090"
[sim]
noise = 0.0
startup_s = 0.0
[[variant]]
name = "base"
{variants}
[workload]
concurrency = [4]
requests = 16
warmup_s = 0
prompt_source = "{source}"
input_tokens = 64
output_tokens = 8
[measure]
starts = 2
sequential = false
output_guard = false
"""


def _inputs(tmp_path: Path, text: str):
    from simhelpers import run_experiment
    from truthput.experiment.file import parse_experiment
    from truthput.store.summary import summary_inputs

    tmp_path.mkdir(parents=True, exist_ok=True)
    store = Store(tmp_path / "t.db")
    run_id = asyncio.run(run_experiment(parse_experiment(text, "c.toml"), text, "c.toml", store,
                                        progress=lambda m: None))
    return summary_inputs(store, run_id)


def _cache_cautions(inputs) -> tuple[dict, dict, list[str]]:
    from truthput.analyze.summary import summary_of

    summary = summary_of(inputs, fresh=True)
    rate = {c.variant: c.prefix_cache_hit_rate()[0] for c in summary.cells}
    said = {c.variant: k.reason for c in summary.verdict.comparisons() for k in c.cautions
            if k.code == "cache_state_differs"}
    assert all("!cache_state_differs (see the notes)" in c.line for c in summary.verdict.comparisons()
               if c.variant in said)
    return rate, said, summary.verdict.notes


def test_an_arm_that_turns_caching_off_is_named_as_part_of_the_effect_else_it_is_a_doubt(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, _ab_text("""
[[variant]]
name = "nocache"
set = { "--enable-prefix-caching" = false }
"""))
    assert inputs.cache_changes == {"nocache": ["--enable-prefix-caching"]}
    rate, said, notes = _cache_cautions(inputs)
    assert rate == {"base": 0.8, "nocache": 0.0}  # 256 shared of 320 prompt tokens; caching off: none
    assert "part of the effect" in said["nocache"] and "--enable-prefix-caching" in said["nocache"]
    assert any(n.startswith("!cache_state_differs") for n in notes)
    # the same hit rates where the variant changed nothing the cache depends on: a doubt
    inputs.cache_changes = {}
    _, said, _ = _cache_cautions(inputs)
    assert "changes nothing the cache depends on" in said["nocache"]
    # either arm the baseline
    inputs.baseline, inputs.cache_changes = "nocache", {"base": ["--enable-prefix-caching"]}
    _, said, _ = _cache_cautions(inputs)
    assert "part of the effect" in said["base"]


def test_unique_prompts_leave_no_cache_state_to_differ(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, _ab_text("""
[[variant]]
name = "nocache"
set = { "--enable-prefix-caching" = false }
""", source="synthetic"))
    rate, said, _ = _cache_cautions(inputs)
    assert rate == {"base": 0.0, "nocache": 0.0} and said == {}


def test_the_cache_state_test_is_the_same_whichever_arm_is_the_baseline() -> None:
    from truthput.analyze.summary import cache_state_differs

    cases = [([0.5], [0.52]), ([0.5], [0.6]), ([0.1, 0.9], [0.5, 0.55]), ([0.40, 0.41], [0.50, 0.51]), ([], [0.9])]
    for a, b in cases:
        assert cache_state_differs(a, b) == cache_state_differs(b, a)
    assert [cache_state_differs(a, b) for a, b in cases] == [False, True, False, True, False]


# ---- the cache policy -------------------------------------------------------------------------------
def test_load_with_cache_reset_starts_every_window_cold_even_on_rows_sent_again(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    path = rows_file(tmp_path, 16)

    async def go():
        async with running_sim(SIM) as srv:
            o = LoadOptions(url=f"http://127.0.0.1:{srv.port}", concurrency=[4, 4, 4], requests=8,
                            workload=spec(path), cache="reset")
            return await run_load(o, Store(tmp_path / "t.db"))

    run = asyncio.run(go())
    results = [o.results for o in run.outcomes]
    assert [r.rows.repeats for r in results] == [0, 0, 8]  # the third level re-sends the first's rows ...
    assert [r.server_samples.prefix_cache_hit_rate.value for r in results] == [0.0, 0.0, 0.0]  # ... to an empty cache
    assert all(r.cache and r.cache.startswith("prefix cache reset") and "checked" in r.cache for r in results)


def test_a_server_without_the_reset_route_fails_the_load_with_one_line(tmp_path: Path, monkeypatch) -> None:
    from truthput.errors import EngineError

    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)

    async def go():
        async with running_sim(SIM) as srv:
            o = LoadOptions(url=f"http://127.0.0.1:{srv.port}", concurrency=[1], requests=2, cache="reset")
            return await run_load(o, None)

    with pytest.raises(EngineError, match="has no /reset_prefix_cache .*VLLM_SERVER_DEV_MODE=1"):
        asyncio.run(go())


@pytest.mark.parametrize("answer", [{"success": False}, {"success": True}])
def test_a_refused_or_an_unkept_reset_is_an_error(answer: dict, monkeypatch) -> None:
    """A FAKE vLLM front (aiohttp, made here): its reset answers `answer` and never empties
    anything, so the probe after it is a hit either way."""
    from aiohttp import web

    from truthput.engines.cache import reset_cache
    from truthput.errors import EngineError

    hits = {"n": 0.0}

    async def completions(request: web.Request) -> web.Response:
        hits["n"] += 192
        return web.json_response({"choices": [{"text": "x"}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=f"# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total {hits['n']}\n")

    async def reset(request: web.Request) -> web.Response:
        return web.json_response(answer)

    async def go() -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/reset_prefix_cache", reset)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return await reset_cache(f"http://127.0.0.1:{port}", "vllm", model="m")
        finally:
            await runner.cleanup()

    monkeypatch.setattr("truthput.engines.cache.RESET_PAUSE_S", 0.01)
    said = "refused to reset" if answer["success"] is False else "the reset did not happen"
    with pytest.raises(EngineError, match=said):
        asyncio.run(go())


def test_a_run_with_cache_reset_empties_the_cache_before_every_window_and_warm_primes_it(tmp_path: Path) -> None:
    text = _ab_text("""
[[variant]]
name = "fewer"
set = { "--max-num-seqs" = 2 }
""").replace('prompt_source = "shared-prefix"', 'prompt_source = "shared-prefix"\ncache = "reset"')
    text = text.replace("starts = 2", "starts = 1")
    inputs = _inputs(tmp_path / "reset", text)
    assert all(t.results.cache and "checked" in t.results.cache for t in inputs.trials)
    cold, _, _ = _cache_cautions(inputs)
    inputs = _inputs(tmp_path / "warm", text.replace('cache = "reset"', 'cache = "warm"'))
    assert all(t.results.cache == "prefix cache primed with the workload's 4 shared texts" for t in inputs.trials)
    warm, _, _ = _cache_cautions(inputs)
    # the window opens once the first request of each prefix is in: 256 of 320 prompt tokens hit either way
    assert cold == warm == {"base": pytest.approx(0.8), "fewer": pytest.approx(0.8)}


def test_plan_says_when_the_file_is_too_short_for_each_row_to_reach_a_server_once(tmp_path: Path) -> None:
    from truthput.experiment.file import parse_experiment
    from truthput.run.plan import build_plan, rows_warnings

    path = rows_file(tmp_path, 24)

    def said(workload: str) -> list[str]:
        text = _ab_text("").replace('prompt_source = "shared-prefix"', f'prompt_source = "{path}"')
        text = text.replace("requests = 16\n", workload + "\n")
        exp = parse_experiment(text, "p.toml")
        return rows_warnings(exp, build_plan(exp))

    assert said("requests = 12") == []  # 1 level x 2 trials x 12 requests: the file's 24 rows a start
    (line,) = said("requests = 13")
    assert "has 24 rows, but each start sends 26 (1 level x 2 trials x 13 requests)" in line
    assert "workload_repeats" in line
    (line,) = said("duration_s = 30")  # 4 streams x 30 s x 2 trials: the file lasts while a request takes >= 10 s
    assert "at least 10.0 s" in line
    assert said("duration_s = 3") == []


def test_a_variant_with_a_kv_cache_too_small_for_the_shared_prefixes_names_it_as_part_of_the_effect(
        tmp_path: Path) -> None:
    """16 shared prefixes of 256 tokens (4,096 tokens to keep) against a KV cache of 80 blocks of 16
    (1,280 tokens): the small cache evicts each prefix before it comes round again."""
    text = _ab_text("""
[[variant]]
name = "small"
set = { "--num-gpu-blocks-override" = 80 }
""").replace('"8192"', '"1024"').replace("requests = 16\n", "requests = 32\nprefixes = 16\n")
    inputs = _inputs(tmp_path, text.replace('gpu = "RTX 3090"', 'gpu = "H100 SXM"'))
    rate, said, _ = _cache_cautions(inputs)
    assert rate["base"] > 0.3 and rate["small"] < 0.1, rate  # each prefix comes round twice: the first misses
    assert "part of the effect" in said["small"] and "--num-gpu-blocks-override" in said["small"]


def test_a_second_load_of_made_up_text_on_one_server_meets_nothing_of_the_first_in_the_cache(tmp_path: Path) -> None:
    """The same options twice (the same --seed): the text truthput makes is other for each load of the
    URL in the store, so the second finds none of the first's prompts cached; without the store
    (nothing known of earlier loads) it is the same text, and the cache serves it."""
    async def go(store):
        async with running_sim(SIM) as srv:
            o = LoadOptions(url=f"http://127.0.0.1:{srv.port}", concurrency=[4], requests=12,
                            workload=WorkloadSpec(input_tokens=256, output_tokens=8))
            return [(await run_load(o, store)).outcomes[0].results.server_samples.prefix_cache_hit_rate.value
                    for _ in range(2)]

    assert asyncio.run(go(Store(tmp_path / "t.db"))) == [0.0, 0.0]
    assert asyncio.run(go(None))[1] > 0.9
