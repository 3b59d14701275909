"""Test helpers: the simulator in-process, and a client that keeps every chunk it streams.

`running_sim(argv, eff=...)` starts a SimServer on a free 127.0.0.1 port inside the caller's
event loop (no start-up delay, no subprocess), so a test can read the engine's exact totals next
to what the HTTP API returned. `stream_request` keeps every chunk, read through truthput's own SSE
parser (`truthput.load.sse`); `parse_prometheus` reads /metrics through truthput's own reader
(`truthput.measure.prom`): the tests and the product read the server the same way.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import orjson

from truthput.load.sse import SSEParser
from truthput.measure.prom import Scrape, parse_scrape
from truthput.sim.flags import parse_serve_args
from truthput.sim.server import SimServer, resolve_setup


@contextlib.asynccontextmanager
async def running_sim(argv: list[str], eff=None, log_out=None,
                      kv_capacity_tokens: int | None = None) -> AsyncIterator[SimServer]:
    """An in-process simulated server; `server.port` is bound, `server.engine` is live.

    kv_capacity_tokens overrides the memory plan's KV capacity (to provoke preemptions).
    """
    cfg = parse_serve_args([*argv, "--port", "0", "--host", "127.0.0.1"])
    setup = resolve_setup(cfg, eff=eff)
    if kv_capacity_tokens is not None:
        setup.kv_capacity_tokens = kv_capacity_tokens
    server = SimServer(cfg, setup, log_out=log_out)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@dataclass
class StreamResult:
    """One streamed request as the client saw it."""

    text: str = ""
    chunks: list[dict] = field(default_factory=list)
    usage: dict | None = None
    finish_reason: str | None = None
    t_start: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    chunk_times: list[float] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        return int(self.usage["completion_tokens"]) if self.usage else -1


async def stream_request(session, base_url: str, body: dict, chat: bool = False) -> StreamResult:
    """POST a streaming request and collect every SSE chunk (include_usage is switched on)."""
    body = {**body, "stream": True}
    body.setdefault("stream_options", {"include_usage": True})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    res = StreamResult(t_start=time.monotonic())
    parts: list[str] = []
    async with session.post(base_url + path, data=orjson.dumps(body),
                            headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        parser = SSEParser()
        done = False
        async for raw in resp.content.iter_any():
            for data in parser.feed(raw):
                if data == b"[DONE]":
                    done = True
                    break
                _take(res, parts, orjson.loads(data), time.monotonic())
            if done:
                break
    res.text = "".join(parts)
    return res


def _take(res: StreamResult, parts: list[str], obj: dict, now: float) -> None:
    """One chunk into the result: its usage (running or final) and its text."""
    res.chunks.append(obj)
    if obj.get("usage"):
        res.usage = obj["usage"]
    for ch in obj.get("choices") or []:
        piece = ch.get("text")
        if piece is None:
            piece = (ch.get("delta") or {}).get("content")
        if piece:
            parts.append(piece)
            res.chunk_times.append(now)
            if res.t_first is None:
                res.t_first = now
            res.t_last = now
        if ch.get("finish_reason"):
            res.finish_reason = ch["finish_reason"]


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name with sorted labels -> value, e.g. 'vllm:generation_tokens_total' (labels dropped
    when the only labels are model_name/engine), from truthput's own /metrics reader."""
    parsed = parse_scrape(Scrape("test", 0.0, text))
    if parsed.error:
        raise ValueError(parsed.error)
    out: dict[str, float] = {}
    for name, samples in parsed.samples.items():
        for labels, value in samples:
            kept = {k: v for k, v in labels.items() if k not in ("model_name", "engine")}
            key = name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(kept.items())) + "}" if kept else "")
            out[key] = value
    return out


def free_port() -> int:
    """A port nothing listens on now (the OS's pick)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, timeout_s: float = 30.0) -> None:
    """Until something accepts TCP connections on 127.0.0.1:port (a server started as a subprocess)."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)


async def run_experiment(exp, exp_text, exp_path, store, engine=None, progress=None, **kw):  # type: ignore[no-untyped-def]
    """Run (or resume) an experiment as `truthput run` does, without its files; its run id."""
    from truthput.run.loop import execute

    return (await execute(exp, exp_text, exp_path, store, engine=engine, progress=progress, **kw)).run_id


def flagged_figures(results):  # type: ignore[no-untyped-def]
    """Every flagged figure of a trial's results with its path."""
    from pydantic import BaseModel

    from truthput.measure.model import Figure

    out = []

    def walk(obj, path):  # type: ignore[no-untyped-def]
        if isinstance(obj, Figure):
            if obj.flags:
                out.append((path, obj))
        elif isinstance(obj, BaseModel):
            for name in type(obj).model_fields:
                walk(getattr(obj, name), f"{path}.{name}" if path else name)

    walk(results, "")
    return out
