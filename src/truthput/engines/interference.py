"""Was the server alone during the window? CPU time of other processes on this host, and on the
GPU other processes and throttling (from the NVML sampler's readings).

Why: a figure measured while something else used the host's cores or the GPU measures the
sharing, not the configuration. On a CPU host (where vLLM-CPU runs) the check is the host's busy
CPU time (/proc/stat) less truthput's own and the server's processes' (its process group, read
from /proc) over the window. Hypervisor steal is not counted: it is not another process here.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

BUSY_FIELDS = (0, 1, 2, 5, 6)
"""user, nice, system, irq, softirq of /proc/stat's cpu line (guest time is inside user)."""

THROTTLE_REASONS = {
    0x4: "power cap (SW)",
    0x8: "hardware slowdown",
    0x20: "thermal slowdown (SW)",
    0x40: "thermal slowdown (HW)",
    0x80: "power brake (HW)",
}
"""NVML clocks-event reasons that slow the GPU below what the configuration would get."""


def _host_busy_ticks() -> int | None:
    try:
        with open("/proc/stat") as fh:
            parts = fh.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != "cpu":
        return None
    values = [int(x) for x in parts[1:]]
    return sum(values[i] for i in BUSY_FIELDS if i < len(values))


def _process_ticks(pid: int, own: bool = False) -> tuple[int, int] | None:
    """(utime + stime + cutime + cstime, process group) of a process, from /proc/<pid>/stat;
    `own`: utime + stime only (not its reaped children's)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()
    try:
        pgrp = int(rest[2])
        ticks = sum(int(rest[i]) for i in ((11, 12) if own else (11, 12, 13, 14)))
    except (IndexError, ValueError):
        return None
    return ticks, pgrp


def descendant_ticks(root: int) -> int:
    """CPU ticks of `root` (with its reaped children's) and of every live process below it (a
    forked load worker, a tokenizer thread pool's helper): truthput's own work. Not its process
    group: a script's other jobs share it (a build started beside `truthput run` in the same shell
    script), and they are another user of the host."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                text = fh.read()
            rest = text[text.rfind(")") + 2:].split()
            parent[int(name)] = int(rest[1])
            ticks[int(name)] = sum(int(rest[i]) for i in (11, 12, 13, 14))
        except (OSError, IndexError, ValueError):
            continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


def group_ticks(pgids: set[int]) -> tuple[int, set[int]]:
    """CPU ticks of every live process in these process groups, and their pids."""
    total, pids = 0, set[int]()
    if not pgids:
        return 0, pids
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        info = _process_ticks(int(name))
        if info is not None and info[1] in pgids:
            total += info[0]
            pids.add(int(name))
    return total, pids


@dataclass
class HostSample:
    busy: int
    ours: int
    server: int
    front: int | None = None


@dataclass
class HostLoad:
    """Host CPU between two samples: cores used by other processes than truthput and the server,
    and by the server itself: all its processes, and the one truthput started (the front end,
    e.g. vLLM's API server, whose engine runs in its children). Where both share one core the front
    end's time is time the engine's steps wait for."""

    server_pgids: set[int] = field(default_factory=set)
    start: HostSample | None = None
    t_start: float | None = None
    seconds: float | None = None
    other_cores: float | None = None
    server_cores: float | None = None
    front_cores: float | None = None
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    reason: str | None = None

    def _sample(self) -> HostSample | None:
        busy = _host_busy_ticks()
        own = _process_ticks(os.getpid())
        if busy is None or own is None:
            return None
        # truthput and what it started, less the server's processes (which it also started)
        server, _ = group_ticks(self.server_pgids)
        ours = max(descendant_ticks(os.getpid()) - server, own[0])
        fronts = [_process_ticks(pgid, own=True) for pgid in self.server_pgids]
        front = sum(f[0] for f in fronts if f) if fronts and all(fronts) else None
        return HostSample(busy=busy, ours=ours, server=server, front=front)

    def begin(self) -> None:
        self.start, self.t_start = self._sample(), time.monotonic()
        if self.start is None:
            self.reason = "no /proc/stat on this host"

    def end(self) -> None:
        stop = self._sample()
        seconds = time.monotonic() - self.t_start if self.t_start is not None else 0.0
        if self.start is None or stop is None or seconds <= 0:
            self.reason = self.reason or "host CPU not sampled"
            return
        hz = os.sysconf("SC_CLK_TCK")
        other = (stop.busy - self.start.busy) - (stop.ours - self.start.ours) - (stop.server - self.start.server)
        self.seconds = seconds
        # /proc ticks are counted at 1/hz and per process at its exit or read, so over a short
        # window they can add up to more than the host has: never report more than all its cores
        self.other_cores = min(max(other, 0) / hz / seconds, float(self.cores))
        if self.server_pgids:
            self.server_cores = min(max(stop.server - self.start.server, 0) / hz / seconds, float(self.cores))
            if stop.front is not None and self.start.front is not None:
                self.front_cores = max(stop.front - self.start.front, 0) / hz / seconds


def server_pids(pgids: set[int]) -> set[int]:
    """Live pids of the server's process groups (for matching GPU process lists)."""
    return group_ticks(pgids)[1]
