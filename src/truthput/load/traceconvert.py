"""A replayable trace (the user's own JSONL that `trace:PATH` reads) from what a server or gateway logged.

- vLLM's request log: a server started with `--enable-log-requests` and DEBUG logging
  (`VLLM_LOGGING_LEVEL=DEBUG`) writes `Received request ID: params: SamplingParams(...)` when a
  request arrives and `Request ID JSON body: {...}` with the body; with `--enable-log-outputs` also
  `Generated response ID details: output_token_ids: [...]`. Its text log stamps each line to the
  second (`MM-DD hh:mm:ss`): the k requests of one logged second are placed at the middles of its k
  equal parts, in log order, and the converter says so. Its JSON log (`asctime` with milliseconds) keeps the
  milliseconds.
- A gateway's JSONL: one object per request with its arrival (`timestamp`, `time`, `start_time`,
  `startTime`, `request_time`, `created_at` or `created`: seconds or milliseconds since the epoch, or an
  ISO 8601 date-time), its body (`body`, `request`, `request_body`, or `messages` / `prompt` at the
  top) and, where logged, the tokens it generated (`usage.completion_tokens`, `response.usage...`,
  `completion_tokens`, `output_tokens`).

Each request becomes `{"timestamp": seconds from the first, "body": ..., "output_length": n}`; the
output length is the recorded one where the log has it, else the body's `max_tokens`. Bad input is
one line naming the file and line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from truthput.errors import InputError
from truthput.load.trace import json_objects

_VLLM_LINE = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR)\s+(?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?\s+\[[^\]]*\]\s+"
    r"(?P<msg>.*)$")
_RECEIVED = re.compile(r"Received request (?P<id>\S+): params: (?P<params>.*)$")
_BODY = re.compile(r"Request (?P<id>\S+) JSON body: (?P<body>\{.*)$")
_OUTPUT = re.compile(r"Generated response (?P<id>\S+?)(?P<stream> \(streaming (?:complete|delta)\))? details: "
                     r"output_token_ids: \[(?P<ids>[^\]]*)\]")
_FINISHED = re.compile(r"Generated response (?P<id>\S+?)(?: \(streaming (?:complete|delta)\))?: output: .*, "
                       r"finish_reason: (?P<reason>\w+)$")
_MAX_TOKENS = re.compile(r"\bmax_tokens=(\d+)")
_CLIENT_KEYS = ("request_id", "stream", "stream_options")
"""Body keys of the logged client's transport, not of its request: truthput sets its own."""
_TIME_KEYS = ("timestamp", "time", "start_time", "startTime", "request_time", "created_at", "created")
_BODY_KEYS = ("body", "request", "request_body")
_OUTPUT_PATHS = (("usage", "completion_tokens"), ("response", "usage", "completion_tokens"),
                 ("completion_tokens",), ("output_tokens",), ("output_length",))


@dataclass
class Converted:
    """The requests of a log as the user's trace JSONL holds them, and what the conversion could not keep."""

    source: str
    """'vllm log', 'vllm json log' or 'gateway jsonl'."""
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def jsonl(self) -> str:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.rows)

    def line(self, out: str) -> str:
        span = self.rows[-1]["timestamp"] if self.rows else 0.0
        rate = f", {len(self.rows) / span:.2f} req/s" if span > 0 else ""
        known = sum(1 for r in self.rows if "output_length" in r)
        return (f"wrote {out}: {len(self.rows)} requests from a {self.source} over {span:.1f} s{rate}; "
                f"recorded output lengths for {known} of {len(self.rows)}")


def convert_log(path: str | Path) -> Converted:
    """The requests `path` logged, in arrival order, timed from the first."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"{where}: cannot read ({exc.strerror})") from None
    lines = text.splitlines()
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    if not first:
        raise InputError(f"{where}: empty")
    if first.startswith("{"):
        objects = json_objects(text.encode(), where)
        if any(isinstance(o.get("message"), str) and "Received request" in o["message"] for _, o in objects):
            return _vllm(where, [(n, _json_time(o, where, n), str(o.get("message", ""))) for n, o in objects],
                         "vllm json log", exact=True)
        return _gateway(where, objects)
    timed = []
    for n, ln in enumerate(lines, 1):
        m = _VLLM_LINE.search(ln)
        if m is not None:
            timed.append((n, _log_time(m), m["msg"]))
    if not any(_RECEIVED.match(msg) for _, _, msg in timed):
        raise InputError(f"{where}: neither a vLLM log with request lines (`Received request ...`: start vLLM with "
                         "--enable-log-requests) nor a JSONL of requests")
    return _vllm(where, timed, "vllm log", exact=False)


def _log_time(m: re.Match[str]) -> float:
    """Seconds of a vLLM text log's stamp (no year: taken in a leap year so 02-29 parses)."""
    stamp = datetime.strptime(f"2000-{m['md']} {m['hms']}", "%Y-%m-%d %H:%M:%S").timestamp()
    frac = m["frac"]
    return stamp + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _json_time(obj: dict[str, Any], where: str, n: int) -> float:
    stamp = obj.get("asctime")
    if not isinstance(stamp, str):
        raise InputError(f"{where}:{n}: a JSON log line without asctime")
    try:
        return datetime.fromisoformat(stamp.replace(",", ".")).timestamp()
    except ValueError:
        raise InputError(f"{where}:{n}: asctime {stamp!r} is not a date-time") from None


def _ids(text: str) -> int:
    return len([x for x in text.split(",") if x.strip()])


