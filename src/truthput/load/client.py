"""Streaming OpenAI-compatible client: one POST per request, every chunk timed, nothing derived.

Why this shape: the client must not be the bottleneck (principle 4), so there is one aiohttp
session for all streams (no connection cap, large read buffers), each payload is decoded by a typed
msgspec decoder that reads only the fields recorded (`truthput.load.chunks`), and per chunk only
three list appends happen on the `RequestRecord`. Errors never escape
`stream()`: they become `status="error"` records whose `error` is one line saying what and where,
so a trial keeps every request (principle 2: nothing is lost).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from truthput.errors import EngineError, InputError
from truthput.load.chunks import MalformedChunk, decode_chunk
from truthput.load.records import RequestRecord
from truthput.load.sse import MAX_EVENT_BYTES, EventTooLarge, SSEParser, single_event_payload

if TYPE_CHECKING:  # imported where a session is made: `plan`, `report` and the rest need no HTTP client
    import aiohttp

MAX_RESPONSE_BYTES = 64 << 20
"""Bytes one streamed response may send (64 MiB: a chunk with running usage is ~300 bytes, so
~200k tokens): a server sending huge events cannot grow the client without bound."""

MAX_CHUNKS_PER_RESPONSE = 2_000_000
"""Chunks one response may stream (about 130 MB of recorded times, counts and texts): far above any
max_tokens, it bounds a server that streams forever."""

_READ_BUFSIZE = 4 * 1024 * 1024  # long prompts / long chunks must not trip aiohttp's line limits
_DONE = b"[DONE]"


def install_fast_loop() -> bool:
    """Use uvloop's event loop for subsequently created loops when it is installed.

    Returns True when uvloop is active. Call before `asyncio.run`.
    """
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def prepare_load_process() -> bool:
    """Make this process a lean load generator: uvloop when present, and start-up objects frozen.

    Why `gc.freeze()`: after the imports (aiohttp, numpy, rich, pydantic...) the heap holds tens of
    thousands of long-lived objects that every full garbage collection during the load would scan
    again, for nothing: none of them becomes garbage. Freezing moves them out of the collector's
    view; the per-chunk objects the client makes die by reference counting and are unaffected.
    Returns True when uvloop is active. Call once, after the imports and before `asyncio.run`.
    """
    import gc

    import aiohttp  # noqa: F401  (imported where a session is made; here so that it is frozen too)

    gc.freeze()  # no gc.collect() first: start-up makes little garbage, and a full pass costs ~15 ms
    return install_fast_loop()


@dataclass
class ClientConfig:
    """Where and how to stream. `api_key_env` names an env var; the key itself is never stored."""

    base_url: str
    endpoint: str = "completions"  # or "chat"
    model: str | None = None  # None -> first id from GET /v1/models
    api_key_env: str | None = None
    request_timeout_s: float = 600.0
    continuous_usage: bool = True
    # Test-only: busy-spin this long per network read in the chunk path, to prove the self-check
    # flags a client that cannot keep up. Never set it for a real measurement.
    test_chunk_spin_s: float = 0.0


def _failed(rec: RequestRecord, t: float, why: str) -> bool:
    """The request failed at `t` for `why` (its record is final)."""
    rec.status, rec.t_end = "error", t
    rec.error = f"request {rec.idx}: {why}"
    return True


_CUT = {
    "bytes": "a response from {url} over {mib} MiB after {n} chunks: cut here to bound the client's memory",
    "event": "an SSE event from {url} over {mib} MiB at chunk {n}: cut here to bound the client's memory",
    "chunks": "more than {limit} chunks from {url}: the response is cut here to bound the client's memory",
}


def _cut(rec: RequestRecord, t: float, url: str, what: str) -> bool:
    """The response was cut at `t` where it passed one of the client's memory bounds (`_CUT`)."""
    mib = (MAX_RESPONSE_BYTES if what == "bytes" else MAX_EVENT_BYTES) >> 20
    return _failed(rec, t, _CUT[what].format(url=url, mib=mib, n=len(rec.chunk_times), limit=MAX_CHUNKS_PER_RESPONSE))


def _unfinished(rec: RequestRecord, url: str, pending: int) -> bool:
    """The stream ended without [DONE] (a server that died mid-response)."""
    return _failed(rec, rec.t_end, f"stream from {url} ended without [DONE] after {len(rec.chunk_times)} chunks"
                   + (f" ({pending} bytes of an unfinished event)" if pending else ""))


