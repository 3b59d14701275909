"""A lean, fast OpenAI-compatible streaming server for client-overhead benchmarks and load tests.

A FAKE engine, named as such: it generates no text, only " t<k>" tokens, as cheaply as possible,
so that a client's CPU cost is what a benchmark measures. Why hand-written on asyncio.Protocol
(not aiohttp): the server shares the machine with the client under test; every microsecond it
spends per chunk is a microsecond of noise (and of stolen CPU) in the client's figures.

Behaviour, like a batching engine: one decode loop; each step emits one chunk of
`--tokens-per-chunk` tokens to every active stream, then sleeps `--token-delay-ms` x tokens per
chunk (0: just yields, so streams interleave and each chunk is its own network write). Exactly
`max_tokens` tokens per request (EOS is never sampled: `ignore_eos` is implied). Honours
`stream_options.include_usage` (final usage chunk) and `continuous_usage_stats` (usage in every
chunk). `/metrics` exposes vLLM's names (`vllm:generation_tokens_total`, `vllm:prompt_tokens_total`,
`vllm:request_success_total`, `vllm:num_requests_running`) as exact counters; `/stats` the same as
JSON; `/v1/models`, `/health`. Prompt tokens are counted as whitespace words (a fake count).

    python benchmarks/leanstub.py --port 8123 [--tokens-per-chunk 3] [--token-delay-ms 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

try:
    import orjson

    _loads = orjson.loads
    _dumps = orjson.dumps
except ImportError:  # the stub also runs under a bare Python
    _loads = json.loads

    def _dumps(obj: object) -> bytes:  # type: ignore[misc]
        return json.dumps(obj, separators=(",", ":")).encode()


class Stats:
    def __init__(self) -> None:
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.requests_ok = 0
        self.running = 0
        self.requests = 0
        self.created = time.time()

    def metrics(self, model: str) -> bytes:
        lab = f'{{model_name="{model}",engine="0"}}'
        lines = [
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{lab} {float(self.generation_tokens)}",
            f"vllm:generation_tokens_created{lab} {self.created}",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{lab} {float(self.prompt_tokens)}",
            f"vllm:prompt_tokens_created{lab} {self.created}",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{model_name="{model}",engine="0",finished_reason="length"}} {float(self.requests_ok)}',
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{lab} {float(self.running)}",
            "",
        ]
        return "\n".join(lines).encode()


class Stream:
    """One streaming response in progress."""

    __slots__ = ("proto", "chat", "max_tokens", "done", "prompt_tokens", "usage_each", "usage_final", "head", "n")

    def __init__(self, proto: "Conn", chat: bool, max_tokens: int, prompt_tokens: int, usage_each: bool,
                 usage_final: bool, n: int, model: str) -> None:
        self.proto, self.chat, self.max_tokens = proto, chat, max_tokens
        self.done, self.prompt_tokens = 0, prompt_tokens
        self.usage_each, self.usage_final, self.n = usage_each, usage_final, n
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.head = (f'{{"id":"cmpl-{n}","object":"{kind}","created":0,"model":"{model}","choices":[{{"index":0,').encode()


class Engine:
    def __init__(self, tokens_per_chunk: int, token_delay_s: float, model: str) -> None:
        self.tpc = tokens_per_chunk
        self.delay = token_delay_s
        self.model = model
        self.stats = Stats()
        self.active: list[Stream] = []
        self.wake = asyncio.Event()

    def add(self, s: Stream) -> None:
        self.stats.requests += 1
        self.stats.running += 1
        self.stats.prompt_tokens += s.prompt_tokens
        if s.chat:  # role-only first chunk, like vLLM
            self._write(s, s.head + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
                        + (self._usage(s) if s.usage_each else b"") + b"}")
        self.active.append(s)
        self.wake.set()

    def _usage(self, s: Stream) -> bytes:
        return (b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}'
                % (s.prompt_tokens, s.prompt_tokens + s.done, s.done))

    @staticmethod
    def _write(s: Stream, payload: bytes) -> None:
        data = b"data: " + payload + b"\n\n"
        s.proto.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _step(self, s: Stream) -> bool:
        """Emit one chunk; True when the stream is finished."""
        k = min(self.tpc, s.max_tokens - s.done)
        text = "".join(f" t{s.done + j}" for j in range(k)).encode()
        s.done += k
        self.stats.generation_tokens += k
        last = s.done >= s.max_tokens
        fr = b'"length"' if last else b"null"
        if s.chat:
            body = s.head + b'"delta":{"content":"' + text + b'"},"logprobs":null,"finish_reason":' + fr + b"}]"
        else:
            body = s.head + b'"text":"' + text + b'","logprobs":null,"finish_reason":' + fr + b"}]"
        if s.usage_each:
            body += self._usage(s)
        self._write(s, body + b"}")
        if last:
            if s.usage_final:
                kind = b"chat.completion.chunk" if s.chat else b"text_completion"
                self._write(s, b'{"id":"cmpl-%d","object":"%s","created":0,"model":"%s","choices":[]%s}'
                            % (s.n, kind, self.model.encode(), self._usage(s)))
            self._write(s, b"[DONE]")
            s.proto.transport.write(b"0\r\n\r\n")
            self.stats.running -= 1
            self.stats.requests_ok += 1
            s.proto.stream_done()
        return last

    async def run(self) -> None:
        while True:
            if not self.active:
                self.wake.clear()
                await self.wake.wait()
            keep = []
            for s in self.active:
                if s.proto.transport.is_closing():
                    self.stats.running -= 1
                    continue
                if not self._step(s):
                    keep.append(s)
            self.active = keep
            await asyncio.sleep(self.delay * self.tpc)


class Conn(asyncio.Protocol):
    """HTTP/1.1 with keep-alive; one request at a time per connection."""

    engine: Engine

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buf = b""
        self.busy = False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._maybe_request()

    def _maybe_request(self) -> None:
        if self.busy:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1")
        lines = head.split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v.strip())
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4: end + 4 + length]
        self.buf = self.buf[end + 4 + length:]
        self.handle(method, path.split("?", 1)[0], body)

    def respond(self, status: str, ctype: str, payload: bytes) -> None:
        self.transport.write(
            b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (status.encode(), ctype.encode(), len(payload), payload))
        self._maybe_request()

    def stream_done(self) -> None:
        self.busy = False
        self._maybe_request()

    def handle(self, method: str, path: str, body: bytes) -> None:
        eng = self.engine
        if method == "GET":
            if path == "/metrics":
                return self.respond("200 OK", "text/plain; version=0.0.4", eng.stats.metrics(eng.model))
            if path == "/v1/models":
                return self.respond("200 OK", "application/json", _dumps(
                    {"object": "list", "data": [{"id": eng.model, "object": "model", "owned_by": "leanstub",
                                                 "max_model_len": 1 << 20}]}))
            if path == "/health":
                return self.respond("200 OK", "application/json", b"{}")
            if path == "/stats":
                st = eng.stats
                return self.respond("200 OK", "application/json", _dumps(
                    {"generation_tokens": st.generation_tokens, "prompt_tokens": st.prompt_tokens,
                     "requests": st.requests, "requests_ok": st.requests_ok, "running": st.running}))
            return self.respond("404 Not Found", "application/json", b'{"error":"not found"}')
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            chat = path.endswith("chat/completions")
            try:
                req = _loads(body)
            except ValueError:
                return self.respond("400 Bad Request", "application/json", b'{"error":{"message":"bad JSON"}}')
            if chat:
                prompt = " ".join(str(m.get("content") or "") for m in req.get("messages") or [])
            else:
                p = req.get("prompt", "")
                prompt = p if isinstance(p, str) else " ".join(map(str, p))
            max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
            opts = req.get("stream_options") or {}
            if not req.get("stream"):
                return self.respond("400 Bad Request", "application/json",
                                    b'{"error":{"message":"leanstub only streams (stream: true)"}}')
            self.busy = True
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
            eng.add(Stream(self, chat, max(1, max_tokens), len(prompt.split()), bool(opts.get("continuous_usage_stats")),
                           bool(opts.get("include_usage")), eng.stats.requests + 1, eng.model))
            return None
        return self.respond("404 Not Found", "application/json", b'{"error":"not found"}')


async def serve(port: int, tokens_per_chunk: int, token_delay_s: float, model: str) -> None:
    engine = Engine(tokens_per_chunk, token_delay_s, model)
    Conn.engine = engine
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Conn, "127.0.0.1", port, backlog=1024)
    runner = asyncio.ensure_future(engine.run())
    async with server:
        await server.serve_forever()
    runner.cancel()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LeanStubProcess:
    """`with LeanStubProcess(tokens_per_chunk=3) as stub: stub.url, stub.stats()` (tests, benchmarks)."""

    def __init__(self, tokens_per_chunk: int = 1, token_delay_ms: float = 0.0, python: str | None = None) -> None:
        self.tpc, self.delay_ms, self.python = tokens_per_chunk, token_delay_ms, python
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def __enter__(self) -> "LeanStubProcess":
        import subprocess
        import sys
        import urllib.request

        self.proc = subprocess.Popen([self.python or sys.executable, __file__, "--port", str(self.port),
                                      "--tokens-per-chunk", str(self.tpc), "--token-delay-ms", str(self.delay_ms)])
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1).read()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"leanstub on port {self.port} did not start")
                time.sleep(0.05)

    def stats(self) -> dict:
        import urllib.request

        return json.loads(urllib.request.urlopen(self.url + "/stats", timeout=5).read())

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except Exception:  # noqa: BLE001
                self.proc.kill()
            self.proc = None


def main() -> None:
    ap = argparse.ArgumentParser(description="leanstub: fast fake OpenAI streaming server (benchmarks, tests)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--token-delay-ms", type=float, default=0.0)
    ap.add_argument("--model", default="leanstub")
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(args.port, args.tokens_per_chunk, args.token_delay_ms / 1000.0, args.model))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
