"""Load modes: closed loop (`ClosedLoop`), open loop (`OpenLoop`, Poisson or constant arrivals with
a max in flight) and the saturation sweep rule (`Sweep`). Goodput lives in `truthput.load.goodput`,
worker processes in `truthput.load.workers`.

Closed-loop load: exactly N requests in flight, and a timed window while all N are generating.

Why: steady-state throughput is only meaningful while the server holds the full batch, so the
window opens when every one of the N streams has received its first token (after prefill ramp-up)
and the runner's `/metrics` scrapes bracket that window. Load keeps flowing while the window
callbacks run: the N workers are independent tasks, the callbacks run in the controller task.

Window times: `t_window_start` / `t_window_end` are the midpoints of the awaited callbacks (the
runner scrapes inside them, and stores scrape times as request/response midpoints too); the window
length `duration_s` is measured from `t_window_start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from truthput.errors import InputError
from truthput.load.client import StreamClient
from truthput.load.records import RequestRecord
from truthput.load.selfcheck import LagProbe, SelfCheck

Callback = Callable[[], Awaitable[None]]


@dataclass
class LoadResult:
    """Everything one closed-loop run produced; `records` are sorted by request index."""

    records: list[RequestRecord]
    t_start: float
    t_window_start: float | None
    t_window_end: float | None
    t_end: float
    never_settled: bool
    selfcheck: SelfCheck
    notes: list[str] = field(default_factory=list)
    max_in_flight: int = 0  # client-side count, for the "exactly N" claim
    lateness: list[float] = field(default_factory=list)
    """A replay's sends (open loop): seconds each request left after its scheduled moment."""
    scheduled: int = 0
    """A replay: the requests its schedule holds (those not sent were cut off by the stop)."""
    stopped_early: str | None = None
    """Why the load was ended before its window or requests ran out (the error budget), or None."""
    model: str | None = None
    """The model the requests asked for (as configured, else the first the server listed)."""


def _check_extent(what: str, duration_s: float | None, max_requests: int | None) -> None:
    """A load needs an end: a duration, a request count, or both (clear errors for bad values)."""
    if duration_s is None and max_requests is None:
        raise InputError(f"{what}: give duration_s or max_requests (or both)")
    if duration_s is not None and duration_s <= 0:
        raise InputError(f"{what} duration_s {duration_s}: must be > 0")
    if max_requests is not None and max_requests < 1:
        raise InputError(f"{what} max_requests {max_requests}: must be >= 1")


def refused_connection(error: str | None) -> bool:
    """Whether a request failed because nothing accepted the connection (aiohttp's wording)."""
    return bool(error) and ("Cannot connect to host" in error or "Connection refused" in error)  # type: ignore[operator]


def refused_request(http_status: int | None) -> bool:
    """A 4xx answer other than 408 (timeout) and 429 (too many requests): the server judged the
    request itself (too long a prompt, an unknown model), and the same request gets the same answer,
    so a pause before the next one would only delay the error budget's verdict."""
    return http_status is not None and 400 <= http_status < 500 and http_status not in (408, 429)


ERROR_BUDGET_MIN = 20
ERROR_BUDGET_PER_STREAM = 4


class Requests(Protocol):
    """What a loop sends: request i's body, and how its requests chain (`Workload.chain`, the
    workload itself or one worker's share of it)."""

    @property
    def chain(self) -> int: ...

    def body(self, i: int) -> dict[str, Any]: ...