def _vllm(where: str, timed: list[tuple[int, float, str]], source: str, exact: bool) -> Converted:
    arrivals: dict[str, tuple[int, float, int | None]] = {}
    bodies: dict[str, tuple[int, dict[str, Any]]] = {}
    outputs: dict[str, int] = {}
    finished: dict[str, str] = {}
    for n, t, msg in timed:
        if (m := _RECEIVED.match(msg)) is not None:
            mt = _MAX_TOKENS.search(m["params"])
            arrivals.setdefault(m["id"], (n, t, int(mt.group(1)) if mt else None))
        elif (m := _BODY.match(msg)) is not None:
            try:
                body = json.loads(m["body"])
            except json.JSONDecodeError:
                raise InputError(f"{where}:{n}: the logged JSON body is cut (vLLM's --max-log-len): start the "
                                 "server without it to log whole bodies") from None
            bodies[m["id"]] = (n, body)
        elif (m := _OUTPUT.match(msg)) is not None:  # streamed: one line per delta, summed
            delta = (m["stream"] or "").startswith(" (streaming delta")
            outputs[m["id"]] = outputs.get(m["id"], 0) * delta + _ids(m["ids"])
        elif (m := _FINISHED.match(msg)) is not None and m["reason"] in ("length", "stop"):
            finished[m["id"]] = m["reason"]
    if not bodies:
        raise InputError(f"{where}: vLLM logged no request bodies (`Request ... JSON body:`): start it with "
                         "--enable-log-requests and VLLM_LOGGING_LEVEL=DEBUG")
    # the body's id is vLLM's base id; the arrival line's is it with a prefix and suffix (chatcmpl-ID,
    # cmpl-ID-0): found by its parts
    by_part = {part: a for a in arrivals for part in (a, *a.split("-"))}
    rows: list[tuple[float, int, dict[str, Any]]] = []
    for body_id, (n, body) in bodies.items():
        arrival_id = by_part.get(body_id)
        if arrival_id is None:
            raise InputError(f"{where}:{n}: no `Received request` line for request {body_id}")
        line, t, max_tokens = arrivals[arrival_id]
        row: dict[str, Any] = {"body": {k: v for k, v in body.items() if k not in _CLIENT_KEYS}}
        out = outputs.get(arrival_id)
        if finished.get(arrival_id) == "length" and max_tokens is not None:
            out = max_tokens  # exact: the streamed deltas leave out tokens whose text vLLM held back
        if out is not None:
            row["output_length"] = out
        elif max_tokens is not None:
            row["body"].setdefault("max_tokens", max_tokens)
        rows.append((t, line, row))
    rows.sort(key=lambda r: (r[0], r[1]))
    notes = []
    if not exact:
        rows = _spread_seconds(rows)
        notes.append("vLLM's text log stamps arrivals to the second: the requests of one logged second are "
                     "spread evenly over it, in log order (each arrival within about half a second; a JSON "
                     "log, or a logging config with %(msecs)03d, keeps milliseconds)")
    if len(outputs) < len(rows):
        notes.append(f"{len(rows) - len(outputs)} of {len(rows)} requests have no logged output tokens "
                     "(--enable-log-outputs): their max_tokens stands for the output length")
    return Converted(source, _from_first(rows), notes)


def _spread_seconds(rows: list[tuple[float, int, dict[str, Any]]]) -> list[tuple[float, int, dict[str, Any]]]:
    out = []
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j][0] == rows[i][0]:
            j += 1
        k = j - i
        out += [(t + (q + 0.5) / k, line, row) for q, (t, line, row) in enumerate(rows[i:j])]
        i = j
    return out


def _from_first(rows: list[tuple[float, int, dict[str, Any]]]) -> list[dict[str, Any]]:
    t0 = rows[0][0] if rows else 0.0
    return [{"timestamp": round(t - t0, 6), **row} for t, _line, row in rows]


def _gateway(where: str, objects: list[tuple[int, dict[str, Any]]]) -> Converted:
    rows: list[tuple[float, int, dict[str, Any]]] = []
    for n, obj in objects:
        key = next((k for k in _TIME_KEYS if obj.get(k) is not None), None)
        if key is None:
            raise InputError(f"{where}:{n}: no arrival time (one of {', '.join(_TIME_KEYS)}); fields found: "
                             f"{', '.join(sorted(obj)) or 'none'}")
        t = _epoch(obj[key], where, n, key)
        body = next((obj[k] for k in _BODY_KEYS if isinstance(obj.get(k), dict)), None)
        if body is None:
            body = {k: obj[k] for k in ("messages", "prompt", "max_tokens", "model") if k in obj}
        if not ({"messages", "prompt"} & set(body)):
            raise InputError(f"{where}:{n}: no request text (messages or prompt, at the top or under "
                             f"{', '.join(_BODY_KEYS)})")
        row: dict[str, Any] = {"body": {k: v for k, v in body.items() if k not in _CLIENT_KEYS}}
        for path in _OUTPUT_PATHS:
            v: Any = obj
            for part in path:
                v = v.get(part) if isinstance(v, dict) else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                row["output_length"] = v
                break
        rows.append((t, n, row))
    rows.sort(key=lambda r: (r[0], r[1]))
    notes = [] if all("output_length" in r for _, _, r in rows) else [
        "some requests have no logged output tokens: their max_tokens stands for the output length"]
    return Converted("gateway jsonl", _from_first(rows), notes)


def _epoch(v: Any, where: str, n: int, key: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v) / 1000.0 if v > 1e11 else float(v)  # milliseconds past 1973 read as such
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.strip().replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise InputError(f"{where}:{n}: {key} {v!r} is neither seconds since the epoch nor a date-time")
