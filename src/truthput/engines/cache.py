"""The server's prefix cache between windows: reset it (checked), or prime it with what the
workload shares (`[workload] cache`, `truthput load --cache`).

A reset is checked, never taken on the engine's word: a short probe prompt is sent before the reset
and again after it, and the second must find nothing of the first in the cache (vLLM: its
prefix-cache hit counter does not move; llama.cpp: the response's `timings.cache_n` is 0). vLLM
answers a refused reset with HTTP 200 `{"success": false}` (while requests hold blocks), and serves
the route only with `VLLM_SERVER_DEV_MODE=1` (truthput sets it on the servers it starts).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from truthput.errors import EngineError

CACHE_POLICIES = ("as-is", "warm", "reset")
"""as-is: each start is a fresh server, cold, then whatever the workload shares; warm: the
workload's shared text sent once before every window; reset: the cache emptied (and checked)
before every window."""

RESET_TRIES = 5
RESET_PAUSE_S = 0.5
"""A refused reset is asked again this many times, this far apart (requests aborted at the end of a
warm-up still hold their blocks for a moment), before it is an error."""

DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
"""What a vLLM server needs in its environment to serve /reset_prefix_cache."""

PROBE = "truthput cache probe: " + " ".join(f"{w}{i % 7}" for i, w in enumerate(
    ("amber basin cedar delta ember fjord garnet harbor island juniper kestrel lagoon meadow nectar "
     "orchid pebble quartz raven saffron tundra umber violet willow xenon yarrow zephyr " * 6).split()))
"""A prompt no workload sends (some 200 tokens: several cache blocks at any block size)."""


async def _json(session: Any, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    import aiohttp

    try:
        async with session.request(method, url, **kw) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = None
            return resp.status, body
    except aiohttp.ClientError as exc:
        raise EngineError(f"{method} {url}: {exc.__class__.__name__} {exc}".strip()) from None


async def _model(session: Any, base_url: str, model: str | None) -> str | None:
    if model:
        return model
    status, body = await _json(session, "GET", base_url + "/v1/models")
    data = body.get("data") if status == 200 and isinstance(body, dict) else None
    return str(data[0]["id"]) if data else None


async def _probe(session: Any, base_url: str, model: str | None) -> Any:
    body: dict[str, Any] = {"prompt": PROBE, "max_tokens": 1, "temperature": 0.0}
    if model:
        body["model"] = model
    status, answer = await _json(session, "POST", base_url + "/v1/completions", json=body)
    if status != 200:
        raise EngineError(f"the cache probe (POST {base_url}/v1/completions) answered HTTP {status}: "
                          f"{str(answer)[:200]}")
    return answer


async def _hits(session: Any, base_url: str, names: Sequence[str]) -> float | None:
    """The server's prefix-cache hit counter (the first of `names` it has), None if unreadable."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(base_url + "/metrics") as resp:
        text = await resp.text() if resp.status == 200 else None
    if text is None:
        return None
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return next((totals[n] for n in names if n in totals), None)


async def reset_cache(base_url: str, family: str, model: str | None = None,
                      hit_names: Sequence[str] = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")) -> str:
    """Empty the server's prefix cache and check that it is empty; one sentence of what was done.
    Raises EngineError (one line) where the server refuses, has no reset, or kept the probe."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        model = await _model(session, base_url, model)
        await _probe(session, base_url, model)
        if family == "llamacpp":
            said = await _erase_slots(session, base_url)
        elif family == "sglang":
            status, body = await _json(session, "POST", base_url + "/flush_cache")
            if status != 200:
                raise EngineError(f"cache = \"reset\": POST {base_url}/flush_cache answered HTTP {status}")
            said = "SGLang's /flush_cache"
        else:
            for attempt in range(RESET_TRIES):  # refused while requests still hold blocks: they may be ending
                if attempt:
                    await asyncio.sleep(RESET_PAUSE_S)
                status, body = await _json(session, "POST", base_url + "/reset_prefix_cache")
                if status != 200 or (isinstance(body, dict) and body.get("success") is True):
                    break
            if status == 404:
                raise EngineError(f"cache = \"reset\": {base_url} has no /reset_prefix_cache (vLLM serves it only with "
                                  "VLLM_SERVER_DEV_MODE=1 in the server's environment)")
            if status != 200 or not (isinstance(body, dict) and body.get("success") is True):
                raise EngineError(f"cache = \"reset\": the server refused to reset its prefix cache (POST "
                                  f"{base_url}/reset_prefix_cache answered HTTP {status} {body}): blocks still held after {RESET_TRIES} tries")
            said = "vLLM's /reset_prefix_cache"
        before = await _hits(session, base_url, hit_names) if family != "llamacpp" else None
        answer = await _probe(session, base_url, model)
        if family == "llamacpp":
            kept = (answer.get("timings") or {}).get("cache_n") if isinstance(answer, dict) else None
        else:
            after = await _hits(session, base_url, hit_names)
            kept = None if before is None or after is None else after - before
        if kept:
            raise EngineError(f"cache = \"reset\": {said} answered success, but {kept:g} tokens of a prompt sent just "
                              "before it were still served from the cache: the reset did not happen")
        how = "checked: a probe sent before it found nothing cached after it" if kept is not None else \
            "not checked: the server counts no cache hits"
        return f"prefix cache reset ({said}; {how})"


async def _erase_slots(session: Any, base_url: str) -> str:
    status, slots = await _json(session, "GET", base_url + "/slots")
    if status != 200 or not isinstance(slots, list):
        raise EngineError(f"cache = \"reset\": GET {base_url}/slots answered HTTP {status} (llama-server needs "
                          "--slots to list its slots)")
    for slot in slots:
        sid = slot.get("id") if isinstance(slot, dict) else None
        status, body = await _json(session, "POST", f"{base_url}/slots/{sid}?action=erase")
        if status == 501:
            raise EngineError(f"cache = \"reset\": {base_url} erases its slots only when started with "
                              "--slot-save-path DIR: add it to the server's command")
        if status != 200:
            raise EngineError(f"cache = \"reset\": POST {base_url}/slots/{sid}?action=erase answered HTTP {status}: "
                              f"{str(body)[:200]}")
    return f"llama-server's slot erase, {len(slots)} slots"


async def prime_cache(base_url: str, texts: Sequence[str], model: str | None = None) -> str:
    """Send each of the workload's shared texts once (one token each), so the window starts warm."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        model = await _model(session, base_url, model)
        for text in texts:
            body: dict[str, Any] = {"prompt": text, "max_tokens": 1, "temperature": 0.0}
            if model:
                body["model"] = model
            status, answer = await _json(session, "POST", base_url + "/v1/completions", json=body)
            if status != 200:
                raise EngineError(f"cache = \"warm\": priming answered HTTP {status}: {str(answer)[:200]}")
    return f"prefix cache primed with the workload's {len(texts)} shared texts"
