"""A server that truthput starts itself, as a subprocess in its own process group (no shell).

Teardown always happens (success, failure, exception, Ctrl-C): SIGTERM to the whole process group,
SIGKILL after a grace period, then wait until the port is closed, so the next variant never starts
while an old server still holds the port. An `atexit` net kills any group still alive (principle 2:
no orphaned GPU processes).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import sys
import time
from collections import deque
from typing import Callable, Mapping, Sequence

from truthput.engines.base import LogSink, StartOutcome, log_lines
from truthput.engines.ports import base_url, port_is_free, wait_port_free
from truthput.engines.readiness import probe_ready

_LIVE_GROUPS: set[int] = set()


def kill_all_servers() -> int:
    """SIGKILL the process group of every server this process started and has not yet reaped (a
    second stop signal during a slow teardown, and at exit); returns how many groups were signalled."""
    n = len(_LIVE_GROUPS)
    _kill_leftovers()
    return n


def _kill_leftovers() -> None:
    for pgid in list(_LIVE_GROUPS):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _LIVE_GROUPS.discard(pgid)


atexit.register(_kill_leftovers)


def _stat_fields(pid: int | str) -> list[bytes]:
    """/proc/<pid>/stat after the "(comm)" field (index 0 = state, 1 = ppid, 19 = starttime)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def process_started_at(pid: int) -> float | None:
    """When process `pid` started (epoch seconds, from /proc), or None when it does not exist or
    /proc cannot say."""
    try:
        ticks = int(_stat_fields(pid)[19])
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_identity(pid: int) -> str | None:
    """What tells process `pid` apart from any later process that reuses the pid: this boot's id and
    the process's start in clock ticks since boot. Unlike an epoch start time it does not move when
    the wall clock is stepped or a paused VM resumes. None when /proc cannot say."""
    try:
        ticks = int(_stat_fields(pid)[19])
    except (OSError, ValueError, IndexError):
        return None
    boot = _boot_id()
    return None if boot is None else f"{boot}/{ticks}"


def _boot_id() -> str | None:
    """This boot's id. Where the kernel (or a sandbox's emulation of /proc) gives a new one at each
    read, the boot time in /proc/stat stands in: it moves with a stepped clock, so a leftover is
    then at worst left alone, never mistaken."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            first = f.read().strip()
        with open("/proc/sys/kernel/random/boot_id") as f:
            if f.read().strip() == first and first:
                return first
    except OSError:
        pass
    try:
        with open("/proc/stat", "rb") as f:
            return "btime:" + next(line.split()[1].decode() for line in f if line.startswith(b"btime"))
    except (OSError, StopIteration, IndexError):
        return None


def _program_names(pid: int) -> list[str] | None:
    """What /proc says process `pid` runs: argv[0] from its cmdline, else -- where a sandbox's /proc
    gives another process's cmdline empty -- its command name and the file it executes. None when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            first = f.read().split(b"\0", 1)[0]
    except OSError:
        return None
    if first:
        return [first.decode("utf-8", "replace")]
    names = []
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/comm", "rb") as f:
            names.append(f.read().strip().decode("utf-8", "replace"))
    with contextlib.suppress(OSError):
        names.append(os.readlink(f"/proc/{pid}/exe"))
    return [n for n in names if n]


def _runs_program(names: Sequence[str], program: str) -> bool:
    """Whether one of `names` (from `_program_names`) is `program`, by its file name; the kernel's
    command name holds at most 15 bytes of it."""
    want = os.path.basename(program)
    return any(os.path.basename(n) in (want, want[:15]) for n in names)


def stop_leftover_server(pid: int, spawned_at: float, argv: Sequence[str], grace_s: float = 10.0,
                         identity: str | None = None, descendants: dict[str, str] | None = None) -> str:
    """Stop a server a dead truthput left running -- only when `pid` is that very process (never a
    stranger that reused the pid): it runs the recorded program and has the `identity` recorded at
    spawn (`process_identity`), or, for a store without one, started within 5 s of `spawned_at`.
    The server's recorded `descendants` (`server_descendants`) that still are those processes are
    stopped too, whatever became of the leader. Returns "stopped", "gone" or "not ours"."""
    leader = _stop_leftover_leader(pid, spawned_at, argv, grace_s, identity)
    if descendants and stop_recorded_descendants(descendants) and leader == "gone":
        return "stopped"
    return leader


