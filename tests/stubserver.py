"""A lean OpenAI-compatible streaming stub for load-client tests (a fake, named as such).

Why a stub and not the simulator: the tests need exact control over the wire format (tokens per
chunk, CRLF, keep-alive comments, role-only first chunk, empty deltas, rejected stream options,
a stream cut mid-way) and known truth (every request emits exactly `max_tokens` tokens, each token
is the text " t<k>"). It records the maximum number of concurrently open streams.

In-process: `server = await StubServer(StubConfig(...)).start()`; `server.url`; `await server.stop()`.
Out of process (so client CPU can be measured alone): `python tests/stubserver.py --port P ...`;
GET /stats returns the counters as JSON; GET /journal each request as (received, answered, body).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web


@dataclass
class StubConfig:
    tokens_per_chunk: int = 1
    token_delay_s: float = 0.0  # pacing per token (a chunk of k tokens waits k * delay)
    continuous_usage: str = "on"  # "on": honour the option; "off": ignore it; "reject": HTTP 400;
    # "none": no usage at all, not even the final one (servers that ignore stream_options)
    fail_after_tokens: int | None = None  # cut the connection after this many tokens
    keepalive_every: int = 0  # emit ": keep-alive" comment every k chunks
    crlf: bool = False
    role_first_chunk: bool = True  # chat: first chunk carries only {"role": "assistant"}
    empty_deltas: bool = False  # chat: an empty-content chunk after each content chunk
    no_space: bool = False  # "data:{...}" instead of "data: {...}"
    split_writes: int = 0  # write each event in pieces of this many bytes (0: whole)
    prefill_delay_s: float = 0.0
    model: str = "stub-model"
    send_done: bool = True
    huge_event_bytes: int = 0  # hostile: the second chunk's text is this many bytes (one SSE event)
    serve_metrics: bool = False  # a /metrics with vllm:generation_tokens_total (tokens sent)
    metrics_junk_bytes: int = 0  # hostile: /metrics carries one comment line this long
    metrics_without_counter: bool = False  # /metrics serves other series only (no token counter)


@dataclass
class StubStats:
    requests: int = 0
    active: int = 0
    max_active: int = 0
    tokens_sent: int = 0
    rejected: int = 0


class StubServer:
    def __init__(self, cfg: StubConfig | None = None, port: int = 0) -> None:
        self.cfg = cfg or StubConfig()
        self.stats = StubStats()
        self.port = port
        self.active_samples: list[int] = []  # `active` at each request start (after increment)
        self.timeline: list[tuple[float, int]] = []  # (time.monotonic(), active) at every change
        self.journal: list[tuple[float, float, dict[str, Any]]] = []  # (received, answered, body) per request
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/stats", self._stats)
        app.router.add_get("/journal", self._journal)
        if self.cfg.serve_metrics:
            app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def start(self) -> StubServer:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, _req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.cfg.model, "object": "model"}]})

    async def _stats(self, _req: web.Request) -> web.Response:
        return web.json_response(asdict(self.stats))

    async def _journal(self, _req: web.Request) -> web.Response:
        return web.json_response(self.journal)

    async def _metrics(self, _req: web.Request) -> web.Response:
        text = ("# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
                "# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{model_name="{self.cfg.model}"}} {float(self.stats.tokens_sent)}\n')
        if self.cfg.metrics_without_counter:
            text = ("# HELP process_cpu_seconds_total Total user and system CPU time.\n"
                    "# TYPE process_cpu_seconds_total counter\n"
                    f"process_cpu_seconds_total {time.process_time():.3f}\n")
        if self.cfg.metrics_junk_bytes:
            text += "# " + "x" * self.cfg.metrics_junk_bytes + "\n"
        return web.Response(text=text, content_type="text/plain")

    async def _completions(self, req: web.Request) -> web.StreamResponse:
        return await self._serve(req, chat=False)

    async def _chat(self, req: web.Request) -> web.StreamResponse:
        return await self._serve(req, chat=True)

    async def _serve(self, req: web.Request, chat: bool) -> web.StreamResponse:
        cfg = self.cfg
        body = await req.json()
        opts = body.get("stream_options") or {}
        if opts.get("continuous_usage_stats") and cfg.continuous_usage == "reject":
            self.stats.rejected += 1
            return web.json_response(
                {"error": {"message": "stream_options.continuous_usage_stats: extra inputs are not permitted",
                           "type": "BadRequestError"}},
                status=400,
            )
        max_tokens = int(body.get("max_tokens", 16))
        if chat:
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        else:
            prompt_tokens = len(str(body.get("prompt", "")).split())
        running = bool(opts.get("continuous_usage_stats")) and cfg.continuous_usage == "on"
        include_usage = bool(opts.get("include_usage")) and cfg.continuous_usage != "none"
        self.stats.requests += 1
        t_received = time.monotonic()
        self.stats.active += 1
        self.stats.max_active = max(self.stats.max_active, self.stats.active)
        self.active_samples.append(self.stats.active)
        self.timeline.append((time.monotonic(), self.stats.active))
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(req)
            nl = b"\r\n" if cfg.crlf else b"\n"
            prefix = b"data:" if cfg.no_space else b"data: "
            obj_id = f"cmpl-{self.stats.requests}"
            kind = "chat.completion.chunk" if chat else "text_completion"

            async def send(obj: object) -> None:
                raw = prefix + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + nl + nl
                if cfg.split_writes > 0:
                    for k in range(0, len(raw), cfg.split_writes):
                        await resp.write(raw[k : k + cfg.split_writes])
                else:
                    await resp.write(raw)

            def usage(done: int) -> dict:
                return {"prompt_tokens": prompt_tokens, "completion_tokens": done,
                        "total_tokens": prompt_tokens + done}

            if cfg.prefill_delay_s:
                await asyncio.sleep(cfg.prefill_delay_s)
            if chat and cfg.role_first_chunk:
                first = {"id": obj_id, "object": kind, "model": cfg.model,
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
                if running:
                    first["usage"] = usage(0)
                await send(first)
            done = 0
            chunk_no = 0
            while done < max_tokens:
                k = min(cfg.tokens_per_chunk, max_tokens - done)
                if cfg.token_delay_s:
                    await asyncio.sleep(cfg.token_delay_s * k)
                if cfg.fail_after_tokens is not None and done + k > cfg.fail_after_tokens:
                    # Abort mid-stream: the client sees a connection reset / payload error.
                    assert req.transport is not None
                    req.transport.close()
                    return resp
                text = "".join(f" t{done + j}" for j in range(k))
                if cfg.huge_event_bytes and chunk_no == 1:
                    text = "y" * cfg.huge_event_bytes
                done += k
                self.stats.tokens_sent += k
                fr = "length" if done >= max_tokens else None
                if chat:
                    choice = {"index": 0, "delta": {"content": text}, "finish_reason": fr}
                else:
                    choice = {"index": 0, "text": text, "finish_reason": fr}
                chunk = {"id": obj_id, "object": kind, "model": cfg.model, "choices": [choice]}
                if running:
                    chunk["usage"] = usage(done)
                await send(chunk)
                chunk_no += 1
                if chat and cfg.empty_deltas:
                    empty = {"id": obj_id, "object": kind, "model": cfg.model,
                             "choices": [{"index": 0, "delta": {}, "finish_reason": None}]}
                    if running:
                        empty["usage"] = usage(done)
                    await send(empty)
                if cfg.keepalive_every and chunk_no % cfg.keepalive_every == 0:
                    await resp.write(b": keep-alive" + nl + nl)
            if include_usage:
                await send({"id": obj_id, "object": kind, "model": cfg.model, "choices": [], "usage": usage(done)})
            if cfg.send_done:
                await send(b"[DONE]")
            await resp.write_eof()
            return resp
        finally:
            self.stats.active -= 1
            self.timeline.append((time.monotonic(), self.stats.active))
            self.journal.append((t_received, time.monotonic(), body))


def main() -> None:
    ap = argparse.ArgumentParser(description="truthput streaming stub (fake OpenAI server for tests)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--token-delay-s", type=float, default=0.0)
    ap.add_argument("--continuous-usage", default="on", choices=["on", "off", "reject", "none"])
    ap.add_argument("--metrics", action="store_true", help="serve /metrics")
    ap.add_argument("--huge-event-bytes", type=int, default=0)
    ap.add_argument("--metrics-junk-bytes", type=int, default=0)
    ap.add_argument("--metrics-without-counter", action="store_true")
    ap.add_argument("--prefill-delay-s", type=float, default=0.0)
    args = ap.parse_args()
    cfg = StubConfig(tokens_per_chunk=args.tokens_per_chunk, token_delay_s=args.token_delay_s,
                     continuous_usage=args.continuous_usage, serve_metrics=args.metrics,
                     huge_event_bytes=args.huge_event_bytes, metrics_junk_bytes=args.metrics_junk_bytes,
                     metrics_without_counter=args.metrics_without_counter, prefill_delay_s=args.prefill_delay_s)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    web.run_app(StubServer(cfg, args.port).app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
