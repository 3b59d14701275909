"""Known-truth hostile test server (a FAKE engine for tests, named as such; not product code).

Every token it emits is written to a ledger with its emission time, so the truth is known exactly:
tokens emitted in any time range, per-request counts, words, chunks, spec-decode counts. Its
behaviour is hostile but legal: several tokens per chunk, empty deltas, usage only in the final
chunk or continuous usage, a role-only first chunk, keep-alive comments, a counter that restarts
from zero mid-trial (new `_created`), a /metrics that lags, a request that fails mid-stream, and
periodic vLLM-format log lines with known figures; `metrics_lag_s` (state as of some time ago)
and `metrics_lag_scrapes` (each scrape answered with what the previous one would have seen).

Two ways to use it:
- `simulate(TruthConfig(...))` plays a closed loop in virtual time and returns RequestRecords,
  scrapes and log lines built from the ledger (deterministic; asserts can be exact);
- `TruthServer(cfg).start()` serves the same behaviour over HTTP (aiohttp, 127.0.0.1) in real
  time for the real StreamClient; `/metrics` renders the ledger, `server.ledger` is the truth.

Tokens: token j of a request is " w{j%50}" (starts a word) unless j % 4 == 3, then "s" (continues
the previous word): exactly 3 words per 4 tokens. `truth_tokenizer()` tokenizes that text exactly.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from aiohttp import web

from truthput.load.records import RequestRecord
from truthput.measure.prom import Scrape


def token_text(j: int) -> str:
    return "s" if j % 4 == 3 else f" w{j % 50}"


def truth_tokenizer():
    """A `tokenizers.Tokenizer` whose tokens are exactly the server's tokens."""
    from tokenizers import Regex, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Split

    vocab = {"[UNK]": 0, "s": 1}
    for j in range(50):
        vocab[f" w{j}"] = len(vocab)
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Split(Regex(r" ?[a-z][0-9]*"), behavior="isolated")
    return tok


@dataclass
class TruthConfig:
    concurrency: int = 4
    requests: int = 24
    max_tokens: int = 40
    prefill_s: float = 0.05  # server-side time to the first token
    step_s: float = 0.01  # one decode step
    gap_s: float = 0.0  # client think time between a stream's requests (closed loop)
    tokens_per_chunk: tuple[int, ...] = (1, 3, 2)  # cycled (no speculation): stream interval > 1
    spec_k: int | None = None  # speculative tokens per step
    accept_pattern: tuple[int, ...] = (1, 1, 0, 1)  # accepted drafts per step, cycled (<= k)
    continuous_usage: bool = True
    fail_request: int | None = None  # this request's stream is cut ...
    fail_after_tokens: int = 10  # ... after this many tokens
    reset_at: float | None = None  # the counters restart from zero at this time
    metrics_lag_s: float = 0.0  # /metrics shows the state this long ago
    metrics_lag_scrapes: bool = False  # /metrics serves what the previous scrape would have seen
    foreign_tps: float = 0.0  # another client's tokens per second: counted by /metrics, never sent to this one
    foreign_every_s: float = 0.0  # > 0: the other client's tokens land in bursts this far apart (its mean rate foreign_tps)
    other_model_tps: float = 0.0  # a second model on the same server ("other"), its own labelled series
    periodic_scrapes: int = 0  # simulate(): this many evenly spaced scrapes inside the window
    stale_scrapes: tuple[int, ...] = ()  # these /metrics answers (0 = the first) come from a replica ...
    stale_lag_s: float = 1.0  # ... this far behind (a dip: the counter lower than the one before)
    failing_scrapes_every: int = 0  # every Nth /metrics answer fails (HTTP 503)
    created_series: bool = True  # False: no `_created` series (a gateway or an exporter that drops them)
    counter_at_end: bool = False  # the token counter adds a request's tokens when it finishes, not per step
    final_usage: bool = True  # False: no usage in the stream at all, even when asked (an engine with none)
    prompt_words_per_token: float = 0.75  # usage.prompt_tokens = the prompt's words / this (truthput builds at 0.75)
    output_limit: int | None = None  # a context limit: no request gets more tokens than this (finish_reason length)
    slots: str | None = None  # llama.cpp's /slots: None (501, as with --no-slots), "list" or "object" (next_token's shape)
    log_interval_s: float = 0.5
    empty_deltas: bool = False
    role_first_chunk: bool = True
    keepalive_every: int = 0
    ttft_buckets: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)


