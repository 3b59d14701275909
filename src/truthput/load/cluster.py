"""Load from several nodes of a Ray cluster, merged into one exact result.

The same split and the same window protocol as the local worker processes (truthput.load.workers):
worker k sends the bodies of global request indices k, k+N, ...; a worker reports `settled` when
all of its streams are generating, the driver opens the window (its own scrape) only when every
worker has settled, and ends it for all. What differs is the clock: a node's monotonic clock is not
the driver's. Before any load, each worker's offset to the driver is measured the NTP way (the
driver reads its clock, asks the worker for its own, reads its clock again; the offset is the
worker's reading minus the midpoint, the uncertainty half the round trip; the best of many tries
is kept) and every time the worker records is moved onto the driver's clock. The offsets and their
uncertainties travel with the result as notes: every figure placed in the window by client
timestamps carries that uncertainty.

Which URL a worker targets: the one the user gave, never another. A loopback URL names the node
itself, so with one, workers go only to nodes on the driver's host; a server elsewhere is loaded
from other nodes only through an address the user passes explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from truthput.cluster import lost_errors
from truthput.errors import MeasurementError, InputError
from truthput.load.client import ClientConfig
from truthput.load.schedule import LoadResult
from truthput.load.workers import Callback, TrialLoad, coordinate, in_global_indices, merge_results, part_loop, share
from truthput.load.workload import Workload

PINGS = 25
POLL_S = 0.02


def is_loopback(url: str) -> bool:
    from truthput.cluster import is_loopback_host

    return is_loopback_host(urlparse(url).hostname or "")


@dataclass(frozen=True)
class ClockOffset:
    """A worker's monotonic clock minus the driver's, and how sure that is (half the best round trip)."""

    worker: int
    node: str
    offset_s: float
    uncertainty_s: float
    pings: int

    def note(self) -> str:
        return (f"worker {self.worker} on node {self.node}: clock offset {self.offset_s * 1e3:+.3f} ms "
                f"± {self.uncertainty_s * 1e3:.3f} ms (best of {self.pings} round trips); its timestamps "
                "are moved onto the driver's clock, and window figures from client timestamps carry this "
                "uncertainty")


class LoadWorkerImpl:
    """One load worker on one node (made a Ray actor by `cluster.actor_class`). `skew_s` adds a known
    offset to every time it reports, as if its clock were another machine's (for checking that
    the driver recovers it)."""

    def __init__(self, cfg: ClientConfig, k: int, skew_s: float = 0.0) -> None:
        self.cfg, self.k, self.skew = cfg, k, skew_s
        self.client: Any = None
        self.msgs: list[tuple[Any, ...]] = []
        self.task: asyncio.Task[Any] | None = None
        self.opened = asyncio.Event()
        self.ended = False
        self.load: Any = None

    async def clock(self) -> float:
        return time.monotonic() + self.skew

    async def trial(self, workload: Workload, part: TrialLoad, n_active: int) -> None:
        if self.client is None:
            from truthput.load.client import StreamClient, prepare_load_process

            prepare_load_process()
            self.client = StreamClient(self.cfg)
            await self.client.__aenter__()
        self.opened, self.ended, self.load = asyncio.Event(), False, None
        self.task = asyncio.get_running_loop().create_task(self._trial(workload, part, n_active))

    async def _trial(self, workload: Workload, part: TrialLoad, n_active: int) -> None:
        k = self.k
        try:
            load = part_loop(self.client, workload, part, k, n_active)
            self.load = load
            if self.ended:
                load.end_window()

            async def window_start() -> None:
                self.msgs.append(("settled", k))
                await self.opened.wait()

            async def window_end() -> None:
                self.msgs.append(("window_end", k))

            res = in_global_indices(await load.run(window_start, window_end), load.workload, k)
            self.msgs.append(("result", k, shift(res, self.skew)))
        except Exception as exc:  # noqa: BLE001 - reported to the driver as one line
            self.msgs.append(("error", k, f"load worker {k}: {type(exc).__name__}: {exc}"))

    async def open(self) -> None:
        self.opened.set()

    async def end(self) -> None:
        self.opened.set()
        self.ended = True
        if self.load is not None:
            self.load.end_window()

    async def poll(self) -> list[tuple[Any, ...]]:
        msgs, self.msgs = self.msgs, []
        return msgs

    async def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.__aexit__(None, None, None)
            self.client = None


def shift(res: LoadResult, by: float) -> LoadResult:
    """`res` with every time moved by `by` seconds (records, chunks, the result's own marks)."""
    if not by:
        return res
    for r in res.records:
        r.t_start += by
        r.t_end += by
        if r.t_first is not None:
            r.t_first += by
        for i in range(len(r.chunk_times)):
            r.chunk_times[i] += by

    def moved(t: float | None) -> float | None:
        return None if t is None else t + by

    return dataclasses.replace(res, t_start=res.t_start + by, t_end=res.t_end + by,
                               t_window_start=moved(res.t_window_start), t_window_end=moved(res.t_window_end))


class RayLoadPool:
    """N load workers spread over the cluster's nodes, driven as one (same interface as
    truthput.load.workers.WorkerPool)."""

    def __init__(self, cfg: ClientConfig, n: int, address: str | None = None,
                 skews: dict[int, float] | None = None) -> None:
        if n < 1:
            raise InputError(f"--workers {n}: must be >= 1")
        self.cfg, self.n, self.address = cfg, n, address
        self.skews = dict(skews or {})
        self.workers: list[Any] = []
        self.offsets: list[ClockOffset] = []
        self.ray: Any = None

    async def start(self) -> RayLoadPool:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from truthput.cluster import actor_class, connect, nodes_from_ray

        self.ray = connect(self.address)
        here = self.ray.util.get_node_ip_address()
        nodes = nodes_from_ray(self.ray)
        if is_loopback(self.cfg.base_url):
            nodes = [n for n in nodes if n.address == here]
            if not nodes:
                raise InputError(f"--executor ray: {self.cfg.base_url} is loopback, and no node of the cluster is on "
                                "this host; pass the server's address as every node reaches it")
        nodes.sort(key=lambda n: (not n.head, n.node_id))
        cls = actor_class(self.ray, LoadWorkerImpl, num_cpus=0, max_restarts=0)
        for k in range(self.n):
            node = nodes[k % len(nodes)]
            w = cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote(
                self.cfg, k, self.skews.get(k, 0.0))
            self.workers.append((w, node))
        self.offsets = [await self._offset(k, w, node.node_id[:12]) for k, (w, node) in enumerate(self.workers)]
        return self

    async def _offset(self, k: int, worker: Any, node: str) -> ClockOffset:
        best: tuple[float, float] | None = None
        for _ in range(PINGS):
            t0 = time.monotonic()
            tw = await worker.clock.remote()
            t1 = time.monotonic()
            rtt = t1 - t0
            if best is None or rtt < best[0]:
                best = (rtt, tw - (t0 + t1) / 2)
        assert best is not None
        return ClockOffset(k, node, best[1], best[0] / 2, PINGS)

    def notes(self) -> list[str]:
        return [o.note() for o in self.offsets]

    def close(self) -> None:
        for w, _node in self.workers:
            with contextlib.suppress(Exception):
                self.ray.kill(w, no_restart=True)
        self.workers = []

    async def run(self, workload: Workload, load: TrialLoad, on_window_start: Callback | None = None,
                  on_window_end: Callback | None = None) -> LoadResult:
        if not self.workers:
            raise MeasurementError("ray load workers: not started (await RayLoadPool.start() first)")
        parts = share(load, self.n, workload.chain)
        n_active = len(parts)
        active = [w for w, _ in self.workers[:n_active]]
        lost = lost_errors(self.ray)
        pending: list[tuple[Any, ...]] = []

        async def send_all(msg: tuple[Any, ...]) -> None:
            method = {"open": "open", "end": "end"}[msg[0]]
            await asyncio.gather(*(getattr(w, method).remote() for w in active), return_exceptions=True)

        async def next_msg(timeout: float | None) -> tuple[Any, ...] | None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not pending:
                try:
                    batches = await asyncio.gather(*(w.poll.remote() for w in active))
                except lost as exc:
                    return ("died", -1, f"died: a load worker's node died mid-trial ({type(exc).__name__})")
                for batch in batches:
                    for msg in batch:
                        if msg[0] == "result":  # onto the driver's clock
                            msg = ("result", msg[1], shift(msg[2], -self.offsets[msg[1]].offset_s))
                        pending.append(msg)
                if pending:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                await asyncio.sleep(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic())))
            return pending.pop(0)

        await asyncio.gather(*(w.trial.remote(workload, parts[k], n_active) for k, w in enumerate(active)))
        results, t_ws, t_we, notes = await coordinate(n_active, load, send_all, next_msg, on_window_start,
                                                      on_window_end)
        merged = merge_results([results[k] for k in range(n_active)], t_ws, t_we, notes)
        merged.notes.extend(o.note() for o in self.offsets[:n_active])
        return merged
