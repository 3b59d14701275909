"""llama.cpp's `/slots`: each slot's current task and the tokens it has decoded so far
(`next_token.n_decoded`, live while the task runs; back to 0 when the slot is released).

Why: llama.cpp's token counter moves only when a request ends, so it cannot place tokens in time;
`/slots` can. Read at the window's two edges, the tokens made inside the window are

    what the tasks running at the end had decoded
  + what the requests that ended inside the window got in all (truthput's own usage)
  - what the tasks running at the start had decoded,

each task counted by its own progress, whoever sent it. The shape differs between builds
(`next_token` an object or a list of one), so each read says which it saw. A server without
`/slots` (vLLM, the simulator; llama.cpp with `--no-slots`) answers 404/501: no figure, no cost
beyond one read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from truthput.load.records import RequestRecord
from truthput.measure.model import Figure, missing


@dataclass(frozen=True)
class SlotsRead:
    """One read of /slots: `decoded` maps each processing slot's task id to its tokens so far."""

    phase: str
    t_mono: float
    decoded: dict[int, int] = field(default_factory=dict)
    error: str | None = None
    shape: str = ""
    """How this build shapes a slot's progress: "next_token object" or "next_token list"."""


def parse_slots(doc: Any) -> tuple[dict[int, int], str]:
    """(task id -> n_decoded of the processing slots, the shape seen); ValueError when `doc` is not
    a list of slots with progress."""
    if not isinstance(doc, list):
        raise ValueError("not a list of slots")
    decoded: dict[int, int] = {}
    shapes: set[str] = set()
    for slot in doc:
        if not isinstance(slot, dict):
            raise ValueError("a slot is not an object")
        nt = slot.get("next_token")
        if isinstance(nt, list):
            shapes.add("next_token list")
            nt = nt[0] if nt else None
        elif isinstance(nt, dict):
            shapes.add("next_token object")
        if not slot.get("is_processing") or not isinstance(nt, dict):
            continue
        task, n = slot.get("id_task"), nt.get("n_decoded")
        if isinstance(task, int) and isinstance(n, int) and not isinstance(n, bool):
            decoded[task] = n
    return decoded, " and ".join(sorted(shapes)) or "no progress field"


async def read_slots(session: Any, base_url: str, phase: str) -> SlotsRead:
    """GET /slots, timed at the request/response midpoint; an error says why there is no read."""
    import aiohttp

    t_send = time.monotonic()
    try:
        async with session.get(base_url + "/slots") as resp:
            body = await resp.json(content_type=None) if resp.status == 200 else None
            t_mid = (t_send + time.monotonic()) / 2
            if resp.status != 200:
                return SlotsRead(phase, t_mid, error=f"GET {base_url}/slots answered HTTP {resp.status}")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        return SlotsRead(phase, (t_send + time.monotonic()) / 2,
                         error=f"GET {base_url}/slots failed: {exc.__class__.__name__} {exc}".strip())
    try:
        decoded, shape = parse_slots(body)
    except ValueError as exc:
        return SlotsRead(phase, t_mid, error=f"GET {base_url}/slots: {exc}")
    return SlotsRead(phase, t_mid, decoded, None, shape)


def _settled(read: SlotsRead, ok: Sequence[RequestRecord]) -> float:
    """The client-side moment matching a read: a request the server has finished (its slot released,
    so not among the read's tasks) reaches the client a little later, so the client still sees it in
    flight. The requests in flight on the client at the read beyond the read's processing tasks are
    the first of them to end: the moment returned is the end of the last of those (the read's own
    time where the two agree)."""
    in_flight = [r for r in ok if r.t_start <= read.t_mono < r.t_end]  # ok is sorted by t_end
    extra = len(in_flight) - len(read.decoded)
    return in_flight[extra - 1].t_end if extra > 0 else read.t_mono


def slots_window(reads: Sequence[SlotsRead], records: Sequence[RequestRecord]) -> Figure:
    """Tokens made between the window's two /slots reads, per second (source `server_slots`)."""
    start = next((r for r in reads if r.phase == "window_start"), None)
    end = next((r for r in reads if r.phase == "window_end"), None)
    if start is None or end is None:
        return missing("tok/s", "server_slots", "no /slots read at the window's edges")
    if start.error or end.error:
        return missing("tok/s", "server_slots", start.error or end.error or "")
    seconds = end.t_mono - start.t_mono
    if seconds <= 0:
        return missing("tok/s", "server_slots", "the window's /slots reads are not in time order")
    ok = sorted((r for r in records if r.status == "ok"), key=lambda r: r.t_end)
    ended = [r for r in ok if _settled(start, ok) < r.t_end <= _settled(end, ok)]
    if any(r.completion_tokens is None for r in ended):
        return missing("tok/s", "server_slots", "a request that ended in the window carried no usage count")
    tokens = sum(end.decoded.values()) + sum(r.completion_tokens or 0 for r in ended) - sum(start.decoded.values())
    return Figure(value=tokens / seconds, unit="tok/s", source="server_slots", window="window", seconds=seconds,
                  note=f"/slots n_decoded at the window's end ({len(end.decoded)} tasks) + the {len(ended)} requests "
                       f"that ended inside it - n_decoded at its start ({len(start.decoded)} tasks), over the "
                       f"{seconds:.2f} s between the reads; this build's shape: {end.shape}")
