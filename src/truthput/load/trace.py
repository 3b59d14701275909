"""Recorded traffic to replay: a trace's requests with their arrival times, lengths and shared
prefixes, read from the formats people have (detected from the file, never named by the user).

- Mooncake JSONL: `timestamp` (ms from the first), `input_length`, `output_length`, `hash_ids` (one
  id per block of `block_tokens` prompt tokens, 512 in Mooncake's traces: equal ids, equal text);
- Azure LLM inference CSV (2023/2024): `TIMESTAMP` (a date-time), `ContextTokens`, `GeneratedTokens`;
- BurstGPT CSV: `Timestamp` (s), `Request tokens`, `Response tokens` (a response of 0 tokens was a
  failure: left out, and said);
- the user's own JSONL, as a gateway logs it: `timestamp` (seconds, or an ISO 8601 date-time) and the
  request's own `prompt` or `messages` (or its whole OpenAI `body`), `max_tokens` or `output_length`.

Bad input is one line naming the file and line (`InputError`): a missing field, a timestamp that goes
back or is negative, a length of zero or less, a slice with no request.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from truthput.errors import InputError

MOONCAKE_BLOCK_TOKENS = 512
"""Mooncake's traces hash prompts in blocks of 512 tokens (vLLM's own default is 16)."""


@dataclass(frozen=True)
class TraceRequest:
    t: float
    """Seconds after the trace's first request."""
    input_tokens: int | None
    output_tokens: int | None
    hash_ids: tuple[int, ...] = ()
    body: dict[str, Any] | None = None
    """The user's own request (their JSONL): sent as it was, its text and all."""
    line: int = 0


@dataclass(frozen=True)
class TraceOptions:
    """How a trace is replayed: its recorded gaps divided by `speedup`, each gap at most
    `max_gap_s` (None: as recorded), the slice from `start_s` for `duration_s` seconds of the
    trace's own time (None: to its end), `block_tokens` prompt tokens per hash id."""

    speedup: float = 1.0
    max_gap_s: float | None = None
    start_s: float = 0.0
    duration_s: float | None = None
    block_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise InputError(f"trace speedup {self.speedup}: must be > 0")
        if self.max_gap_s is not None and not self.max_gap_s > 0:
            raise InputError(f"trace max_gap_s {self.max_gap_s}: must be > 0")
        if self.start_s < 0 or (self.duration_s is not None and not self.duration_s > 0):
            raise InputError(f"trace slice start_s {self.start_s}, duration_s {self.duration_s}: need start_s >= 0 "
                             "and duration_s > 0")
        if self.block_tokens is not None and self.block_tokens < 1:
            raise InputError(f"trace block_tokens {self.block_tokens}: must be >= 1")


@dataclass(frozen=True)
class Trace:
    path: str
    format: str
    requests: list[TraceRequest]
    block_tokens: int
    notes: list[str] = field(default_factory=list)

    def replayed(self, opts: TraceOptions) -> Trace:
        """The slice, its offsets from its first request, gaps capped and sped up."""
        end = None if opts.duration_s is None else opts.start_s + opts.duration_s
        kept = [r for r in self.requests if r.t >= opts.start_s and (end is None or r.t < end)]
        if not kept:
            span = f"{self.requests[0].t:g}..{self.requests[-1].t:g} s" if self.requests else "none"
            raise InputError(f"{self.path}: the slice from {opts.start_s:g} s"
                             + (f" for {opts.duration_s:g} s" if opts.duration_s else "")
                             + f" holds no request (the trace's requests lie at {span})")
        out, t, prev = [], 0.0, kept[0].t
        for r in kept:
            gap = r.t - prev
            if opts.max_gap_s is not None:
                gap = min(gap, opts.max_gap_s)
            t += gap / opts.speedup
            prev = r.t
            out.append(TraceRequest(t, r.input_tokens, r.output_tokens, r.hash_ids, r.body, r.line))
        return Trace(self.path, self.format, out, opts.block_tokens or self.block_tokens, list(self.notes))

    @property
    def offsets(self) -> list[float]:
        return [r.t for r in self.requests]

    @property
    def rate(self) -> float:
        """Requests per second over the replay (its first to its last arrival)."""
        span = self.requests[-1].t - self.requests[0].t if len(self.requests) > 1 else 0.0
        return (len(self.requests) - 1) / span if span > 0 else float(len(self.requests))

    def shared_share(self) -> float | None:
        """The share of prompt tokens whose block an earlier request of the replay already had (what
        a cache that keeps everything would serve), from the hash ids; None without them."""
        if not any(r.hash_ids for r in self.requests):
            return None
        seen: set[int] = set()
        hit = total = 0
        for r in self.requests:
            total += r.input_tokens or 0
            for k, h in enumerate(r.hash_ids):
                if h in seen:
                    hit += min(self.block_tokens, max(0, (r.input_tokens or 0) - k * self.block_tokens))
                seen.add(h)
        return hit / total if total else None