@dataclass
class Emission:
    t: float
    req: int
    tokens: int
    words: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_pos: tuple[int, ...] = ()
    first: bool = False


@dataclass
class Ledger:
    """Every emission; the truth every measurement is checked against."""

    emissions: list[Emission] = field(default_factory=list)
    ttfts: list[tuple[float, float]] = field(default_factory=list)
    created: float = 1.7e9
    spans: dict[int, list[float]] = field(default_factory=dict)
    """request -> [arrived, finished] (finished = inf while running): the running-requests gauge."""

    def running(self, t: float) -> int:
        return sum(1 for a, b in self.spans.values() if a <= t < b)

    def between(self, t0: float, t1: float, attr: str = "tokens") -> int:
        return sum(getattr(e, attr) for e in self.emissions if t0 < e.t <= t1)

    def chunks_between(self, t0: float, t1: float) -> int:
        return sum(1 for e in self.emissions if t0 < e.t <= t1 and e.tokens > 0)

    def per_request(self, req: int) -> int:
        return sum(e.tokens for e in self.emissions if e.req == req)

    def total(self, attr: str = "tokens") -> int:
        return sum(getattr(e, attr) for e in self.emissions)


def _step_plan(cfg: TruthConfig, n_tokens: int) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """Per chunk: (tokens, drafts, draft_tokens, accepted per position) for one request."""
    plan = [(1, 0, 0, ())]  # the first token comes from prefill, without a draft
    done, step = 1, 0
    while done < n_tokens:
        if cfg.spec_k:
            a = min(cfg.accept_pattern[step % len(cfg.accept_pattern)], cfg.spec_k, n_tokens - done - 1)
            pos = tuple(1 if i < a else 0 for i in range(cfg.spec_k))
            plan.append((1 + a, 1, cfg.spec_k, pos))
            done += 1 + a
        else:
            n = min(cfg.tokens_per_chunk[step % len(cfg.tokens_per_chunk)], n_tokens - done)
            plan.append((n, 0, 0, ()))
            done += n
        step += 1
    return plan


def _words(first_token: int, n: int) -> int:
    return sum(1 for j in range(first_token, first_token + n) if token_text(j).startswith(" "))


