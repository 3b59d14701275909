"""Scraping a server's /metrics during a trial: raw text kept, timed at the request/response midpoint."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
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


QUIET_CHECK_S = 3.0
"""How long `load` and `run` (on a server truthput did not start) watch the server before any load:
several scrape intervals, so a client that sends a request every few seconds is seen."""
QUIET_INTERVAL_S = 0.5


@dataclass(frozen=True)
class QuietCheck:
    """What the server did before any load of truthput's (`quiet_check`): its token counter and
    running requests for truthput's model, and how far other models' counters moved."""

    seconds: float
    tokens: float
    """The rise of the emitted-token counter for truthput's model over `seconds`."""
    running_max: float | None
    """The most requests the server reported running for that model at one scrape."""
    other_models: dict[str, float]
    """Other models' counter rise over the same period (their traffic needs no flag)."""

    def warning(self) -> str | None:
        """One line where another client used truthput's model (None: quiet)."""
        if self.tokens <= 0 and not self.running_max:
            return None
        running = f", up to {self.running_max:.0f} of its requests running" if self.running_max else ""
        return (f"this server is serving other traffic: over {self.seconds:.1f} s before any load from truthput its "
                f"token counter rose by {self.tokens:.0f} ({self.tokens / self.seconds:.1f} tok/s){running}; each "
                "counter figure is checked against truthput's own tokens (foreign_traffic), and a quiet server gives "
                "the seed's method back")

    def note(self) -> str | None:
        """Other models' traffic, said (it is not truthput's model's, so nothing is flagged)."""
        moved = {m: v for m, v in self.other_models.items() if v > 0}
        if not moved:
            return None
        said = ", ".join(f"{m} {v:.0f} tokens" for m, v in sorted(moved.items()))
        return (f"other models on this server moved their counters over {self.seconds:.1f} s before the load ({said}); "
                "truthput reads its own model's series only")


async def quiet_check(base_url: str, emitted_names: tuple[str, ...], running_names: tuple[str, ...] = (),
                      model: str | None = None, seconds: float = QUIET_CHECK_S) -> QuietCheck | None:
    """Scrape every QUIET_INTERVAL_S for `seconds` before any load: the counter's rise and the
    running requests for `model` (a server labelling series by `model_name` read for that one);
    None when /metrics or the counter cannot be read."""
    import aiohttp

    from truthput.measure.prom import parse_scrape

    scrapes = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        t_end = time.monotonic() + seconds
        while True:
            scrapes.append(parse_scrape(await scrape_metrics(session, base_url, "pre")))
            if time.monotonic() >= t_end:
                break
            await asyncio.sleep(min(QUIET_INTERVAL_S, max(0.0, t_end - time.monotonic())))
    ok = [p for p in scrapes if p.ok]
    name = next(filter(None, (p.first_present(emitted_names) for p in ok)), None)
    if len(ok) < 2 or name is None:
        return None
    labelled = {lb["model_name"] for p in ok for lb, _v in p.samples.get(name, []) if "model_name" in lb}
    mine = {"model_name": model} if model and model in labelled else None
    first, last = ok[0], ok[-1]
    va, vb = first.total(name, mine), last.total(name, mine)
    if va is None or vb is None or vb < va:
        return None  # a restart in between: nothing to read
    gauge = running_names[0] if running_names else None
    running = [v for p in ok if gauge and (v := p.total(gauge, mine)) is not None]
    others: dict[str, float] = {}
    for other in sorted(labelled - {model}) if mine else []:
        oa, ob = first.total(name, {"model_name": other}), last.total(name, {"model_name": other})
        if oa is not None and ob is not None and ob >= oa:
            others[other] = ob - oa
    return QuietCheck(seconds=last.t_mono - first.t_mono, tokens=vb - va,
                      running_max=max(running) if running else None, other_models=others)


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


async def other_traffic(base_url: str, emitted_names: tuple[str, ...], running_names: tuple[str, ...] = (),
                        model: str | None = None) -> tuple[str | None, str | None]:
    """(a warning where another client used truthput's model before any load, a note where only
    other models moved): `quiet_check` over QUIET_CHECK_S; (None, None) when quiet or unreadable."""
    check = await quiet_check(base_url, emitted_names, running_names, model)
    return (None, None) if check is None else (check.warning(), check.note())