class BodyPrefetch:
    """Request bodies built ahead of use, off the event loop (a worker thread), so building a long
    exact-length prompt never delays chunk timestamps. `get(i)` falls back to an inline build in a
    thread when the prefetch fell behind (counted in `late`)."""

    def __init__(self, workload: Requests, ahead: int, limit: int | None) -> None:
        self.workload = workload
        self.ahead = ahead
        self.limit = limit
        self.bodies: dict[int, dict[str, Any]] = {}
        self.next_build = 0
        self.next_use = 0
        self.late = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _build(self, start: int, stop: int) -> dict[int, dict[str, Any]]:
        return {i: self.workload.body(i) for i in range(start, stop)}

    def prime(self) -> None:
        """Build the first batch here (before the load starts) and the rest in a thread from now on."""
        stop = self.ahead if self.limit is None else min(self.ahead, self.limit)
        self.bodies = self._build(0, stop)
        self.next_build = stop
        self._task = asyncio.get_running_loop().create_task(self._refill(), name="truthput-body-refill")

    async def _refill(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.next_build - self.next_use < self.ahead:
                start = max(self.next_build, self.next_use)
                stop = start + max(1, self.ahead // 2)
                if self.limit is not None:
                    stop = min(stop, self.limit)
                if stop <= start:
                    return
                self.bodies.update(await asyncio.to_thread(self._build, start, stop))
                self.next_build = stop

    def first(self) -> dict[str, Any]:
        """The first body (to see whether the workload names the model)."""
        return self.bodies.get(0, {})

    async def get(self, i: int) -> dict[str, Any]:
        self.next_use = i + 1
        body = self.bodies.pop(i, None)
        if self.next_build - self.next_use < self.ahead // 2:
            self._wake.set()
        if body is not None:
            return body
        self.late += 1
        return await asyncio.to_thread(self.workload.body, i)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class _Loop:
    """What the closed and the open loop share: the client and the workload, how far the load goes
    (a window's seconds or a number of requests), its lead before the window, the requests in
    flight, the end of the window on request, and how a load's result is made."""

    def __init__(self, kind: str, client: StreamClient, workload: Requests, duration_s: float | None,
                 max_requests: int | None, lead_s: float) -> None:
        _check_extent(kind, duration_s, max_requests)
        self.client = client
        self.workload = workload
        self.duration_s = duration_s
        self.max_requests = max_requests
        self.lead_s = max(0.0, float(lead_s))
        """Seconds the load runs before the window opens: a warm-up inside the trial's own load."""
        self._in_flight = 0
        self.max_in_flight = 0
        self._end_window = asyncio.Event()

    def end_window(self) -> None:
        """End the timed window now (from the same event loop): a coordinator (worker processes)
        decides when the window ends; no new requests are issued after it."""
        self._end_window.set()

    def _result(self, records: list[RequestRecord], t_start: float, window: tuple[float | None, float | None],
                never_settled: bool, selfcheck: SelfCheck, notes: list[str], stopped: str | None) -> LoadResult:
        """The load's result as it ends: what the self-check and the client noticed added to its notes."""
        if selfcheck.client_bound:
            notes.append(f"client-bound: {selfcheck.reason}")
        notes.extend(n for n in self.client.notes if n not in notes)
        return LoadResult(records=sorted(records, key=lambda r: r.idx), t_start=t_start, t_window_start=window[0],
                          t_window_end=window[1], t_end=time.monotonic(), never_settled=never_settled,
                          selfcheck=selfcheck, notes=notes, max_in_flight=self.max_in_flight, model=self.client.model,
                          stopped_early=stopped)


class ClosedLoop(_Loop):
    """Keeps exactly `concurrency` requests in flight; see module docstring for the window rules.

    Ends the window after `duration_s` (from the window start) or once `max_requests` have been
    issued, whichever comes first; at least one of the two must be given. If the N streams are not
    all generating within `settle_timeout_s`, the window opens anyway and `never_settled` is True
    (the runner must flag such a trial: the batch never reached N).
    """

    def __init__(
        self,
        client: StreamClient,
        workload: Requests,
        concurrency: int,
        duration_s: float | None = None,
        max_requests: int | None = None,
        settle_timeout_s: float = 120.0,
        drain: bool = True,
        lead_s: float = 0.0,
    ) -> None:
        if concurrency < 1:
            raise InputError(f"closed loop concurrency {concurrency}: must be >= 1")
        self.error_budget = max(ERROR_BUDGET_MIN, ERROR_BUDGET_PER_STREAM * concurrency)
        """Failed requests after which the load ends at once, when they are also the majority: a
        server that died or rejects everything must not be hammered in a tight loop (each failure
        stored) until the window's end."""
        self._errors = 0
        self._ok = 0
        self._consecutive = 0
        self._abort = asyncio.Event()
        self.stopped_early: str | None = None
        super().__init__("closed loop", client, workload, duration_s, max_requests, lead_s)
        self.drain = drain
        """False: requests still in flight when the window ends are cancelled (the client closes
        them, the server aborts them) instead of awaited -- for a warm-up, whose requests are
        never measured, so the next trial starts without waiting for a drain."""
        self.concurrency = concurrency
        self.settle_timeout_s = settle_timeout_s
        self._next_idx = 0
        self._stop = False
        self._streaming = 0
        self._settled = asyncio.Event()
        self._queued_completions = 0
        """Requests that ran to completion while another stream still waited for its first token."""
        self._cannot_hold = asyncio.Event()
        """Set when the server has shown it does not run `concurrency` requests at once (it finishes
        whole requests while others queue: too few slots or sequences): waiting longer for all N
        streams to generate together cannot succeed, so the window opens at once, flagged."""
        self._all_issued = asyncio.Event()
        self._records: list[RequestRecord] = []
        # Bodies are built ahead (the first batch before the load, the rest in a worker thread):
        # an exact-length prompt of 32k tokens costs ~0.1 s of tokenizer time, which would stall
        # the event loop and delay every stream's chunk timestamps if built inline.
        self._chain = max(1, workload.chain)
        self.bodies = BodyPrefetch(workload, max(4 * concurrency * self._chain, 32), max_requests)
        self.inline_builds = 0

    def _on_first_token(self, _idx: int) -> None:
        self._streaming += 1
        if self._streaming >= self.concurrency:
            self._settled.set()

    def _claim(self, turns: list[int]) -> int | None:
        """The request a stream sends next: the next turn of the chain it holds (a conversation's
        turns go one after another, each once the one before is answered), else the first of the
        next chain (`Workload.chain`); None when the requests have run out."""
        if not turns:
            start, limit = self._next_idx, self.max_requests
            if limit is not None and start >= limit:
                self._all_issued.set()
                return None
            self._next_idx = start + self._chain if limit is None else min(start + self._chain, limit)
            turns.extend(range(start, self._next_idx))
            if limit is not None and self._next_idx >= limit:
                self._all_issued.set()
        return turns.pop(0)

    async def _worker(self) -> None:
        client, bodies, records = self.client, self.bodies, self._records
        turns: list[int] = []
        # a set number of requests is sent whole: a conversation under way when the window closes
        # finishes its turns (drained like the requests in flight); a timed load stops at the window
        finish = self.max_requests is not None and self.drain
        while not self._stop or (turns and finish and not self._abort.is_set()):
            idx = self._claim(turns)
            if idx is None:
                return
            body = await bodies.get(idx)
            self._in_flight += 1
            if self._in_flight > self.max_in_flight:
                self.max_in_flight = self._in_flight
            try:
                rec = await client.stream(idx, body, on_first_token=self._on_first_token)
            finally:
                self._in_flight -= 1
            if rec.t_first is not None:
                self._streaming -= 1
                if (rec.status == "ok" and not self._settled.is_set() and self._in_flight > self._streaming):
                    self._queued_completions += 1
                    if self._queued_completions >= max(2, self.concurrency):
                        self._cannot_hold.set()
            records.append(rec)
            if rec.status == "ok":
                self._ok += 1
                self._consecutive = 0
                continue
            self._errors += 1
            self._consecutive += 1
            refused = refused_connection(rec.error)
            if refused and self._consecutive >= max(3, self.concurrency) and self.stopped_early is None:
                # nothing listens any more: a dead server ends the load at once, no retry loop
                self.stopped_early = (f"the server refused {self._consecutive} connections in a row (it is not "
                                      f"listening: did it exit?); last: {rec.error}")
                self._stop = True
                self._abort.set()
                return
            if self._errors >= self.error_budget and self._errors > self._ok and self.stopped_early is None:
                self.stopped_early = (f"{self._errors} of {self._errors + self._ok} requests failed (error budget "
                                      f"{self.error_budget}); last: {rec.error}")
                self._stop = True
                self._abort.set()
                return
            if refused_request(rec.http_status):
                continue  # the server answered at once that this request is wrong: waiting changes nothing
            # back off a little after consecutive failures (never a tight loop against a dead server)
            await asyncio.sleep(min(1.0, 0.01 * 2 ** min(self._consecutive, 7)))

    async def run(self, on_window_start: Callback | None = None, on_window_end: Callback | None = None) -> LoadResult:
        notes: list[str] = []
        self.bodies.prime()
        if "model" not in self.bodies.first():
            await self.client.resolve_model()
        probe = LagProbe()
        probe.start()
        t_start = time.monotonic()
        workers = [asyncio.create_task(self._worker(), name=f"truthput-stream-{k}") for k in range(self.concurrency)]
        workers_done = asyncio.ensure_future(asyncio.gather(*workers, return_exceptions=True))
        t_ws: float | None = None
        t_we: float | None = None
        never_settled = False

        try:
            await _wait_first(self._settled.wait(), self._all_issued.wait(), asyncio.shield(workers_done),
                                 self._abort.wait(), self._cannot_hold.wait(), timeout=self.settle_timeout_s)
            if self._abort.is_set():
                notes.append(f"load ended early: {self.stopped_early}")
            elif not self._settled.is_set() and self._cannot_hold.is_set():
                never_settled = True
                notes.append(
                    f"never settled: the server ran {self._queued_completions} requests to completion while other "
                    f"streams still waited for their first token, so it does not run {self.concurrency} at once "
                    f"(too few slots or sequences); the window opened after "
                    f"{time.monotonic() - t_start:.1f} s without a steady state"
                )
            elif not self._settled.is_set():
                never_settled = True
                notes.append(
                    f"never settled: fewer than {self.concurrency} streams were generating at once "
                    f"within {self.settle_timeout_s:g} s (or before the requests ran out)"
                )
            window_possible = (self._settled.is_set() or not self._all_issued.is_set()) and not self._abort.is_set()
            if window_possible and self.lead_s > 0 and not workers_done.done():
                await _wait_first(asyncio.shield(workers_done), timeout=self.lead_s)
            if window_possible and not workers_done.done():
                t_ws = await _timed(on_window_start)
                remaining = None if self.duration_s is None else max(0.0, self.duration_s - (time.monotonic() - t_ws))
                await _wait_first(self._all_issued.wait(), asyncio.shield(workers_done), self._end_window.wait(),
                                     self._abort.wait(), timeout=remaining)
                t_we = await _timed(on_window_end)
        except BaseException:
            # A failing callback (e.g. the runner's scrape) or a cancel: stop the load, then re-raise.
            self._stop = True
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await self.bodies.close()
            await probe.stop()
            raise
        self._stop = True
        if not self.drain or self._abort.is_set():
            for task in workers:
                task.cancel()
        await workers_done
        await self.bodies.close()
        if self.bodies.late:
            notes.append(
                f"{self.bodies.late} request bodies were not prefetched in time (the workload is slow to build): "
                "those requests started late, so fewer than N were in flight meanwhile"
            )
        for res in workers_done.result():
            if isinstance(res, BaseException) and not isinstance(res, asyncio.CancelledError):
                notes.append(f"stream worker failed: {type(res).__name__}: {res}")
        selfcheck = await probe.stop()
        return self._result(self._records, t_start, (t_ws, t_we), never_settled, selfcheck, notes, self.stopped_early)


# ---- open loop ---------------------------------------------------------------------------------


class OpenLoop(_Loop):
    """Requests arrive at `rate` per second whatever the server does (open loop), with at most
    `max_in_flight` open at once.

    Why: a closed loop hides queueing (a slow server just gets fewer requests); an arrival process
    shows how latency grows with offered load. Arrivals are `poisson` (exponential gaps from a
    seeded RNG, so a rerun offers the same schedule) or `constant` (1/rate apart). An arrival that
    finds `max_in_flight` requests open waits for a free slot; such arrivals are counted, because
    the offered rate was then not what the server received.

    Window: opens when the first request has finished (the system has gone through one full request
    lifetime, so the in-flight mix is near its steady state), and no sooner than `lead_s` after the
    first arrival (a warm-up inside the same load, so the queue the rate builds is there), and ends when the arrivals end
    (`max_requests` issued) or `duration_s` after it opened; after that the offered load falls.
    """

    def __init__(
        self,
        client: StreamClient,
        workload: Requests,
        rate: float,
        arrival: str = "poisson",
        max_in_flight: int | None = None,
        duration_s: float | None = None,
        max_requests: int | None = None,
        seed: int = 0,
        lead_s: float = 0.0,
        offsets: list[float] | None = None,
    ) -> None:
        if not rate > 0:
            raise InputError(f"open loop rate {rate}: must be > 0 requests/s")
        self.offsets = offsets
        """A trace's replay: each request's send time after the first (`rate` is then its mean)."""
        if offsets is not None:
            max_requests, duration_s = len(offsets), None
        if arrival not in ("poisson", "constant"):
            raise InputError(f"open loop arrival {arrival!r}: expected 'poisson' or 'constant'")
        if max_in_flight is not None and max_in_flight < 1:
            raise InputError(f"open loop max_in_flight {max_in_flight}: must be >= 1")
        super().__init__("open loop", client, workload, duration_s, max_requests, lead_s)
        self.rate = rate
        self.arrival = arrival
        self.max_in_flight_cap = max_in_flight
        self.seed = seed
        self.delayed_arrivals = 0
        self.lateness: list[float] = []
        self.answered: dict[int, asyncio.Event] = {}
        """Request i's event while it is unanswered, for the turn after it (`Workload.chain`); set and
        dropped when it is answered."""
        self.turns_waited = 0
        """Later turns whose arrival came before the turn before them was answered."""
        self.finish_turns = max_requests is not None
        """A set number of requests is sent whole: a later turn held when the arrivals end is still
        sent (not after an abort)."""

    def arrival_offsets(self) -> Iterator[float]:
        """Seconds after the start at which requests 0, 1, ... arrive (deterministic per seed): what
        `run` sends on."""
        import random

        if self.offsets is not None:
            yield from self.offsets
            return
        rng = random.Random(f"truthput-arrivals:{self.seed}")
        t = 0.0
        for k in itertools.count():
            if self.arrival == "constant":
                yield k / self.rate
            else:
                yield t
                t += rng.expovariate(self.rate)

    async def run(self, on_window_start: Callback | None = None, on_window_end: Callback | None = None) -> LoadResult:
        notes: list[str] = []
        records: list[RequestRecord] = []
        ahead = max(64, int(self.rate * 2))
        bodies = BodyPrefetch(self.workload, ahead, self.max_requests)
        bodies.prime()
        if "model" not in bodies.first():
            await self.client.resolve_model()
        first_done = asyncio.Event()
        slots = asyncio.Semaphore(self.max_in_flight_cap) if self.max_in_flight_cap else None
        stop_arrivals = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        client = self.client
        loop = asyncio.get_running_loop()

        errors = [0, 0]  # failed, ok
        budget = max(ERROR_BUDGET_MIN, int(ERROR_BUDGET_PER_STREAM * max(1.0, self.rate)))
        stopped: list[str] = []
        aborted = asyncio.Event()

        async def one(idx: int, body: dict[str, Any]) -> None:
            try:
                rec = await client.stream(idx, body)
            finally:
                self._in_flight -= 1
                if slots is not None:
                    slots.release()
                if idx in self.answered:
                    self.answered.pop(idx).set()
            records.append(rec)
            first_done.set()
            errors[rec.status == "ok"] += 1
            if rec.status != "ok" and errors[0] >= budget and errors[0] > errors[1] and not stopped:
                # the same error budget as the closed loop: a dead server ends the load at once
                stopped.append(f"{errors[0]} of {sum(errors)} requests failed (error budget {budget}); "
                               f"last: {rec.error}")
                self.finish_turns = False
                stop_arrivals.set()
                aborted.set()

        def hold(coro: Coroutine[Any, Any, None], name: str = "truthput-next-turn") -> None:
            task = loop.create_task(coro, name=name)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def send(idx: int, body: dict[str, Any]) -> None:
            hold(one(idx, body), f"truthput-stream-{idx}")

        probe = LagProbe()
        probe.start()
        t_start = time.monotonic()
        arr = loop.create_task(self._arrivals(bodies, slots, stop_arrivals, send, hold), name="truthput-arrivals")
        t_ws: float | None = None
        t_we: float | None = None
        never_settled = False
        try:
            await _wait_first(first_done.wait(), asyncio.shield(arr), timeout=None)
            lead_left = t_start + self.lead_s - time.monotonic()
            if first_done.is_set() and not arr.done() and lead_left > 0:
                await _wait_first(asyncio.shield(arr), aborted.wait(), timeout=lead_left)
            if first_done.is_set() and not arr.done():
                t_ws = await _timed(on_window_start)
                remaining = None if self.duration_s is None else max(0.0, self.duration_s - (time.monotonic() - t_ws))
                await _wait_first(asyncio.shield(arr), self._end_window.wait(), aborted.wait(), timeout=remaining)
                t_we = await _timed(on_window_end)
            else:
                never_settled = True
                notes.append("no window: every arrival was issued before the first request finished "
                             "(too few requests for this rate)")
            stop_arrivals.set()
            await arr
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
        except BaseException:
            stop_arrivals.set()
            for task in (arr, *tasks):
                task.cancel()
            await asyncio.gather(arr, *tasks, return_exceptions=True)
            await bodies.close()
            await probe.stop()
            raise
        await bodies.close()
        selfcheck = await probe.stop()
        if self.delayed_arrivals:
            notes.append(f"{self.delayed_arrivals} arrivals waited for a free slot (max in flight "
                         f"{self.max_in_flight_cap}): the server received less than the offered {self.rate:g} req/s")
        if self.turns_waited:
            notes.append(f"{self.turns_waited} later turns arrived before the turn before them was answered and "
                         "were sent once it was (a conversation goes one turn at a time): the server received less "
                         f"than the offered {self.rate:g} req/s")
        if bodies.late:
            notes.append(f"{bodies.late} request bodies were not prefetched in time")
        result = self._result(records, t_start, (t_ws, t_we), never_settled, selfcheck, notes,
                              stopped[0] if stopped else None)
        result.notes += [f"load ended early: {stopped[0]}"] if stopped else []
        result.lateness, result.scheduled = list(self.lateness), len(self.offsets or ())
        return result

    async def _arrivals(self, bodies: BodyPrefetch, slots: asyncio.Semaphore | None, stop: asyncio.Event,
                        send: Callable[[int, dict[str, Any]], None],
                        hold: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        """Send request k at its arrival offset (`arrival_offsets`; with a cap on requests in flight,
        once a slot is free) until `stop` or the requests run out. A conversation's later turn
        (`Workload.chain`) is sent at its offset or once the turn before it is answered, whichever
        is later: that wait is held apart (`hold`), so the arrivals after it keep their times."""
        t0 = time.monotonic()
        chain = max(1, self.workload.chain)
        for idx, t_next in enumerate(self.arrival_offsets()):
            if stop.is_set() or (self.max_requests is not None and idx >= self.max_requests):
                return
            delay = t0 + t_next - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    return
                except asyncio.TimeoutError:
                    pass
            body = await bodies.get(idx)
            if (idx + 1) % chain:
                self.answered[idx] = asyncio.Event()
            if idx % chain:
                hold(self._next_turn(idx, body, t0 + t_next, slots, stop, send))
            else:
                await self._dispatch(idx, body, t0 + t_next, slots, send)

    async def _next_turn(self, idx: int, body: dict[str, Any], t_due: float, slots: asyncio.Semaphore | None,
                         stop: asyncio.Event, send: Callable[[int, dict[str, Any]], None]) -> None:
        """A later turn: sent once the turn before it is answered (nothing new after `stop`)."""
        before = self.answered.get(idx - 1)  # None: answered already
        if before is not None:
            self.turns_waited += 1
            await before.wait()
        if not stop.is_set() or self.finish_turns:
            await self._dispatch(idx, body, max(t_due, time.monotonic()), slots, send)
        elif idx in self.answered:
            self.answered.pop(idx).set()  # never sent: the turns after it are not either

    async def _dispatch(self, idx: int, body: dict[str, Any], t_due: float, slots: asyncio.Semaphore | None,
                        send: Callable[[int, dict[str, Any]], None]) -> None:
        if slots is not None:
            if slots.locked():
                self.delayed_arrivals += 1
            await slots.acquire()
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        self.lateness.append(max(0.0, time.monotonic() - t_due))
        send(idx, body)


async def _timed(cb: Callback | None) -> float:
    t0 = time.monotonic()
    if cb is not None:
        await cb()
    return (t0 + time.monotonic()) / 2.0


async def _wait_first(*aws: Awaitable[object], timeout: float | None) -> None:
    """Until the first of `aws` completes, or `timeout` seconds have passed by the monotonic clock:
    an event loop fires a timer up to its clock's resolution early (a low-resolution kernel clock
    is a tick of several ms), and a window that closed early would be shorter than asked."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            done, _ = await asyncio.wait(tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if done:
                return
    finally:
        for t in tasks:
            t.cancel()


# ---- sweep -------------------------------------------------------------------------------------


@dataclass
class SweepPoint:
    """One level of a sweep and the throughput the server counter gave for it (None: no figure)."""

    level: float
    throughput: float | None


@dataclass
class Sweep:
    """Increase the load level until throughput stops rising; the saturation point is the lowest
    level within `tolerance` of the best throughput seen.

    Why this rule: past saturation more load only adds queueing (latency), so the useful operating
    point is where throughput first reaches its plateau. Levels double from `start` (concurrency:
    1, 2, 4, ...; rate: r, 2r, 4r, ...) up to `max_level`; the sweep stops after `patience`
    consecutive levels that did not beat the best throughput by more than `tolerance`.
    """

    start: float = 1.0
    max_level: float = 512.0
    factor: float = 2.0
    tolerance: float = 0.05
    patience: int = 1
    integer: bool = True
    points: list[SweepPoint] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.start > 0 or self.max_level < self.start:
            raise InputError(f"sweep: need 0 < start ({self.start}) <= max level ({self.max_level})")
        if not self.factor > 1:
            raise InputError(f"sweep factor {self.factor}: must be > 1")

    def record(self, level: float, throughput: float | None) -> None:
        self.points.append(SweepPoint(level, throughput))

    def _stalled(self) -> int:
        """How many of the latest levels did not raise the best throughput by more than tolerance."""
        best: float | None = None
        stalled = 0
        for p in self.points:
            if p.throughput is None:
                stalled += 1
                continue
            if best is None or p.throughput > best * (1 + self.tolerance):
                stalled = 0
            else:
                stalled += 1
            best = p.throughput if best is None else max(best, p.throughput)
        return stalled

    def next_level(self) -> float | None:
        """The next level to run, or None when the sweep is over."""
        if not self.points:
            return self.start
        if self._stalled() >= self.patience:
            return None
        nxt = self.points[-1].level * self.factor
        if self.integer:
            nxt = float(max(int(self.points[-1].level) + 1, int(round(nxt))))
        if nxt > self.max_level:
            return None
        return nxt

    def saturation(self) -> SweepPoint | None:
        """The lowest level whose throughput is within `tolerance` of the best seen."""
        measured = [(p, p.throughput) for p in self.points if p.throughput is not None]
        if not measured:
            return None
        best = max(t for _, t in measured)
        return min((p for p, t in measured if t >= best * (1 - self.tolerance)), key=lambda p: p.level)

    @property
    def saturated(self) -> bool:
        """True when throughput stopped rising within the sweep (False: it hit max_level still rising)."""
        return self._stalled() >= self.patience
