"""Closed-loop load: exactly N requests in flight, and a timed window while all N are generating.

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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from truthput.errors import SpecError
from truthput.load.client import StreamClient
from truthput.load.records import RequestRecord
from truthput.load.selfcheck import LagProbe, SelfCheck
from truthput.load.workload import Workload

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


class ClosedLoop:
    """Keeps exactly `concurrency` requests in flight; see module docstring for the window rules.

    Ends the window after `duration_s` (from the window start) or once `max_requests` have been
    issued, whichever comes first; at least one of the two must be given. If the N streams are not
    all generating within `settle_timeout_s`, the window opens anyway and `never_settled` is True
    (the runner must flag such a trial: the batch never reached N).
    """

    def __init__(
        self,
        client: StreamClient,
        workload: Workload,
        concurrency: int,
        duration_s: float | None = None,
        max_requests: int | None = None,
        settle_timeout_s: float = 120.0,
    ) -> None:
        if concurrency < 1:
            raise SpecError(f"closed loop concurrency {concurrency}: must be >= 1")
        if duration_s is None and max_requests is None:
            raise SpecError("closed loop: give duration_s or max_requests (or both)")
        if duration_s is not None and duration_s <= 0:
            raise SpecError(f"closed loop duration_s {duration_s}: must be > 0")
        if max_requests is not None and max_requests < 1:
            raise SpecError(f"closed loop max_requests {max_requests}: must be >= 1")
        self.client = client
        self.workload = workload
        self.concurrency = concurrency
        self.duration_s = duration_s
        self.max_requests = max_requests
        self.settle_timeout_s = settle_timeout_s
        self._next_idx = 0
        self._stop = False
        self._streaming = 0
        self._in_flight = 0
        self.max_in_flight = 0
        self._settled = asyncio.Event()
        self._all_issued = asyncio.Event()
        self._records: list[RequestRecord] = []
        # Bodies are built ahead (the first batch before the load, the rest in a worker thread):
        # an exact-length prompt of 32k tokens costs ~0.1 s of tokenizer time, which would stall
        # the event loop and delay every stream's chunk timestamps if built inline.
        prefetch = max(4 * concurrency, 32)
        self._prefetch = prefetch if max_requests is None else min(prefetch, max_requests)
        self._bodies: dict[int, dict] = {}
        self._next_build = 0
        self._need_more = asyncio.Event()
        self.inline_builds = 0

    def _on_first_token(self, _idx: int) -> None:
        self._streaming += 1
        if self._streaming >= self.concurrency:
            self._settled.set()

    async def _worker(self) -> None:
        client, workload, records = self.client, self.workload, self._records
        while not self._stop:
            if self.max_requests is not None and self._next_idx >= self.max_requests:
                self._all_issued.set()
                return
            idx = self._next_idx
            self._next_idx += 1
            if self.max_requests is not None and self._next_idx >= self.max_requests:
                self._all_issued.set()
            body = self._bodies.pop(idx, None)
            if body is None:  # prefetch fell behind: build it off the loop, and say so
                self.inline_builds += 1
                body = await asyncio.to_thread(workload.body, idx)
            if self._next_build - self._next_idx < self._prefetch // 2:
                self._need_more.set()
            self._in_flight += 1
            if self._in_flight > self.max_in_flight:
                self.max_in_flight = self._in_flight
            try:
                rec = await client.stream(idx, body, on_first_token=self._on_first_token)
            finally:
                self._in_flight -= 1
            if rec.t_first is not None:
                self._streaming -= 1
            records.append(rec)

    def _build(self, start: int, stop: int) -> dict[int, dict]:
        return {i: self.workload.body(i) for i in range(start, stop)}

    async def _refill(self) -> None:
        while not self._stop:
            await self._need_more.wait()
            self._need_more.clear()
            while not self._stop and self._next_build - self._next_idx < self._prefetch:
                start = max(self._next_build, self._next_idx)
                stop = start + max(1, self._prefetch // 2)
                if self.max_requests is not None:
                    stop = min(stop, self.max_requests)
                if stop <= start:
                    return
                self._bodies.update(await asyncio.to_thread(self._build, start, stop))
                self._next_build = stop

    async def _timed(self, cb: Callback | None) -> float:
        t0 = time.monotonic()
        if cb is not None:
            await cb()
        return (t0 + time.monotonic()) / 2.0

    async def _wait_any(self, *aws: Awaitable[object], timeout: float | None) -> None:
        tasks = [asyncio.ensure_future(a) for a in aws]
        try:
            await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()

    async def run(self, on_window_start: Callback | None = None, on_window_end: Callback | None = None) -> LoadResult:
        notes: list[str] = []
        self._bodies = self._build(0, self._prefetch)
        self._next_build = self._prefetch
        if "model" not in self._bodies[0]:
            await self.client.resolve_model()
        refill = asyncio.create_task(self._refill(), name="truthput-body-refill")
        probe = LagProbe()
        probe.start()
        t_start = time.monotonic()
        workers = [asyncio.create_task(self._worker(), name=f"truthput-stream-{k}") for k in range(self.concurrency)]
        workers_done = asyncio.ensure_future(asyncio.gather(*workers, return_exceptions=True))
        t_ws: float | None = None
        t_we: float | None = None
        never_settled = False

        try:
            await self._wait_any(self._settled.wait(), self._all_issued.wait(), asyncio.shield(workers_done),
                                 timeout=self.settle_timeout_s)
            if not self._settled.is_set():
                never_settled = True
                notes.append(
                    f"never settled: fewer than {self.concurrency} streams were generating at once "
                    f"within {self.settle_timeout_s:g} s (or before the requests ran out)"
                )
            window_possible = self._settled.is_set() or not self._all_issued.is_set()
            if window_possible and not workers_done.done():
                t_ws = await self._timed(on_window_start)
                remaining = None if self.duration_s is None else max(0.0, self.duration_s - (time.monotonic() - t_ws))
                await self._wait_any(self._all_issued.wait(), asyncio.shield(workers_done), timeout=remaining)
                t_we = await self._timed(on_window_end)
        except BaseException:
            # A failing callback (e.g. the runner's scrape) or a cancel: stop the load, then re-raise.
            self._stop = True
            for task in (*workers, refill):
                task.cancel()
            await asyncio.gather(*workers, refill, return_exceptions=True)
            await probe.stop()
            raise
        self._stop = True
        self._need_more.set()
        await workers_done
        refill.cancel()
        try:
            await refill
        except asyncio.CancelledError:
            pass
        if self.inline_builds:
            notes.append(
                f"{self.inline_builds} request bodies were not prefetched in time (the workload is slow to build): "
                "those requests started late, so fewer than N were in flight meanwhile"
            )
        for res in workers_done.result():
            if isinstance(res, BaseException):
                notes.append(f"stream worker failed: {type(res).__name__}: {res}")
        t_end = time.monotonic()
        selfcheck = await probe.stop()
        if selfcheck.client_bound:
            notes.append(f"client-bound: {selfcheck.reason}")
        notes.extend(n for n in self.client.notes if n not in notes)
        records = sorted(self._records, key=lambda r: r.idx)
        return LoadResult(
            records=records,
            t_start=t_start,
            t_window_start=t_ws,
            t_window_end=t_we,
            t_end=t_end,
            never_settled=never_settled,
            selfcheck=selfcheck,
            notes=notes,
            max_in_flight=self.max_in_flight,
        )
