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
