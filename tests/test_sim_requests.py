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
