"""Request features the simulator serves as vLLM does, checked against what the request fixes:
stop strings cut the text, n and prompt lists give that many choices, tool calls and JSON modes
give valid JSON, echo repeats the prompt (the simulator in-process, real HTTP)."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from truthput.hardware.physics import Efficiency
from simhelpers import running_sim

FAST = Efficiency(bw_frac=40.0, flops_frac=40.0, step_overhead_s=0.0002, tp_latency_s=0.0)
BASE = ["--sim-gpu", "H100", "--sim-model", "llama-3.1-8b", "--max-model-len", "4096"]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}


async def _post(url: str, path: str, body: dict) -> tuple[int, object]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + path, json=body) as r:
            if r.content_type == "text/event-stream":
                events = []
                async for line in r.content:
                    text = line.decode().strip()
                    if text.startswith("data: ") and text != "data: [DONE]":
                        events.append(json.loads(text[6:]))
                return r.status, events
            return r.status, await r.json()


def _with_sim(argv, fn):
    async def go():
        async with running_sim([*BASE, *argv], eff=FAST) as server:
            return await fn(f"http://127.0.0.1:{server.port}")
    return asyncio.run(go())


def test_a_stop_string_cuts_the_text_in_whole_and_streamed_answers():
    async def fn(url):
        # find a word the greedy output contains, then stop on it
        _, free = await _post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 40, "temperature": 0,
                                                       "ignore_eos": True})
        text = free["choices"][0]["text"]
        word = text.split()[3]
        _, cut = await _post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 40, "temperature": 0,
                                                      "stop": [word]})
        _, events = await _post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 40, "temperature": 0,
                                                         "stop": word, "stream": True,
                                                         "stream_options": {"include_usage": True}})
        return text, word, cut, events

    text, word, cut, events = _with_sim([], fn)
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == word
    assert choice["text"] == text[:text.index(word)]
    assert cut["usage"]["completion_tokens"] < 40
    streamed = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert streamed == choice["text"] and word not in streamed
    assert events[-1]["usage"]["completion_tokens"] == cut["usage"]["completion_tokens"]


def test_n_and_prompt_lists_give_one_choice_each_and_usage_adds_up():
    async def fn(url):
        a = await _post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 5, "n": 3, "temperature": 1,
                                                 "ignore_eos": True})
        b = await _post(url, "/v1/completions", {"prompt": ["hello", "a longer second prompt"], "max_tokens": 4,
                                                 "temperature": 0, "ignore_eos": True})
        c = await _post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 5, "n": 2, "temperature": 0})
        return a, b, c

    (sa, a), (sb, b), (sc, c) = _with_sim([], fn)
    assert sa == 200 and [x["index"] for x in a["choices"]] == [0, 1, 2]
    assert a["usage"]["completion_tokens"] == 15
    assert sb == 200 and len(b["choices"]) == 2 and b["usage"]["completion_tokens"] == 8
    assert sc == 400 and "greedy" in c["error"]["message"]


def test_tool_calls_and_json_modes_give_valid_json():
    async def fn(url):
        named = {"messages": [{"role": "user", "content": "weather?"}], "max_tokens": 64, "tools": [TOOL],
                 "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
        whole = await _post(url, "/v1/chat/completions", named)
        stream = await _post(url, "/v1/chat/completions", {**named, "stream": True})
        schema = await _post(url, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 64,
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": TOOL["function"]["parameters"]}}})
        return whole, stream, schema

    (s1, whole), (s2, events), (s3, schema) = _with_sim(["--tool-call-parser", "hermes"], fn)
    assert s1 == 200 and whole["choices"][0]["finish_reason"] == "tool_calls"
    call = whole["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city", "days"}
    deltas = [c for e in events for ch in e["choices"] for c in ch["delta"].get("tool_calls") or []]
    assert deltas[0]["function"]["name"] == "get_weather" and deltas[0]["id"].startswith("chatcmpl-tool-")
    assert json.loads("".join(d["function"]["arguments"] for d in deltas)) == json.loads(call["function"]["arguments"])
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert s3 == 200 and set(json.loads(schema["choices"][0]["message"]["content"])) == {"city", "days"}


def test_tools_without_a_parser_are_refused_as_vllm_refuses_them():
    async def fn(url):
        return await _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                         "tools": [TOOL], "tool_choice": "required"})

    status, body = _with_sim([], fn)
    assert status == 400 and body["error"]["message"] == 'tool_choice="required" requires --tool-call-parser to be set'


def test_the_added_metric_families_count_what_was_served():
    """After one request with known counts: tokens per step add up to prompt + output, the request
    parameters are observed once, and the physics model's estimates grew."""
    from simhelpers import parse_prometheus

    async def fn(url):
        _, out = await _post(url, "/v1/completions", {"prompt": "hello there", "max_tokens": 12, "ignore_eos": True,
                                                      "temperature": 0})
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/metrics") as r:
                return out, await r.text()

    out, text = _with_sim([], fn)
    m = parse_prometheus(text)
    usage = out["usage"]
    assert m["vllm:iteration_tokens_total_sum"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert m["vllm:request_params_max_tokens_count"] == 1 and m["vllm:request_params_max_tokens_sum"] == 12
    assert m["vllm:request_params_n_sum"] == 1
    assert m["vllm:prompt_tokens_by_source_total{source=local_compute}"] == usage["prompt_tokens"]
    assert m["vllm:request_inference_time_seconds_count"] == 1
    assert m["vllm:estimated_flops_per_gpu_total"] > 0 and m["vllm:estimated_read_bytes_per_gpu_total"] > 0


def test_under_load_tokens_leave_merged_into_fewer_chunks_and_every_count_stays_exact():
    """vLLM's API server writes one chunk at a time; when a step's outputs take it longer than the
    step, a stream's tokens leave together (real vLLM 0.32 on CPU: 16 tokens in 8 chunks). The
    simulator models that front end: one stream gets a token per chunk, 64 at once get fewer
    chunks than tokens, and the running usage on each chunk still counts every token; with the
    front end's cost at 0 fewer chunks carry several."""
    async def load(url: str, c: int) -> tuple[int, int, bool]:
        body = {"prompt": "hello", "max_tokens": 48, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        results = await asyncio.gather(*[_post(url, "/v1/completions", body) for _ in range(c)])
        chunks = tokens = 0
        steps_ok = True
        for status, events in results:
            assert status == 200
            seen = [e["usage"]["completion_tokens"] for e in events if e.get("choices")]
            chunks += len(seen)
            tokens += events[-1]["usage"]["completion_tokens"]
            steps_ok &= seen == sorted(seen) and seen[-1] == 48
        return chunks, tokens, steps_ok

    async def fn(url):
        return await load(url, 1), await load(url, 64)

    one, many = _with_sim(["--sim-frontend-chunk-us", "200"], fn)
    assert one[1:] == (48, True)
    chunks, tokens, exact = many
    assert tokens == 64 * 48 and exact
    assert chunks < 0.95 * tokens, (chunks, tokens)
    # without the modelled front end only the host's own delays merge tokens (none on a quiet host)
    _, off = _with_sim(["--sim-frontend-chunk-us", "0"], fn)
    assert off[1:] == (64 * 48, True) and off[0] > chunks, (off, chunks)


def test_served_names_access_lines_and_the_tool_parser_counter_are_vllms():
    """Only the served names are models (the path is not, once --served-model-name is given); one
    uvicorn access line per request; vllm:tool_call_parser_invocations exists with a parser."""
    import io

    from truthput.sim.flags import parse_serve_args
    from truthput.sim.server import SimServer, resolve_setup

    async def go():
        out = io.StringIO()
        cfg = parse_serve_args(["/models/x", "--served-model-name", "a", "b", *BASE, "--port", "0", "--host",
                                "127.0.0.1", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"])
        server = SimServer(cfg, resolve_setup(cfg, eff=FAST), log_out=out)
        await server.start()
        try:
            url = f"http://127.0.0.1:{server.port}"
            codes = [(await _post(url, "/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 2}))[0]
                     for m in ("a", "b", "/models/x")]
            status, _ = await _post(url, "/v1/chat/completions", {
                "model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "tools": [TOOL], "tool_choice": "auto"})
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/metrics") as r:
                    metrics = await r.text()
        finally:
            await server.stop()
        return codes, status, out.getvalue(), metrics

    codes, auto_status, log, metrics = asyncio.run(go())
    assert codes == [200, 200, 404]
    assert auto_status == 200  # "auto" with both flags set is allowed
    lines = [ln for ln in log.splitlines() if ln.startswith("INFO:     127.0.0.1:")]
    assert sum('"POST /v1/completions HTTP/1.1" 200 OK' in ln for ln in lines) == 2
    assert sum('"POST /v1/completions HTTP/1.1" 404 Not Found' in ln for ln in lines) == 1
    calls = [ln for ln in metrics.splitlines() if ln.startswith("vllm:tool_call_parser_invocations_total{")]
    assert len(calls) == 12
    assert any('mode="non_streaming"' in ln and 'request_type="chat_completions"' in ln and not ln.endswith(" 0.0")
               for ln in calls), calls