def _bad_event(rec: RequestRecord, t: float, url: str, payload: bytes, exc: Exception | None, err: Any) -> bool:
    """The response failed at `t` on an event: data that is not a chunk (`exc`), or the server's
    own error event (`err`)."""
    n = len(rec.chunk_times)
    if exc is not None:
        return _failed(rec, t, f"malformed SSE data from {url} at chunk {n} ({_one_line(str(exc), 120)}): "
                               f"{_one_line(payload[:120].decode('utf-8', 'replace'), 160)}")
    msg = err.get("message", err) if isinstance(err, dict) else err
    return _failed(rec, t, f"server error event from {url} after {n} chunks: {_one_line(str(msg), 200)}")


def _spin(seconds: float) -> None:
    """Burn CPU for `seconds` (the test-only slow-client hook)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def api_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    return root


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class StreamClient:
    """Async context manager holding the shared HTTP session; `stream()` runs one request."""

    def __init__(self, cfg: ClientConfig) -> None:
        if cfg.endpoint not in ("completions", "chat"):
            raise InputError(f"client endpoint {cfg.endpoint!r}: expected 'completions' or 'chat'")
        self.cfg = cfg
        root = api_root(cfg.base_url)
        self.models_url = f"{root}/v1/models"
        self.url = f"{root}/v1/completions" if cfg.endpoint == "completions" else f"{root}/v1/chat/completions"
        self.model: str | None = cfg.model
        self.notes: list[str] = []
        # None: not known yet; True: the server sent running usage; False: rejected or ignored.
        self.continuous_usage_supported: bool | None = None if cfg.continuous_usage else False
        self._stream_options_supported = True
        self._session: aiohttp.ClientSession | None = None
        self._retired: list[aiohttp.ClientSession] = []
        self._reusing = True
        self._headers: dict[str, str] = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        self._model_lock = asyncio.Lock()

    async def __aenter__(self) -> StreamClient:
        if self.cfg.api_key_env:
            key = os.environ.get(self.cfg.api_key_env)
            if not key:
                raise InputError(f"client api_key_env: environment variable {self.cfg.api_key_env} is not set")
            self._headers["Authorization"] = f"Bearer {key}"
        self._session = self._new_session(reuse_connections=True)
        return self

    def _new_session(self, reuse_connections: bool) -> aiohttp.ClientSession:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=not reuse_connections,
                                         enable_cleanup_closed=True)
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s, sock_connect=30.0),
            read_bufsize=_READ_BUFSIZE,
            max_line_size=_READ_BUFSIZE,
            max_field_size=_READ_BUFSIZE,
            auto_decompress=False,
        )

    def _stop_reusing_connections(self, exc: BaseException) -> None:
        """The server closed a kept-alive connection before a request could go out on it (llama.cpp's
        server closes after every streamed response while still announcing keep-alive): from now on
        every request opens its own connection. The old session stays open for requests in flight."""
        if not self._reusing:
            return
        self._reusing = False
        if self._session is not None:
            self._retired.append(self._session)
        self._session = self._new_session(reuse_connections=False)
        self._note(f"{self.url}: the server closed a kept-alive connection before a request was sent on it "
                   f"({type(exc).__name__}); connections are no longer reused (one per request), and such a "
                   "request is sent again on a new connection")

    async def __aexit__(self, *exc: object) -> None:
        for session in [*self._retired, self._session]:
            if session is not None:
                await session.close()
        self._session = None
        self._retired = []

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    async def resolve_model(self) -> str:
        """The configured model, else the first id the server lists at GET /v1/models."""
        if self.model:
            return self.model
        import aiohttp

        async with self._model_lock:
            if self.model:
                return self.model
            assert self._session is not None, "StreamClient used outside `async with`"
            try:
                async with self._session.get(self.models_url, headers=self._headers) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        raise EngineError(
                            f"GET {self.models_url}: HTTP {resp.status}: {_one_line(raw.decode('utf-8', 'replace'), 200)}"
                        )
                ids = [m.get("id") for m in orjson.loads(raw).get("data", [])]
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                raise EngineError(f"GET {self.models_url}: {type(exc).__name__}: {_one_line(str(exc), 200)}") from None
            except (orjson.JSONDecodeError, AttributeError, TypeError):
                raise EngineError(f"GET {self.models_url}: response is not an OpenAI model list") from None
            if not ids or not ids[0]:
                raise EngineError(f"GET {self.models_url}: the server lists no models")
            self.model = str(ids[0])
            return self.model

    def _payload(self, body: dict[str, Any]) -> tuple[bytes, bool, bool]:
        """(JSON bytes, whether continuous_usage_stats was asked for, whether stream_options was sent)."""
        req = dict(body)
        req["stream"] = True
        ask_running = False
        if self._stream_options_supported:
            opts = dict(req.get("stream_options") or {})
            opts["include_usage"] = True
            if self.continuous_usage_supported is not False:
                opts["continuous_usage_stats"] = True
                ask_running = True
            else:
                opts.pop("continuous_usage_stats", None)
            req["stream_options"] = opts
        else:
            req.pop("stream_options", None)
        return orjson.dumps(req), ask_running, self._stream_options_supported

    def _handle_rejection(self, status: int, text: str, asked_running: bool, sent_options: bool) -> bool:
        """True when a 400 names a stream option this attempt sent; the caller retries without it.

        Decided per attempt, so N concurrent first requests all rejected at once each retry once.
        """
        if status not in (400, 422):
            return False
        if asked_running and "continuous_usage_stats" in text:
            self.continuous_usage_supported = False
            self._note(
                f"{self.url} rejected stream_options.continuous_usage_stats (HTTP {status}); "
                "streaming without running usage: per-chunk token counts are unavailable"
            )
            return True
        if sent_options and ("stream_options" in text or "include_usage" in text):
            self._stream_options_supported = False
            self.continuous_usage_supported = False
            self._note(
                f"{self.url} rejected stream_options (HTTP {status}); streaming without usage options: "
                "final usage only if the server sends it unasked"
            )
            return True
        return False

    async def stream(
        self,
        idx: int,
        body: dict[str, Any],
        on_first_token: Callable[[int], None] | None = None,
    ) -> RequestRecord:
        """POST `body` with streaming on; return the timed record (never raises for request errors).

        `on_first_token(idx)` is called synchronously when the first content chunk arrives (the
        closed loop uses it to know when all streams are generating).
        """
        import aiohttp

        rec = RequestRecord(idx=idx, t_start=time.monotonic())
        try:
            if "model" not in body:
                body = dict(body)
                body["model"] = self.model or await self.resolve_model()
            resent = False
            for _attempt in range(3):
                try:
                    done = await self._post(rec, body, on_first_token)
                except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
                    # nothing came back: the request never reached a server that had closed the
                    # pooled connection; send it once more on a connection of its own
                    if resent or rec.http_status is not None or rec.chunk_times:
                        raise
                    resent = True
                    self._stop_reusing_connections(exc)
                    continue
                if done:
                    break
        except EngineError as exc:
            rec.status, rec.error = "error", f"request {idx}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a record, never an exception, per contract
            rec.status = "error"
            rec.error = (
                f"request {idx}: {type(exc).__name__} from {self.url} after {len(rec.chunk_times)} chunks: "
                f"{_one_line(str(exc) or repr(exc), 200)}"
            )
        if not rec.t_end:
            rec.t_end = time.monotonic()
        return rec

    async def _post(
        self, rec: RequestRecord, body: dict[str, Any], on_first_token: Callable[[int], None] | None
    ) -> bool:
        """One attempt. False means: retry (a stream option was rejected); True: record is final."""
        session = self._session
        assert session is not None, "StreamClient used outside `async with`"
        url = self.url
        chat = self.cfg.endpoint == "chat"
        rec.t_start = time.monotonic()
        payload, asked_running, sent_options = self._payload(body)
        async with session.post(url, data=payload, headers=self._headers) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                return await self._refused(resp, rec, asked_running, sent_options)

            parser = SSEParser()
            feed = parser.feed_not_single
            decode = decode_chunk
            now = time.monotonic
            times_append = rec.chunk_times.append
            tokens_append = rec.chunk_tokens.append
            texts_append = rec.chunk_texts.append
            last_ct = 0  # a usage count of 0 (e.g. on a role-only chunk) is no change
            saw_running_usage = False
            got_done = False
            read = resp.content.readany
            spin = self.cfg.test_chunk_spin_s
            one_event = single_event_payload
            done_marker = _DONE
            received = 0
            while not got_done:
                data = await read()
                if not data:
                    break
                t = now()
                received += len(data)
                if received > MAX_RESPONSE_BYTES:
                    return _cut(rec, t, url, "bytes")
                if spin:
                    _spin(spin)
                # One read = one whole event is the usual case of a client that keeps up: take it
                # without feed()'s call and list (the parser holds nothing, so it stays idle).
                single = one_event(data) if parser.idle else None
                if single is not None:
                    payloads: Any = (single,)
                else:
                    try:
                        payloads = feed(data)
                    except EventTooLarge as exc:
                        return _failed(rec, t, f"{exc}, from {url} after {len(rec.chunk_times)} chunks")
                for payload in payloads:
                    if len(payload) > MAX_EVENT_BYTES:
                        return _cut(rec, t, url, "event")
                    if payload == done_marker:
                        got_done = True
                        break
                    try:
                        obj = decode(payload)
                    except MalformedChunk as exc:
                        return _bad_event(rec, t, url, payload, exc, None)
                    if obj is None:
                        continue
                    if obj.error:
                        return _bad_event(rec, t, url, payload, None, obj.error)
                    ct = take_counts(rec, obj) if obj.usage is not None or obj.timings is not None else -1
                    choices = obj.choices
                    if not choices:
                        continue  # usage-only (final) chunk
                    choice = choices[0]
                    piece = (choice.delta.text() if choice.delta is not None else None) if chat else choice.text
                    if choice.finish_reason is not None:
                        rec.finish_reason = choice.finish_reason
                    if ct >= 0:
                        saw_running_usage = True
                    if piece or ct > last_ct:
                        if rec.t_first is None:
                            rec.t_first = t
                            if on_first_token is not None:
                                on_first_token(rec.idx)
                        times_append(t)
                        tokens_append(ct)
                        texts_append(piece or "")
                        if ct > last_ct:
                            last_ct = ct
                if len(rec.chunk_times) > MAX_CHUNKS_PER_RESPONSE:  # once per read, not per chunk
                    return _cut(rec, t, url, "chunks")
            rec.t_end = now()
            if not got_done and _DONE not in parser.flush():
                return _unfinished(rec, url, parser.pending_bytes)
            self._learn_running_usage(saw_running_usage, bool(rec.chunk_times))
            return True

    async def _refused(self, resp: Any, rec: RequestRecord, asked_running: bool, sent_options: bool) -> bool:
        """A response other than 200: False to send again without an option the server refused, else
        the request failed with the status and the start of the body."""
        text = (await resp.read()).decode("utf-8", "replace")
        if self._handle_rejection(resp.status, text, asked_running, sent_options):
            return False
        return _failed(rec, time.monotonic(), f"HTTP {resp.status} from {self.url}: {_one_line(text, 200)}")

    def _learn_running_usage(self, saw_running_usage: bool, had_chunks: bool) -> None:
        """Whether the server sends running usage counts, learnt from the first streams that show it."""
        if saw_running_usage:
            self.continuous_usage_supported = True
        elif self.continuous_usage_supported is None and self._stream_options_supported and had_chunks:
            self.continuous_usage_supported = False
            self._note(f"{self.url} ignored stream_options.continuous_usage_stats (no running usage in chunks); "
                       "per-chunk token counts are unavailable")


def take_counts(rec: RequestRecord, obj: Any) -> int:
    """A chunk's usage and llama.cpp timings onto the record; its running completion count, or -1."""
    timings = obj.timings
    if timings is not None:
        if timings.predicted_per_second is not None:
            rec.server_decode_tps = timings.predicted_per_second
        if timings.cache_n is not None:
            rec.cached_tokens = timings.cache_n
    usage = obj.usage
    ct = -1
    if usage is not None:
        if usage.completion_tokens is not None:
            ct = rec.completion_tokens = usage.completion_tokens
        if usage.prompt_tokens is not None:
            rec.prompt_tokens = usage.prompt_tokens
        details = usage.prompt_tokens_details
        if details is not None and details.cached_tokens is not None:
            rec.cached_tokens = details.cached_tokens
    return ct