FORMATS = "Mooncake JSONL (timestamp, input_length, output_length, hash_ids), Azure CSV (TIMESTAMP, " \
          "ContextTokens, GeneratedTokens), BurstGPT CSV (Timestamp, Request tokens, Response tokens), or your " \
          "own JSONL (timestamp with prompt, messages or body)"


def read_trace(path: str | Path) -> Trace:
    """The trace in `path`, its format detected from its fields."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"trace {p}: cannot read ({exc.strerror})") from None
    head = raw.lstrip()[:1]
    if head == b"{":
        return _jsonl(str(p), raw)
    return _csv(str(p), raw.decode("utf-8", "replace"))


def json_objects(raw: bytes, where: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line of a JSONL file; a line that is not a JSON object
    is one error naming `where` and its line."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"{where}:{n}: not JSON ({exc})") from None
        if not isinstance(row, dict):
            raise InputError(f"{where}:{n}: expected a JSON object per line")
        rows.append((n, row))
    return rows


def _jsonl(path: str, raw: bytes) -> Trace:
    rows = json_objects(raw, path)
    if not rows:
        raise InputError(f"{path}: no requests")
    first = rows[0][1]
    if {"timestamp", "input_length", "output_length"} <= set(first):
        reqs = [TraceRequest(_number(row, "timestamp", path, n) / 1000.0, _length(row, "input_length", path, n),
                             _length(row, "output_length", path, n),
                             tuple(int(h) for h in row.get("hash_ids") or ()), None, n) for n, row in rows]
        return _checked(Trace(path, "mooncake", reqs, MOONCAKE_BLOCK_TOKENS), path)
    if "timestamp" in first and ({"prompt", "messages", "body"} & set(first)):
        reqs = []
        for n, row in rows:
            body = dict(row["body"]) if isinstance(row.get("body"), dict) else {
                k: row[k] for k in ("prompt", "messages") if k in row}
            if not ({"prompt", "messages"} & set(body)):
                raise InputError(f"{path}:{n}: no prompt or messages (a request of your own needs its text)")
            out = row.get("max_tokens", row.get("output_length", body.get("max_tokens")))
            if out is not None:
                body["max_tokens"] = _length({"max_tokens": out}, "max_tokens", path, n)
            reqs.append(TraceRequest(_time(row["timestamp"], path, n), None, body.get("max_tokens"), (), body, n))
        return _checked(Trace(path, "jsonl", _from_first(reqs), MOONCAKE_BLOCK_TOKENS), path)
    raise InputError(f"{path}: the first request has fields {', '.join(sorted(first)) or 'none'}: not a trace "
                     f"truthput reads ({FORMATS})")


def _csv(path: str, text: str) -> Trace:
    reader = csv.DictReader(io.StringIO(text))
    fields = [f.strip() for f in reader.fieldnames or []]
    reader.fieldnames = fields
    notes: list[str] = []
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= set(fields):
        fmt, t_key, in_key, out_key = "azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens"
    elif {"Timestamp", "Request tokens", "Response tokens"} <= set(fields):
        fmt, t_key, in_key, out_key = "burstgpt", "Timestamp", "Request tokens", "Response tokens"
    else:
        raise InputError(f"{path}: a CSV with columns {', '.join(fields) or 'none'}: not a trace truthput reads "
                         f"({FORMATS})")
    reqs, failed = [], 0
    for n, row in enumerate(reader, 2):
        if fmt == "burstgpt" and str(row.get(out_key, "")).strip() in ("0", "0.0"):
            failed += 1  # BurstGPT records a failed request with a 0-token response
            continue
        t = _time(row.get(t_key), path, n) if fmt == "azure" else _number(row, t_key, path, n)
        reqs.append(TraceRequest(t, _length(row, in_key, path, n), _length(row, out_key, path, n), (), None, n))
    if failed:
        notes.append(f"{failed} requests with a 0-token response (failures in BurstGPT) left out")
    if not reqs:
        raise InputError(f"{path}: no requests")
    return _checked(Trace(path, fmt, _from_first(reqs), MOONCAKE_BLOCK_TOKENS, notes), path)


def _from_first(reqs: list[TraceRequest]) -> list[TraceRequest]:
    t0 = reqs[0].t if reqs else 0.0
    return [TraceRequest(r.t - t0, r.input_tokens, r.output_tokens, r.hash_ids, r.body, r.line) for r in reqs]


def _checked(trace: Trace, path: str) -> Trace:
    prev = None
    for r in trace.requests:
        if r.t < 0:
            raise InputError(f"{path}:{r.line}: timestamp before the trace's first request (negative offset {r.t:g} s)")
        if prev is not None and r.t < prev:
            raise InputError(f"{path}:{r.line}: the timestamp goes back ({r.t:g} s after the first request, the "
                             f"previous one {prev:g} s): a trace must be in time order")
        prev = r.t
    return trace


def _number(row: dict[str, Any], key: str, path: str, n: int) -> float:
    v = row.get(key)
    if v is None or (isinstance(v, str) and not v.strip()):
        raise InputError(f"{path}:{n}: missing {key}")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(f"{path}:{n}: {key} {v!r} is not a number") from None
    if x < 0:
        raise InputError(f"{path}:{n}: {key} {x:g} is negative")
    return x


def _length(row: dict[str, Any], key: str, path: str, n: int) -> int:
    x = _number(row, key, path, n)
    if x < 1 or x != int(x):
        raise InputError(f"{path}:{n}: {key} {x:g}: a length must be a whole number of tokens >= 1")
    return int(x)


def _time(v: Any, path: str, n: int) -> float:
    """Seconds (a number) or a date-time (ISO 8601, or Azure's "2023-11-16 18:15:46.6805900")."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if v < 0:
            raise InputError(f"{path}:{n}: timestamp {v:g} is negative")
        return float(v)
    if not isinstance(v, str) or not v.strip():
        raise InputError(f"{path}:{n}: missing timestamp")
    s = v.strip()
    try:
        return float(s)
    except ValueError:
        pass
    date, _, frac = s.partition(".")
    try:
        t = datetime.fromisoformat(date.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise InputError(f"{path}:{n}: timestamp {v!r} is neither seconds nor a date-time") from None
    digits = "".join(ch for ch in frac if ch.isdigit())
    return t + (int(digits) / 10 ** len(digits) if digits else 0.0)


def context_check(trace: Trace, max_model_len: int | None) -> None:
    """A request longer than the model's context (prompt and output) is one line with its line."""
    if max_model_len is None:
        return
    for r in trace.requests:
        if r.input_tokens is not None and r.input_tokens + (r.output_tokens or 0) > max_model_len:
            raise InputError(f"{trace.path}:{r.line}: {r.input_tokens} prompt + {r.output_tokens or 0} output tokens "
                             f"exceed the model's context of {max_model_len} (--max-model-len)")


def lateness_figures(lateness: Sequence[float]) -> tuple[float, float, float]:
    """(p50, p99, max) of the sends' lateness against their schedule, in seconds."""
    xs = sorted(lateness)
    if not xs:
        return 0.0, 0.0, 0.0

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]

    return q(0.5), q(0.99), xs[-1]
