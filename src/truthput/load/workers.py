"""Load from several processes when one core cannot keep up, merged into one exact result.

Why processes: the client's per-chunk work is Python on one event loop; at very high chunk rates
one core saturates and the figures start measuring the client. N worker processes each keep their
share of the streams (concurrency `c` split as c//N, +1 for the first c%N workers; request indices
dealt round-robin, so worker k sends the bodies of global indices k, k+N, k+2N, ...: the same
bodies a single process would send; a workload whose requests go in chains -- a conversation's
turns -- is dealt by whole chains, so each chain's turns stay in one process, in order).

Coordination (the parent only coordinates and scrapes; it sends no requests):
- the workers are forked once, before the parent starts its event loop, and serve many trials
  (start-up CPU is paid once, and nothing of a running loop is inherited);
- a worker reports `settled` when all of ITS streams are generating and then holds its window
  callback until the parent says `open`: the parent opens the window (its `on_window_start`
  scrape) only when ALL workers have settled, so the window opens when all streams across workers
  are generating;
- the parent ends the window (its `on_window_end` scrape) after `duration_s`, or as soon as any
  worker has issued its last request (after that, that worker's concurrency falls), then tells
  every worker `end`;
- records come back pickled; request times are `time.monotonic()`, one system-wide clock on Linux,
  so worker records and parent scrapes compare directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from truthput.errors import MeasurementError, InputError
from truthput.load.client import ClientConfig
from truthput.load.schedule import LoadResult
from truthput.load.selfcheck import SelfCheck
from truthput.load.workload import Workload

Callback = Callable[[], Awaitable[None]]
_SAFETY_S = 24 * 3600.0  # a worker's own window limit; the parent ends windows


@dataclass
class TrialLoad:
    """What load a trial runs: `closed` (concurrency) or `open` (rate, arrival, max_in_flight)."""

    mode: str = "closed"
    concurrency: int = 1
    rate: float | None = None
    arrival: str = "poisson"
    max_in_flight: int | None = None
    duration_s: float | None = None
    max_requests: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("closed", "open"):
            raise InputError(f"load mode {self.mode!r}: expected 'closed' or 'open'")
        if self.duration_s is None and self.max_requests is None:
            raise InputError("load: give a duration or a number of requests")
        if self.mode == "open" and not (self.rate and self.rate > 0):
            raise InputError(f"open-loop rate {self.rate}: must be > 0 requests/s")


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` split into `parts` integers that differ by at most one (first ones larger)."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def share(load: TrialLoad, n: int, chain: int = 1) -> list[TrialLoad]:
    """Each worker's part of `load` (workers that would get no streams are left out), requests dealt
    in whole chains of `chain` (`StridedWorkload`)."""
    if load.mode == "closed":
        active = min(n, load.concurrency)
        conc = split_evenly(load.concurrency, active)
    else:
        active = n if load.max_in_flight is None else min(n, load.max_in_flight)
        conc = [0] * active
    if load.max_requests is not None:
        active = min(active, load.max_requests)
    caps = split_evenly(load.max_in_flight, active) if load.max_in_flight is not None else [None] * active
    out = []
    for k in range(active):
        reqs = None if load.max_requests is None else sum(
            1 for g in range(load.max_requests) if (g // chain) % active == k)
        out.append(dataclasses.replace(
            load,
            concurrency=conc[k] if load.mode == "closed" else 1,
            rate=None if load.rate is None else load.rate / active,
            max_in_flight=caps[k],
            duration_s=None if load.duration_s is None else _SAFETY_S,
            max_requests=reqs,
            seed=load.seed * 1009 + k,
        ))
    return out


class StridedWorkload:
    """Worker k of n: its j-th request is the base workload's request k + n*j -- dealt by whole
    chains where the base's requests go in chains (`Workload.chain`): chain k, k+n, ... ."""

    def __init__(self, base: Workload, k: int, n: int) -> None:
        self.base, self.k, self.n = base, k, n
        self.chain = base.chain

    def global_index(self, j: int) -> int:
        """The base workload's index of this worker's j-th request."""
        c = self.chain
        return c * (self.k + self.n * (j // c)) + j % c

    def body(self, j: int) -> dict[str, Any]:
        return self.base.body(self.global_index(j))


def _watch(loop: asyncio.AbstractEventLoop, conn: Any, callback: Callable[[], None]) -> None:
    """Call `callback` when `conn` is readable, keeping the pipe BLOCKING.

    Why: uvloop's add_reader makes the fd non-blocking, and a pickled message larger than the pipe
    buffer (a trial's records) then fails mid-way with EAGAIN in `recv`/`send`. The readiness
    notification does not need O_NONBLOCK; each message is sent whole, so a blocking recv started
    on a readable pipe only waits for the rest of a message already on its way.
    """
    loop.add_reader(conn.fileno(), callback)
    os.set_blocking(conn.fileno(), True)


# ---- worker side -------------------------------------------------------------------------------


def _worker_main(conn: Any, cfg: ClientConfig, k: int) -> None:
    from truthput.load.client import prepare_load_process

    prepare_load_process()
    try:
        asyncio.run(_worker_serve(conn, cfg, k))
    except KeyboardInterrupt:
        pass
    finally:
        conn.close()


async def _worker_serve(conn: Any, cfg: ClientConfig, k: int) -> None:
    from truthput.load.client import StreamClient

    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    current: dict[str, Any] = {}

    def on_readable() -> None:
        # Per-trial state is made when the "trial" message is read, so an "open"/"end" that arrives
        # in the same read (before the trial task ran) applies to that trial, not to the last one.
        try:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "trial":
                    current.clear()
                    current.update(opened=asyncio.Event(), ended=False, load=None)
                    inbox.put_nowait((*msg, dict(current)))
                    continue
                if msg[0] == "open":
                    current["opened"].set()
                elif msg[0] == "end":
                    current["opened"].set()
                    current["ended"] = True
                    if current.get("load") is not None:
                        current["load"].end_window()
                else:
                    inbox.put_nowait(msg)
        except (EOFError, OSError):
            inbox.put_nowait(("quit",))
            loop.remove_reader(conn.fileno())

    _watch(loop, conn, on_readable)
    async with StreamClient(cfg) as client:
        while True:
            msg = await inbox.get()
            if msg[0] != "trial":
                return
            _, workload, part, n_active, _snapshot = msg
            try:
                result = await _worker_trial(conn, client, workload, part, k, n_active, current)
                conn.send(("result", k, result))
            except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
                conn.send(("error", k, f"load worker {k}: {type(exc).__name__}: {exc}"))


async def _worker_trial(conn: Any, client: Any, workload: Workload, part: TrialLoad, k: int, n_active: int,
                        current: dict[str, Any]) -> LoadResult:
    load = part_loop(client, workload, part, k, n_active)
    opened: asyncio.Event = current["opened"]
    current["load"] = load
    if current["ended"]:
        load.end_window()

    async def window_start() -> None:
        conn.send(("settled", k))
        await opened.wait()

    async def window_end() -> None:
        conn.send(("window_end", k))

    return in_global_indices(await load.run(window_start, window_end), load.workload, k)


def part_loop(client: Any, workload: Workload, part: TrialLoad, k: int, n_active: int) -> Any:
    """Worker k's loop over its part of a trial (`share`): its strided share of the workload."""
    from truthput.load.schedule import ClosedLoop, OpenLoop

    wl = StridedWorkload(workload, k, n_active)
    if part.mode == "closed":
        return ClosedLoop(client, wl, part.concurrency, duration_s=part.duration_s,
                          max_requests=part.max_requests)
    return OpenLoop(client, wl, part.rate or 1.0, part.arrival, part.max_in_flight,
                    duration_s=part.duration_s, max_requests=part.max_requests, seed=part.seed)


def in_global_indices(res: LoadResult, wl: StridedWorkload, k: int) -> LoadResult:
    """Worker k's records renumbered as the whole workload's requests."""
    for r in res.records:
        r.idx = wl.global_index(r.idx)
        r.worker = k
    return res


# ---- parent side -------------------------------------------------------------------------------


class WorkerPool:
    """N forked load processes. `start()` before the parent's event loop; `await run(...)` per
    trial; `close()` at the end (also on errors)."""

    def __init__(self, cfg: ClientConfig, n: int) -> None:
        if n < 1:
            raise InputError(f"--workers {n}: must be >= 1")
        self.cfg = cfg
        self.n = n
        self._procs: list[Any] = []
        self._conns: list[Any] = []

    def start(self) -> WorkerPool:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # fork after a tokenizer was used
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        ctx: Any = multiprocessing.get_context(method)  # fork or spawn: typeshed's BaseContext lacks Process
        for k in range(self.n):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(child_end, self.cfg, k), name=f"truthput-load-{k}", daemon=True)
            p.start()
            child_end.close()
            self._procs.append(p)
            self._conns.append(parent_end)
        return self

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send(("quit",))
            except (OSError, BrokenPipeError):
                pass
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
        for c in self._conns:
            c.close()
        self._procs, self._conns = [], []

    async def run(self, workload: Workload, load: TrialLoad, on_window_start: Callback | None = None,
                  on_window_end: Callback | None = None) -> LoadResult:
        if not self._procs:
            raise MeasurementError("load workers: not started (WorkerPool.start() first)")
        parts = share(load, self.n, workload.chain)
        n_active = len(parts)
        conns = self._conns[:n_active]
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

        def reader(k: int) -> Callable[[], None]:
            conn = conns[k]

            def on_readable() -> None:
                try:
                    while conn.poll():
                        inbox.put_nowait(conn.recv())
                except (EOFError, OSError) as exc:
                    loop.remove_reader(conn.fileno())
                    proc = self._procs[k]
                    proc.join(timeout=1.0)
                    inbox.put_nowait(("died", k, f"load worker {k} (pid {proc.pid}) exited mid-trial "
                                                 f"(exit code {proc.exitcode}; pipe: {type(exc).__name__} {exc})"))
            return on_readable

        for k, c in enumerate(conns):
            _watch(loop, c, reader(k))

        async def send_all(msg: tuple[Any, ...]) -> None:
            for c in conns:
                c.send(msg)

        async def next_msg(timeout: float | None) -> tuple[Any, ...] | None:
            try:
                return await asyncio.wait_for(inbox.get(), timeout)
            except asyncio.TimeoutError:
                return None

        try:
            for k, c in enumerate(conns):
                c.send(("trial", workload, parts[k], n_active))
            results, t_ws, t_we, notes = await coordinate(n_active, load, send_all, next_msg, on_window_start,
                                                          on_window_end)
        finally:
            for c in conns:
                try:
                    loop.remove_reader(c.fileno())
                except (ValueError, OSError):
                    pass
        return merge_results([results[k] for k in range(n_active)], t_ws, t_we, notes)


async def coordinate(n_active: int, load: TrialLoad, send_all: Callable[[tuple[Any, ...]], Awaitable[None]],
                     next_msg: Callable[[float | None], Awaitable[tuple[Any, ...] | None]],
                     on_window_start: Callback | None, on_window_end: Callback | None
                     ) -> tuple[dict[int, LoadResult], float | None, float | None, list[str]]:
    """The window protocol between the parent and its active workers, whatever carries the messages
    (pipes to forked processes, or calls to actors on other nodes): wait until every worker has
    settled, open the window (`on_window_start`), end it after `duration_s` or when a worker has
    issued its last request (`on_window_end`), tell the workers, collect every result. Messages in:
    ("settled", k), ("window_end", k), ("result", k, LoadResult), ("error"|"died", k, text);
    `next_msg(timeout)` gives None when the timeout passed. Messages out: ("open",), ("end",)."""
    settled: set[int] = set()
    results: dict[int, LoadResult] = {}
    window_end_seen = False
    errors: list[str] = []
    t_ws = t_we = None
    timer_expired = False
    notes: list[str] = []

    def take(msg: tuple[Any, ...]) -> None:
        nonlocal window_end_seen
        kind = msg[0]
        if kind == "settled":
            settled.add(msg[1])
        elif kind == "window_end":
            window_end_seen = True
        elif kind == "result":
            results[msg[1]] = msg[2]
        else:  # error / died
            errors.append(msg[2])

    async def wait(timeout: float | None) -> None:
        msg = await next_msg(timeout)
        if msg is not None:
            take(msg)

    while len(settled | set(results)) < n_active and not errors:
        await wait(None)
    window = not errors and len(settled) == n_active and not results
    if window:
        t0 = time.monotonic()
        if on_window_start is not None:
            await on_window_start()
        t_ws = (t0 + time.monotonic()) / 2
    await send_all(("open",))
    if window:
        deadline = None if load.duration_s is None else t_ws + load.duration_s  # type: ignore[operator]
        while not window_end_seen and not results and not errors:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                timer_expired = True
                break
            await wait(left)
        t0 = time.monotonic()
        if on_window_end is not None:
            await on_window_end()
        t_we = (t0 + time.monotonic()) / 2
    else:
        notes.append("no window: a worker finished before every worker's streams were generating")
    # A window ended by a worker that issued its last request must not stop the others: every
    # request of a --requests run is sent. A timed window (or a timed run without a window) stops
    # the issuing everywhere.
    if timer_expired or load.max_requests is None:
        await send_all(("end",))
    while len(results) + len(errors) < n_active:
        before = len(errors)
        await wait(None)
        if any(e.startswith("died:") for e in errors[before:]):
            break  # a worker that is gone sends nothing more
    if errors:
        raise MeasurementError("; ".join(e.removeprefix("died: ") for e in errors))
    return results, t_ws, t_we, notes


def merge_results(parts: list[LoadResult], t_ws: float | None, t_we: float | None, notes: list[str]) -> LoadResult:
    """One LoadResult from the workers' results: every record kept, sorted by global index."""
    records = sorted((r for p in parts for r in p.records), key=lambda r: r.idx)
    checks = [p.selfcheck for p in parts]
    reasons = [f"worker {k}: {c.reason}" for k, c in enumerate(checks) if c.client_bound]
    merged = SelfCheck(
        loop_lag_p99_ms=max(c.loop_lag_p99_ms for c in checks),
        loop_lag_max_ms=max(c.loop_lag_max_ms for c in checks),
        cpu_s=sum(c.cpu_s for c in checks),
        cpu_util=max(c.cpu_util for c in checks),  # per worker: each runs one event loop on one core
        client_bound=bool(reasons),
        reason="; ".join(reasons) or None,
        lag_samples=sum(c.lag_samples for c in checks),
    )
    all_notes = list(notes)
    for k, p in enumerate(parts):
        for n in p.notes:
            text = f"worker {k}: {n}"
            if n.startswith("client-bound") or text in all_notes:
                continue
            all_notes.append(text)
    if merged.client_bound:
        all_notes.append(f"client-bound: {merged.reason}")
    return LoadResult(
        records=records,
        t_start=min(p.t_start for p in parts),
        t_window_start=t_ws,
        t_window_end=t_we,
        t_end=max(p.t_end for p in parts),
        never_settled=any(p.never_settled for p in parts) or t_ws is None,
        selfcheck=merged,
        notes=all_notes,
        max_in_flight=sum(p.max_in_flight for p in parts),
        model=next((p.model for p in parts if p.model), None),
    )