class Metrics:
    """Renders the ledger as vLLM-style Prometheus text at a time (reset and lag applied)."""

    def __init__(self, cfg: TruthConfig, ledger: Ledger):
        self.cfg, self.ledger = cfg, ledger
        self.last_render = 0.0  # server time of the state the latest scrape saw (the truth for it)
        self._previous: tuple[float, str] | None = None
        self.served = 0

    def answer(self, t: float) -> str | None:
        """What GET /metrics answers at time t: None for a failed read (HTTP 503)."""
        n, self.served = self.served, self.served + 1
        if self.cfg.failing_scrapes_every and (n + 1) % self.cfg.failing_scrapes_every == 0:
            return None
        if n in self.cfg.stale_scrapes:
            return self.render(t - self.cfg.stale_lag_s)
        return self.scrape(t)

    def scrape(self, t: float) -> str:
        """What GET /metrics answers at time t (one scrape behind when metrics_lag_scrapes)."""
        text = self.render(t)
        if not self.cfg.metrics_lag_scrapes:
            return text
        served = self._previous or (t, text)
        self._previous = (t, text)
        self.last_render = served[0]
        return served[1]

    def render(self, t: float) -> str:
        self.last_render = t
        cfg, led = self.cfg, self.ledger
        t_seen = t - cfg.metrics_lag_s
        t0 = -1e18
        created = led.created
        if cfg.reset_at is not None and t_seen >= cfg.reset_at:
            t0, created = cfg.reset_at, led.created + 1000.0
        em = [e for e in led.emissions if t0 < e.t <= t_seen]
        lab = 'engine="0",model_name="truth"'
        lines = []

        def counter(name: str, value: float, extra: str = "") -> None:
            labels = lab + extra
            lines.append(f"# TYPE {name} counter")
            lines.append(f"{name}_total{{{labels}}} {float(value)}")
            if cfg.created_series:
                lines.append(f"{name}_created{{{labels}}} {created}")

        since = t_seen - max(t0, 0.0)
        if cfg.foreign_every_s > 0:  # a request every few seconds, its tokens counted as it ends
            since = cfg.foreign_every_s * int(since / cfg.foreign_every_s)
        foreign = int(cfg.foreign_tps * since)
        if cfg.counter_at_end:  # a request's tokens are added when it finishes (its spans' end)
            ended = {r for r, (_a, b) in led.spans.items() if t0 < b <= t_seen}
            counter("vllm:generation_tokens", sum(e.tokens for e in led.emissions if e.req in ended) + foreign)
        else:
            counter("vllm:generation_tokens", sum(e.tokens for e in em) + foreign)
        if cfg.other_model_tps:
            other = 'engine="0",model_name="other"'
            lines.append(f"vllm:generation_tokens_total{{{other}}} {float(int(cfg.other_model_tps * (t_seen - max(t0, 0.0))))}")
            lines.append(f"vllm:generation_tokens_created{{{other}}} {created}")
        counter("vllm:prompt_tokens", 10 * sum(1 for e in em if e.first))
        if cfg.spec_k:
            counter("vllm:spec_decode_num_drafts", sum(e.drafts for e in em))
            counter("vllm:spec_decode_num_draft_tokens", sum(e.draft_tokens for e in em))
            counter("vllm:spec_decode_num_accepted_tokens", sum(e.accepted for e in em))
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
            for i in range(cfg.spec_k):
                v = sum(e.accepted_pos[i] for e in em if e.accepted_pos)
                lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(v)}')
        lines.append("# TYPE vllm:num_requests_running gauge")
        lines.append(f"vllm:num_requests_running{{{lab}}} {float(led.running(t_seen))}")
        if cfg.other_model_tps:
            lines.append(f'vllm:num_requests_running{{engine="0",model_name="other"}} 3.0')
        ttfts = [x for (tt, x) in led.ttfts if t0 < tt <= t_seen]
        lines.append("# TYPE vllm:time_to_first_token_seconds histogram")
        for b in cfg.ttft_buckets:
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{b}"}} {float(sum(1 for x in ttfts if x <= b))}')
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} {float(len(ttfts))}')
        lines.append(f"vllm:time_to_first_token_seconds_count{{{lab}}} {float(len(ttfts))}")
        lines.append(f"vllm:time_to_first_token_seconds_sum{{{lab}}} {float(sum(ttfts))}")
        return "\n".join(lines) + "\n"