def _stop_leftover_leader(pid: int, spawned_at: float, argv: Sequence[str], grace_s: float,
                          identity: str | None) -> str:
    started = process_started_at(pid)
    if started is None:
        return "gone"
    names = _program_names(pid)
    if names is None:
        return "gone"
    # the recorded identity (boot and start time) is the process itself, even after it exec'd
    # another program (`sh -c "exec server ..."`); without one, its start time and program name
    if identity:
        if process_identity(pid) != identity:
            return "not ours"
    elif abs(started - spawned_at) > 5.0 or not argv or not _runs_program(names, str(argv[0])):
        return "not ours"
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "not ours"
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and process_started_at(pid) is not None:
        time.sleep(0.1)
    if process_started_at(pid) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    return "stopped"


PR_SET_CHILD_SUBREAPER = 36
_SUBREAPER = False


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux): a server's child that
    leaves the server's process group and session is reparented here, not to init, so teardown can
    find and stop it. False where the kernel does not offer it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    global _SUBREAPER
    _SUBREAPER = ok
    return ok


def _children(pid: int) -> list[int]:
    return [child for child, parent in _parents().items() if parent == pid]


def _parents() -> dict[int, int]:
    """pid -> ppid of every process /proc shows."""
    out: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if name.isdigit():
            try:
                out[int(name)] = int(_stat_fields(name)[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def _is_orphan_of_a_server(pid: int) -> bool:
    """A child of this subreaper that is not one of truthput's own helpers (multiprocessing's
    resource tracker, load worker processes): a server's descendant reparented here."""
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False
    return not (b"multiprocessing" in cmd and (b"resource_tracker" in cmd or b"truthput" in cmd))


def server_descendants(leader: int) -> dict[str, str]:
    """Every process that belongs to the server `leader`: its descendants, and -- where this
    truthput is the subreaper -- the orphans its descendants left (reparented here, in their own
    session), each with its identity (`process_identity`). Recorded in the store so that a later
    truthput, after this one was killed, can stop them too and never a stranger reusing a pid."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    roots = [leader]
    if _SUBREAPER:
        me = os.getpid()
        roots += [pid for pid in children.get(me, [])
                  if pid not in _LIVE_GROUPS and pid != leader and _is_orphan_of_a_server(pid)]
    found: dict[str, str] = {}
    todo = [p for r in roots for p in ([r] if r != leader else children.get(r, []))]
    while todo:
        pid = todo.pop()
        ident = process_identity(pid)
        if ident is not None and str(pid) not in found:
            found[str(pid)] = ident
            todo.extend(children.get(pid, []))
    return found


def stop_recorded_descendants(recorded: dict[str, str]) -> int:
    """SIGKILL each recorded descendant of a dead run's server that is still that very process
    (same identity); returns how many were stopped."""
    stopped = 0
    for pid_text, ident in recorded.items():
        pid = int(pid_text)
        if process_identity(pid) != ident:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            stopped += 1
    return stopped


def reap_orphans(keep: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
    """SIGKILL and reap this process's children that are not a live server's group leader in
    `keep` (descendants of stopped servers, reparented to us as subreaper); returns their pids.
    Only in a process that made itself the subreaper (`truthput run`), whose only children are the
    servers it starts: elsewhere (a library caller, a test runner) children are not ours to judge."""
    if not _SUBREAPER:
        return []
    gone = []
    for pid in _children(os.getpid()):
        if pid in keep or pid in _LIVE_GROUPS or not _is_orphan_of_a_server(pid):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            gone.append(pid)
    for pid in gone:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
    return gone


def die_with_parent() -> None:
    """In the child before exec: ask Linux to send SIGTERM when truthput dies (even by kill -9),
    so no server outlives the run that started it. Elsewhere: nothing (best effort)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _classify(exit_code: int | None, lines: Sequence[str], phase: str):
    from truthput.engines.failures import classify

    return classify(exit_code, lines, phase)


class ProcessEngine:
    """Launch argv, stream its output to a sink, wait for readiness, stop it cleanly."""

    def __init__(self, kind: str, argv: Sequence[str], host: str, port: int, env: Mapping[str, str] | None = None,
                 ready_paths: Sequence[str] = ("/health", "/v1/models"), ready_timeout_s: float = 600.0,
                 stop_grace_s: float = 30.0, log_sink: LogSink | None = None, port_pinned: bool = False,
                 cwd: str | None = None, cpus: Sequence[int] | None = None) -> None:
        self.kind = kind
        self.argv = list(argv)
        self.host = host
        self.port = port
        self.base_url = base_url(host, port)
        self.controlled = True
        self.env = dict(env or {})
        self.ready_paths = list(ready_paths)
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.port_pinned = port_pinned
        self.cwd = cwd
        self.cpus = list(cpus) if cpus is not None else None
        """The cores the server runs on (None: the host's)."""
        self._sink = log_sink
        self._lines: deque[str] = deque(maxlen=400)
        self._proc: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task] = []
        self.pid: int | None = None
        self.exit_code: int | None = None

    # ---- logs -------------------------------------------------------------------------------
    async def _pump(self, stream: asyncio.StreamReader, name: str) -> None:
        async for line in log_lines(stream):
            self._lines.append(line)
            if self._sink is not None:
                self._sink(time.monotonic(), name, line)

    on_spawn: Callable[[int], None] | None = None
    """Called with the server's pid as soon as it is spawned (the runner records it in the store)."""

    def recent_log(self, n: int = 40) -> list[str]:
        return list(self._lines)[-n:]

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self) -> StartOutcome:
        if not port_is_free(self.port, self.host):
            where = "pinned in [server].port" if self.port_pinned else "chosen free a moment ago"
            reason = f"port {self.port} on {self.host} is already in use ({where})"
            return StartOutcome(ok=False, failure_kind="port_in_use", reason=reason, root_cause_line=reason)
        from truthput.engines.cpus import server_affinity, server_env

        env = {**os.environ, **server_env(self.kind, self.cpus, self.env)}
        affinity = server_affinity(self.cpus)

        def before_exec() -> None:
            die_with_parent()
            if affinity is not None:
                affinity()

        t0 = time.monotonic()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, env=env, cwd=self.cwd, limit=1 << 20,
                preexec_fn=before_exec if sys.platform.startswith("linux") else None)
        except (FileNotFoundError, PermissionError) as exc:
            reason = f"cannot execute {self.argv[0]!r}: {exc.strerror}"
            return StartOutcome(ok=False, failure_kind="invalid_config", reason=reason, root_cause_line=reason)
        self.pid = self._proc.pid
        _LIVE_GROUPS.add(self._proc.pid)
        if self.on_spawn is not None:
            self.on_spawn(self._proc.pid)  # recorded before it is trusted: a later resume can stop it
        assert self._proc.stdout is not None and self._proc.stderr is not None  # both piped above
        self._readers = [asyncio.create_task(self._pump(self._proc.stdout, "stdout")),
                         asyncio.create_task(self._pump(self._proc.stderr, "stderr"))]
        outcome = await self._wait_ready(t0)
        outcome.pid = self.pid
        if not outcome.ok:
            await self.stop()
        return outcome

    async def _wait_ready(self, t0: float) -> StartOutcome:
        import aiohttp

        deadline = t0 + self.ready_timeout_s
        timeout = aiohttp.ClientTimeout(total=3.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                assert self._proc is not None
                if self._proc.returncode is not None:
                    await self._drain_readers()
                    self.exit_code = self._proc.returncode
                    return self._failure(self._proc.returncode, "startup")
                if await self._probe(session):
                    return StartOutcome(ok=True, ready_s=time.monotonic() - t0)
                if time.monotonic() > deadline:
                    out = self._failure(None, "startup")
                    out.failure_kind = "startup_timeout"
                    out.reason = (f"not ready after {self.ready_timeout_s:.0f} s "
                                  f"({' then '.join(self.ready_paths)} never answered 200)")
                    return out
                try:
                    await asyncio.wait_for(self._proc.wait(), timeout=0.2)
                except asyncio.TimeoutError:
                    pass

    async def _probe(self, session) -> bool:
        return await probe_ready(session, self.base_url, self.ready_paths)

    def _failure(self, exit_code: int | None, phase: str) -> StartOutcome:
        lines = list(self._lines)
        f = _classify(exit_code, lines, phase)
        return StartOutcome(ok=False, failure_kind=f.kind, reason=f.reason, root_cause_line=f.root_cause_line,
                            excerpt=f.excerpt)

    async def _drain_readers(self) -> None:
        if self._readers:
            await asyncio.wait(self._readers, timeout=5.0)

    def crashed(self) -> StartOutcome | None:
        """If the server died under load, the classified failure; else None."""
        if self._proc is not None and self._proc.returncode is not None:
            self.exit_code = self._proc.returncode
            out = self._failure(self._proc.returncode, "load")
            if out.failure_kind in (None, "exited"):
                out.failure_kind = "crash_under_load"
            return out
        return None

    async def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    await asyncio.wait_for(proc.wait(), timeout=self.stop_grace_s)
                except asyncio.TimeoutError:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    await proc.wait()
            # children that outlived the leader (engine cores, workers) die with the group
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            # and descendants that left the group (a daemon in its own session) were reparented to
            # us, the subreaper: they go too
            reap_orphans(keep={p for p in _LIVE_GROUPS if p != proc.pid})
            self.exit_code = proc.returncode
            await self._drain_readers()
            await asyncio.get_running_loop().run_in_executor(None, wait_port_free, self.port, self.host, 30.0)
        finally:
            if proc.returncode is not None:  # else the exit handler still kills its group
                _LIVE_GROUPS.discard(proc.pid)
