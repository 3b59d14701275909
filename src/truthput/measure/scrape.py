"""Scraping a server's /metrics during a trial: raw text kept, timed at the request/response midpoint."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from truthput.measure.prom import Scrape


async def scrape_metrics(session: Any, base_url: str, phase: str) -> Scrape:
    import aiohttp

    t_send = time.monotonic()
    try:
        async with session.get(base_url + "/metrics") as resp:
            text = await resp.text()
            t_recv = time.monotonic()
            t_mid = (t_send + t_recv) / 2
            if resp.status != 200:
                return Scrape(phase, t_mid, None, f"GET {base_url}/metrics answered HTTP {resp.status}")
            return Scrape(phase, t_mid, text, None, (t_recv - t_send) / 2)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return Scrape(phase, (t_send + time.monotonic()) / 2, None,
                      f"GET {base_url}/metrics failed: {exc.__class__.__name__} {exc}".strip())


EDGE_TRIES = 3
EDGE_PAUSE_S = 0.05


async def scrape_edge(session: Any, base_url: str, phase: str) -> list[Scrape]:
    """A window edge's scrape, retried (EDGE_TRIES reads, EDGE_PAUSE_S apart: well inside a
    sampling interval) when it fails: the failed reads are kept as `periodic` errors, so the
    trial says what happened, and the edge is the first good read (or the last failure)."""
    tries: list[Scrape] = []
    for attempt in range(EDGE_TRIES):
        if attempt:
            await asyncio.sleep(EDGE_PAUSE_S)
        s = await scrape_metrics(session, base_url, phase)
        if s.error is None:
            return [Scrape("periodic", f.t_mono, None, f"{f.error} (retried at the {phase} edge)")
                    for f in tries] + [s]
        tries.append(s)
    return [Scrape("periodic", f.t_mono, None, f.error) for f in tries[:-1]] + [tries[-1]]


IDLE_CHECK_S = 1.0
"""How long `load` and `run` (on a server truthput did not start) watch the counter before any load."""


async def idle_rate(base_url: str, emitted_names: tuple[str, ...], seconds: float = IDLE_CHECK_S) -> float | None:
    """How fast the server's token counter moves with no request of truthput's: two scrapes
    `seconds` apart before any load (tok/s; None when /metrics or the counter cannot be read).
    Anything above zero is another client's traffic."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        first = await scrape_metrics(session, base_url, "pre")
        await asyncio.sleep(seconds)
        second = await scrape_metrics(session, base_url, "pre")
    va, vb = counter_value(first, emitted_names), counter_value(second, emitted_names)
    if va is None or vb is None or vb < va or second.t_mono <= first.t_mono:
        return None
    return (vb - va) / (second.t_mono - first.t_mono)


async def server_started(base_url: str) -> float | None:
    """When the server's process started (`process_start_time_seconds`, Unix seconds), from one
    scrape: which server a `load` measured, so the next one knows whether it is the same server."""
    import aiohttp

    from truthput.measure.prom import parse_scrape, sum_samples

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        scrape = await scrape_metrics(session, base_url, "pre")
    return None if scrape.error else sum_samples(parse_scrape(scrape), "process_start_time_seconds")


def counter_value(scrape: Scrape, emitted_names: tuple[str, ...]) -> float | None:
    """The emitted-token counter a scrape shows (its first name present), None when unreadable."""
    from truthput.measure.prom import parse_scrape

    parsed = parse_scrape(scrape)
    name = parsed.first_present(emitted_names) if parsed.ok else None
    return parsed.total(name) if name else None


async def settled_post_scrapes(session: Any, base_url: str, emitted_names: tuple[str, ...]) -> list[Scrape]:
    """After the drain, scrape until the emitted-token counter stops moving (a /metrics may lag).

    Returns the first `post` scrape (the drain's end: what a rate over the whole trial divides
    by) and, when the counter moved after it, the settled one (what the whole-trial identity
    reads); both have phase `post`.
    """
    from truthput.measure.prom import parse_scrape

    last = None
    first = scrape = await scrape_metrics(session, base_url, "post")
    for attempt in range(12):
        if attempt:
            scrape = await scrape_metrics(session, base_url, "post")
        if scrape.text is None:
            break
        parsed = parse_scrape(scrape)
        name = parsed.first_present(emitted_names)
        value = parsed.total(name) if name else None
        if value is not None and value == last:
            break
        last = value
        await asyncio.sleep(0.25)
    return [first] if scrape is first else [first, scrape]


async def other_traffic(base_url: str, emitted_names: tuple[str, ...]) -> str | None:
    """"this server is serving other traffic: ..." when its token counter moves with no load of
    truthput's (`idle_rate` over IDLE_CHECK_S), else None (quiet, or no counter to read)."""
    idle = await idle_rate(base_url, emitted_names, IDLE_CHECK_S)
    if not idle:
        return None
    return (f"this server is serving other traffic: its token counter rose at {idle:.1f} tok/s over "
            f"{IDLE_CHECK_S:g} s before any load from truthput; each counter figure is checked against "
            "truthput's own tokens (foreign_traffic), and a quiet server gives the seed's method back")