def log_lines(cfg: TruthConfig, ledger: Ledger, t_from: float, t_to: float) -> list[tuple[float, str]]:
    """vLLM-format periodic lines at multiples of log_interval_s, with the ledger's true figures."""
    out = []
    L = cfg.log_interval_s
    k = int(t_from // L) + 1
    while k * L <= t_to + L:
        t1 = k * L
        t0 = t1 - L
        gen = ledger.between(t0, t1) / L
        out.append((t1, (
            f"INFO 11-30 10:00:00 [loggers.py:248] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            f"Avg generation throughput: {gen:.1f} tokens/s, Running: {cfg.concurrency} reqs, Waiting: 0 reqs, "
            f"GPU KV cache usage: 1.5%, Prefix cache hit rate: 0.0%")))
        if cfg.spec_k:
            acc = ledger.between(t0, t1, "accepted")
            dr = ledger.between(t0, t1, "draft_tokens")
            drafts = ledger.between(t0, t1, "drafts")
            mal = 1 + acc / drafts if drafts else 0.0
            rate = acc / dr * 100 if dr else 0.0
            out.append((t1, (
                f"INFO 11-30 10:00:00 [metrics.py:90] SpecDecoding metrics: Mean acceptance length: {mal:.2f}, "
                f"Accepted throughput: {acc / L:.2f} tokens/s, Drafted throughput: {dr / L:.2f} tokens/s, "
                f"Accepted: {acc} tokens, Drafted: {dr} tokens, Per-position acceptance rate: "
                f"{', '.join('%.3f' % (acc / drafts if drafts else 0.0) for _ in range(cfg.spec_k))}, "
                f"Avg Draft acceptance rate: {rate:.1f}%")))
        k += 1
    return out


@dataclass
class Simulated:
    records: list[RequestRecord]
    scrapes: list[Scrape]
    log_lines: list[tuple[float, str]]
    window: tuple[float, float]
    ledger: Ledger
    metrics: Metrics


def simulate(cfg: TruthConfig, t0: float = 100.0) -> Simulated:
    """A closed loop of `cfg.concurrency` streams in virtual time; chunks arrive when emitted."""
    ledger = Ledger()
    records: list[RequestRecord] = []
    stream_free = [t0] * cfg.concurrency
    next_idx = 0
    first_tokens_of_first_wave: list[float] = []
    while next_idx < cfg.requests:
        s = min(range(cfg.concurrency), key=lambda i: stream_free[i])
        idx = next_idx
        next_idx += 1
        start = stream_free[s]
        rec = RequestRecord(idx=idx, t_start=start, worker=s)
        ledger.spans[idx] = [start, float("inf")]
        fail = cfg.fail_request == idx
        limit = cfg.fail_after_tokens if fail else cfg.max_tokens
        t = start + cfg.prefill_s
        done = 0
        for n, drafts, dtoks, pos in _step_plan(cfg, cfg.max_tokens):
            if done >= limit:
                break
            n = min(n, limit - done)
            acc = n - 1 if drafts else 0
            ledger.emissions.append(Emission(t, idx, n, _words(done, n), drafts, dtoks, acc,
                                             tuple(1 if i < acc else 0 for i in range(len(pos))), first=done == 0))
            if done == 0:
                ledger.ttfts.append((t, t - start))
                rec.t_first = t
            rec.chunk_times.append(t)
            rec.chunk_texts.append("".join(token_text(j) for j in range(done, done + n)))
            done += n
            rec.chunk_tokens.append(done if cfg.continuous_usage else -1)
            t += cfg.step_s
        last = rec.chunk_times[-1]
        if fail:
            rec.status, rec.error, rec.t_end = "error", f"request {idx}: connection reset after {done} tokens", last
        else:
            rec.completion_tokens, rec.finish_reason, rec.t_end = done, "length", last + 0.001
        ledger.spans[idx][1] = rec.t_end
        if idx < cfg.concurrency:
            first_tokens_of_first_wave.append(rec.t_first)  # type: ignore[arg-type]
        stream_free[s] = rec.t_end + cfg.gap_s
        records.append(rec)
    metrics = Metrics(cfg, ledger)
    ws = max(first_tokens_of_first_wave) + 1e-4
    # The window ends when the first stream runs out of work (the batch is no longer full).
    ends: dict[int, float] = {}
    for r in records:
        ends[r.worker] = max(ends.get(r.worker, 0.0), r.t_end)
    we = min(ends.values()) - 1e-4
    t_post = max(r.t_end for r in records) + 0.01
    times = [("pre", t0 - 0.01), ("window_start", ws)]
    times += [("periodic", ws + (we - ws) * (k + 1) / (cfg.periodic_scrapes + 1)) for k in range(cfg.periodic_scrapes)]
    times += [("window_end", we), ("post", t_post)]
    scrapes = []
    for ph, tt in times:
        text = metrics.answer(tt)
        scrapes.append(Scrape(ph, tt, text, None if text is not None else "GET /metrics answered HTTP 503"))
    logs = log_lines(cfg, ledger, t0 - cfg.log_interval_s, t_post)
    return Simulated(records, scrapes, logs, (ws, we), ledger, metrics)


class TruthServer:
    """The same behaviour over HTTP in real time (`time.monotonic()`, same clock as the client)."""

    def __init__(self, cfg: TruthConfig | None = None):
        self.cfg = cfg or TruthConfig()
        self.ledger = Ledger()
        self.metrics = Metrics(self.cfg, self.ledger)
        self.port = 0
        self._n = 0
        self._runner: web.AppRunner | None = None
        self.t_started = time.monotonic()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> "TruthServer":
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/slots", self._slots)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, _r: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "truth", "object": "model"}]})

    async def _completions(self, r: web.Request) -> web.StreamResponse:
        return await self._serve(r, chat=False)

    async def _chat(self, r: web.Request) -> web.StreamResponse:
        return await self._serve(r, chat=True)

    async def _slots(self, _r: web.Request) -> web.Response:
        """Each running request's slot with its tokens so far (llama.cpp's shape), idle slots after."""
        if self.cfg.slots is None:
            return web.Response(status=501, text="This server does not support slots endpoint.")
        running = sorted(i for i, (_a, end) in self.ledger.spans.items() if end == float("inf"))
        decoded = {i: 0 for i in running}
        for e in self.ledger.emissions:
            if e.req in decoded:
                decoded[e.req] += e.tokens
        out = []
        for k in range(max(self.cfg.concurrency, len(running))):
            slot: dict = {"id": k, "n_ctx": 4096, "speculative": False, "is_processing": k < len(running)}
            if k < len(running):
                nt = {"has_next_token": True, "has_new_line": False, "n_remain": -1,
                      "n_decoded": decoded[running[k]]}
                slot.update(id_task=running[k], next_token=[nt] if self.cfg.slots == "list" else nt)
            out.append(slot)
        return web.json_response(out)

    async def _metrics(self, _r: web.Request) -> web.Response:
        text = self.metrics.answer(time.monotonic())
        if text is None:
            return web.Response(status=503, text="replica unavailable")
        return web.Response(text=text, content_type="text/plain")

    def log_lines(self, t_to: float | None = None) -> list[tuple[float, str]]:
        return log_lines(self.cfg, self.ledger, self.t_started, t_to or time.monotonic())

    async def _serve(self, req: web.Request, chat: bool) -> web.StreamResponse:
        cfg = self.cfg
        body = await req.json()
        opts = body.get("stream_options") or {}
        running = bool(opts.get("continuous_usage_stats")) and cfg.continuous_usage
        idx = self._n
        self._n += 1
        fail = cfg.fail_request == idx
        limit = cfg.fail_after_tokens if fail else int(body.get("max_tokens", cfg.max_tokens))
        if cfg.output_limit is not None:
            limit = min(limit, cfg.output_limit)
        t_req = time.monotonic()
        self.ledger.spans[idx] = [t_req, float("inf")]
        try:
            return await self._stream(req, chat, body, opts, running, idx, fail, limit, t_req)
        finally:
            self.ledger.spans[idx][1] = time.monotonic()

    async def _stream(self, req: web.Request, chat: bool, body: dict, opts: dict, running: bool, idx: int,
                      fail: bool, limit: int, t_req: float) -> web.StreamResponse:
        cfg = self.cfg
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(obj) -> None:
            await resp.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

        words = len(str(body.get("prompt") or " ".join(str(m.get("content") or "")
                                                          for m in body.get("messages") or [])).split())
        n_prompt = max(1, round(words / cfg.prompt_words_per_token))

        def usage(d: int) -> dict:
            return {"prompt_tokens": n_prompt, "completion_tokens": d, "total_tokens": n_prompt + d}

        def chunk(text: str | None, d: int, fr=None) -> dict:
            if chat:
                delta = {} if text is None else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": fr}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": fr}
            c = {"id": f"truth-{idx}", "object": kind, "model": "truth", "choices": [choice]}
            if running:
                c["usage"] = usage(d)
            return c

        if chat and cfg.role_first_chunk:
            first = chunk(None, 0)
            first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            await send(first)
        await asyncio.sleep(cfg.prefill_s)
        done = 0
        n_chunk = 0
        for n, drafts, dtoks, pos in _step_plan(cfg, int(body.get("max_tokens", cfg.max_tokens))):
            if done >= limit:
                break
            n = min(n, limit - done)
            acc = n - 1 if drafts else 0
            t = time.monotonic()
            self.ledger.emissions.append(Emission(t, idx, n, _words(done, n), drafts, dtoks, acc,
                                                  tuple(1 if i < acc else 0 for i in range(len(pos))), first=done == 0))
            if done == 0:
                self.ledger.ttfts.append((t, t - t_req))
            text = "".join(token_text(j) for j in range(done, done + n))
            done += n
            fin = "length" if (done >= limit and not fail) else None
            await send(chunk(text, done, fin))
            n_chunk += 1
            if chat and cfg.empty_deltas:
                await send(chunk(None, done))
            if cfg.keepalive_every and n_chunk % cfg.keepalive_every == 0:
                await resp.write(b": keep-alive\n\n")
            await asyncio.sleep(cfg.step_s)
        if fail:
            assert req.transport is not None
            req.transport.close()
            return resp
        if opts.get("include_usage") and cfg.final_usage:
            await send({"id": f"truth-{idx}", "object": kind, "model": "truth", "choices": [], "usage": usage(done)})
        await send(b"[DONE]")
        await resp.write_eof()
        return resp
