"""A server that runs as a systemd unit, started and stopped with `systemctl [--user]`.

Why: users keep their inference server in a unit (User=, limits, Environment=, journald logging),
and a variant measured outside that unit is not the config they run. For each server start truthput
writes the variant's unit under a run-specific name (the experiment's unit with ExecStart= set to
the variant's argv, truthput's --host/--port, and `Restart=no` so an OOM is a recorded failure and
not a restart loop), `daemon-reload`s, starts it, follows `journalctl -u NAME` into the log sink,
waits for /health then /v1/models, and on stop runs `systemctl stop`, waits until the port is
closed, removes the unit file and `daemon-reload`s again.

systemd tells more than an exit code: `systemctl show` gives ActiveState/SubState/Result,
ExecMainStatus/ExecMainCode and NRestarts. A restart count above zero means the server restarted
behind truthput's back (a drop-in overrode Restart=no, or someone ran `systemctl restart`), so the
engine's counters were reset: it is reported in `StartOutcome.info` and, under load, as a crash.

Log sink streams: "journal" (`journalctl -o cat` lines: the server's output and systemd's own lines
about the unit), "unit" (the unit file as written, line by line, so the store keeps it), and
"systemctl" / "systemd-analyze" / "truthput" (their complaints, teardown notes).

The executables are configurable so that tests can use recorded stand-ins:
TRUTHPUT_SYSTEMCTL / TRUTHPUT_JOURNALCTL (a command, split like a shell would), and the unit
directory with TRUTHPUT_SYSTEMD_UNIT_DIR.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import shlex
import subprocess
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from truthput.engines.base import LogSink, StartOutcome, log_lines
from truthput.engines.ports import base_url, port_is_free, wait_port_free
from truthput.engines.readiness import probe_ready
from truthput.errors import EngineError

SYSTEM_UNIT_DIR = "/etc/systemd/system"
USER_UNIT_DIR = "~/.config/systemd/user"
ENV_SYSTEMCTL = "TRUTHPUT_SYSTEMCTL"
ENV_JOURNALCTL = "TRUTHPUT_JOURNALCTL"
ENV_UNIT_DIR = "TRUTHPUT_SYSTEMD_UNIT_DIR"
ENV_ANALYZE = "TRUTHPUT_SYSTEMD_ANALYZE"  # "none" skips the `systemd-analyze verify` pre-flight

STATUS_PROPERTIES = ("ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainCode", "NRestarts",
                     "MainPID", "Restart")

# systemd's own exit statuses for a service process that never reached ExecStart's program
# (systemd.exec(5), "Process Exit Codes"; src/basic/exit-status.c). They are unit-config problems.
SYSTEMD_EXIT_STATUSES: dict[int, str] = {
    200: "CHDIR", 201: "NICE", 202: "FDS", 203: "EXEC", 204: "MEMORY", 205: "LIMITS", 206: "OOM_ADJUST",
    207: "SIGNAL_MASK", 208: "STDIN", 209: "STDOUT", 210: "CHROOT", 211: "IOPRIO", 212: "TIMERSLACK",
    213: "SECUREBITS", 214: "SETSCHEDULER", 215: "CPUAFFINITY", 216: "GROUP", 217: "USER",
    218: "CAPABILITIES", 219: "CGROUP", 220: "SETSID", 221: "CONFIRM", 222: "STDERR", 224: "PAM",
    225: "NETWORK", 226: "NAMESPACE", 227: "NO_NEW_PRIVILEGES", 228: "SECCOMP", 229: "SELINUX_CONTEXT",
    230: "PERSONALITY", 231: "APPARMOR", 232: "ADDRESS_FAMILIES", 233: "RUNTIME_DIRECTORY",
    235: "CHOWN", 236: "SMACK_PROCESS_LABEL", 237: "KEYRING", 238: "STATE_DIRECTORY",
    239: "CACHE_DIRECTORY", 240: "LOGS_DIRECTORY", 241: "CONFIGURATION_DIRECTORY", 242: "NUMA_POLICY",
    243: "CREDENTIALS", 245: "BPF",
}
# ExecMainCode is the waitid() si_code: CLD_EXITED (status is an exit code), CLD_KILLED / CLD_DUMPED
# (status is a signal number).
CLD_EXITED, CLD_KILLED, CLD_DUMPED = 1, 2, 3

_UNIT_NAME_BAD = re.compile(r"[^A-Za-z0-9:_.-]+")
_LIVE_UNITS: dict[str, "SystemdEngine"] = {}


def _stop_leftovers() -> None:
    """atexit net: no unit truthput wrote outlives the process (principle 2: no orphaned servers)."""
    for engine in list(_LIVE_UNITS.values()):
        engine.stop_sync()


atexit.register(_stop_leftovers)


def unit_name(*parts: object) -> str:
    """A valid, run-specific unit name: truthput-<part>-<part>....service (systemd.unit(5): ASCII
    letters, digits, ":-_.\\", at most 255 characters)."""
    words = [_UNIT_NAME_BAD.sub("-", str(p)).strip("-") for p in parts if p is not None and str(p) != ""]
    stem = "-".join(["truthput", *[w for w in words if w]])
    return stem[: 255 - len(".service")] + ".service"


def default_unit_dir(user: bool) -> Path:
    override = os.environ.get(ENV_UNIT_DIR)
    if override:
        return Path(override).expanduser()
    return Path(USER_UNIT_DIR).expanduser() if user else Path(SYSTEM_UNIT_DIR)


def _tool(env_name: str, default: str) -> list[str]:
    value = os.environ.get(env_name, "").strip()
    return shlex.split(value) if value else [default]


@dataclass(frozen=True)
class UnitStatus:
    """What `systemctl show -p ActiveState,SubState,Result,...` says about a unit."""

    active_state: str = "unknown"
    sub_state: str = "unknown"
    result: str = "unknown"
    exec_main_status: int = 0
    exec_main_code: int = 0
    n_restarts: int = 0
    main_pid: int = 0
    restart: str = ""

    @classmethod
    def from_show(cls, text: str) -> "UnitStatus":
        props: dict[str, str] = {}
        for line in text.splitlines():
            key, eq, value = line.partition("=")
            if eq:
                props[key.strip()] = value.strip()

        def num(key: str) -> int:
            try:
                return int(props.get(key, "0") or 0)
            except ValueError:
                return 0

        return cls(active_state=props.get("ActiveState", "unknown"), sub_state=props.get("SubState", "unknown"),
                   result=props.get("Result", "unknown"), exec_main_status=num("ExecMainStatus"),
                   exec_main_code=num("ExecMainCode"), n_restarts=num("NRestarts"), main_pid=num("MainPID"),
                   restart=props.get("Restart", ""))

    @property
    def stopped(self) -> bool:
        """The unit is down for good (not merely between two automatic restarts)."""
        return self.active_state in ("failed", "inactive")

    @property
    def exit_code(self) -> int | None:
        """The main process's end in subprocess convention: exit code, or minus the signal."""
        if self.exec_main_code == CLD_EXITED:
            return self.exec_main_status
        if self.exec_main_code in (CLD_KILLED, CLD_DUMPED):
            return -self.exec_main_status
        return None

    def describe(self) -> str:
        return (f"ActiveState={self.active_state} SubState={self.sub_state} Result={self.result} "
                f"ExecMainCode={self.exec_main_code} ExecMainStatus={self.exec_main_status} "
                f"NRestarts={self.n_restarts}")


def render_variant_unit(unit_text: str | None, unit_path: str | None, argv: Sequence[str],
                        env: Mapping[str, str] | None, label: str) -> str:
    """The unit to install for one server start: the experiment's unit (or a minimal one when the
    experiment has none) with ExecStart= = argv, Environment= = env, Restart=no, no RestartSec=."""
    from truthput.experiment.unit import parse_unit, render_unit

    if unit_text is None and unit_path:
        try:
            unit_text = Path(unit_path).read_text(encoding="utf-8")
        except OSError as exc:
            raise EngineError(f"[server.systemd_unit].path = {unit_path}: cannot read the unit: "
                              f"{exc.strerror}") from None
    if not unit_text:
        description = label.replace("%", "%%")
        unit_text = f"[Unit]\nDescription=truthput server {description}\n\n[Service]\nType=simple\n"
    unit = parse_unit(unit_text, unit_path)
    return render_unit(unit, list(argv), env=dict(env or {}), experiment_mode=True)


class SystemdEngine:
    """One server start as a transient-by-name systemd unit (see the module docstring)."""

    kind = "systemd"
    controlled = True
    cpus: list[int] | None = None
    """systemd places the unit's processes (its own CPUAffinity= when the unit sets one)."""
    on_spawn: Callable[[int], None] | None = None
    """Not called: the unit's main pid is known once systemd reports it (recorded at readiness)."""

    def __init__(self, name: str, unit_text: str, host: str, port: int, user: bool = False,
                 unit_dir: str | os.PathLike[str] | None = None, ready_paths: Sequence[str] = ("/health", "/v1/models"),
                 ready_timeout_s: float = 600.0, stop_grace_s: float = 30.0, log_sink: LogSink | None = None,
                 port_pinned: bool = False, poll_s: float = 0.25) -> None:
        if not name.endswith(".service"):
            name += ".service"
        self.name = name
        self.unit_text = unit_text
        self.host = host
        self.port = port
        self.base_url = base_url(host, port)
        self.user = user
        self.unit_dir = Path(unit_dir) if unit_dir is not None else default_unit_dir(user)
        self.unit_path = self.unit_dir / name
        self.ready_paths = list(ready_paths)
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.port_pinned = port_pinned
        self.poll_s = poll_s
        self.systemctl = _tool(ENV_SYSTEMCTL, "systemctl")
        self.journalctl = _tool(ENV_JOURNALCTL, "journalctl")
        self.verify_notes: list[str] = []
        self._sink = log_sink
        self._lines: deque[str] = deque(maxlen=400)
        self._journal: asyncio.subprocess.Process | None = None
        self._journal_reader: asyncio.Task | None = None
        self._since: str | None = None
        self._installed = False
        self._started = False
        self._ready_status: UnitStatus | None = None
        self.last_status: UnitStatus | None = None
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.teardown_notes: list[str] = []

    # ---- commands ----------------------------------------------------------------------------
    def _ctl_argv(self, *args: str) -> list[str]:
        scope = ["--user"] if self.user else []
        return [*self.systemctl, *scope, "--no-ask-password", *args]

    async def _ctl(self, *args: str, timeout_s: float = 60.0) -> tuple[int, str, str]:
        argv = self._ctl_argv(*args)
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            raise EngineError(f"cannot run {argv[0]!r} for unit {self.name}: {exc.strerror} "
                              f"(set {ENV_SYSTEMCTL} to the systemctl to use)") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return 124, "", f"{shlex.join(argv)} did not finish in {timeout_s:.0f} s"
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    def _ctl_sync(self, *args: str, timeout_s: float = 30.0) -> tuple[int, str, str]:
        argv = self._ctl_argv(*args)
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 124, "", str(exc)
        return done.returncode, done.stdout, done.stderr

    def _show_args(self) -> list[str]:
        return ["show", "-p", ",".join(STATUS_PROPERTIES), self.name]

    async def status(self) -> UnitStatus:
        _rc, out, _err = await self._ctl(*self._show_args(), timeout_s=30.0)
        self.last_status = UnitStatus.from_show(out)
        return self.last_status

    def status_sync(self) -> UnitStatus:
        _rc, out, _err = self._ctl_sync(*self._show_args())
        self.last_status = UnitStatus.from_show(out)
        return self.last_status

    def _scope_text(self) -> str:
        return "systemctl --user" if self.user else "systemctl"

    # ---- logs --------------------------------------------------------------------------------
    def _emit(self, stream: str, line: str) -> None:
        if stream == "journal":
            self._lines.append(line)
        if self._sink is not None:
            self._sink(time.monotonic(), stream, line)

    def _journal_argv(self, follow: bool) -> list[str]:
        scope = ["--user"] if self.user else []
        return [*self.journalctl, *scope, "-u", self.name, *(["-f"] if follow else []), "-o", "cat", "--no-pager",
                "--since", self._since or "today"]

    async def _follow_journal(self) -> None:
        try:
            self._journal = await asyncio.create_subprocess_exec(
                *self._journal_argv(follow=True), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, start_new_session=True, limit=1 << 20)
        except OSError as exc:
            self._emit("truthput", f"cannot follow the journal with {self.journalctl[0]!r}: {exc.strerror}")
            return
        self._journal_reader = asyncio.create_task(self._pump(self._journal.stdout))

    async def _pump(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        async for line in log_lines(stream):
            self._emit("journal", line)

    async def _settle_journal(self, quiet_s: float = 0.3, max_s: float = 2.0) -> None:
        """Let the follower deliver what the journal already has (it trails the unit slightly)."""
        deadline = time.monotonic() + max_s
        last = len(self._lines), time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if len(self._lines) != last[0]:
                last = len(self._lines), time.monotonic()
            elif time.monotonic() - last[1] >= quiet_s:
                return

    async def _catch_up_journal(self) -> None:
        """A one-shot `journalctl` read: lines the follower has not delivered yet are added."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._journal_argv(follow=False), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL)
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=15.0)
        except (OSError, asyncio.TimeoutError):
            return
        lines = out.decode("utf-8", errors="replace").splitlines()
        seen = len(self._lines) if len(self._lines) < (self._lines.maxlen or 0) else None
        if seen is not None and len(lines) > seen and lines[:seen] == list(self._lines):
            for line in lines[seen:]:
                self._emit("journal", line)

    async def _stop_journal(self) -> None:
        proc = self._journal
        if proc is not None and proc.returncode is None:
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(proc.wait(), timeout=5.0)
            except asyncio.TimeoutError:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                await proc.wait()
        if self._journal_reader is not None:
            await asyncio.wait([self._journal_reader], timeout=5.0)
        self._journal = None
        self._journal_reader = None

    def recent_log(self, n: int = 40) -> list[str]:
        return list(self._lines)[-n:]

    # ---- lifecycle ---------------------------------------------------------------------------
    def _info(self, status: UnitStatus | None) -> dict:
        info: dict = {"unit": self.name, "unit_path": str(self.unit_path), "user": self.user,
                      "unit_text": self.unit_text}
        if self.verify_notes:
            info["verify_warnings"] = list(self.verify_notes)
        if status is not None:
            info["systemd_status"] = asdict(status)
            info["restarts"] = status.n_restarts
            if status.n_restarts > 0:
                info["warning"] = (f"unit {self.name} restarted {status.n_restarts} time(s) (NRestarts="
                                   f"{status.n_restarts}) although truthput wrote Restart=no; "
                                   f"Restart={status.restart or '?'} is in effect (a drop-in overrides it?)")
        return info

    def _install(self) -> None:
        try:
            self.unit_dir.mkdir(parents=True, exist_ok=True)
            self.unit_path.write_text(self.unit_text, encoding="utf-8")
        except OSError as exc:
            hint = "" if self.user else " (run as root, or set [server] user = true for systemctl --user)"
            raise EngineError(f"cannot write unit {self.unit_path}: {exc.strerror}{hint}") from None
        self._installed = True
        _LIVE_UNITS[self.name] = self
        for line in self.unit_text.splitlines():
            self._emit("unit", line)

    async def start(self) -> StartOutcome:
        if not port_is_free(self.port, self.host):
            where = "pinned in [server].port" if self.port_pinned else "chosen free a moment ago"
            reason = f"port {self.port} on {self.host} is already in use ({where})"
            return StartOutcome(ok=False, failure_kind="port_in_use", reason=reason, root_cause_line=reason)
        self._install()
        rejected = await self._verify()
        if rejected is not None:
            await self._uninstall(reload=False)
            return rejected
        try:
            rc, _out, err = await self._ctl("daemon-reload")
        except EngineError:
            await self._uninstall(reload=False)
            raise
        if rc != 0:
            await self._uninstall(reload=False)
            first = (err.strip().splitlines() or ["no message"])[0]
            raise EngineError(f"`{self._scope_text()} daemon-reload` failed (exit {rc}) after writing "
                              f"{self.unit_path}: {first}")
        t0 = time.monotonic()
        self._since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time()))  # whole seconds, rounded down
        await self._follow_journal()
        rc, _out, err = await self._ctl("start", self.name, timeout_s=self.ready_timeout_s)
        self._started = True
        if rc != 0:
            for line in err.strip().splitlines():
                self._emit("systemctl", line)
            outcome = await self._failure("startup", extra_lines=err.strip().splitlines())
        else:
            outcome = await self._wait_ready(t0)
        if not outcome.ok:
            await self.stop()
        return outcome

    async def _verify(self) -> StartOutcome | None:
        """`systemd-analyze verify` on the written unit before systemd sees it: a unit systemd would
        refuse (bad setting, ExecStart= not executable) is an invalid_config failure with systemd's
        own line; other remarks go to info["verify_warnings"]. Skipped where systemd-analyze is absent."""
        import shutil

        setting = os.environ.get(ENV_ANALYZE, "").strip()
        if setting.lower() == "none":
            return None
        tool = shlex.split(setting) if setting else ([found] if (found := shutil.which("systemd-analyze")) else None)
        if not tool:
            return None
        try:
            proc = await asyncio.create_subprocess_exec(*tool, "verify", str(self.unit_path),
                                                        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), timeout=30.0)
        except (OSError, asyncio.TimeoutError):
            return None
        lines = [ln for ln in (err + out).decode(errors="replace").splitlines() if ln.strip()]
        fatal = proc.returncode != 0 and any(
            k in ln for ln in lines for k in ("bad unit file setting", "fatal error", "is not executable",
                                              "Neither a valid executable"))
        if not fatal:
            self.verify_notes = lines
            return None
        for line in lines:
            self._emit("systemd-analyze", line)
        root = next((ln for ln in lines if self.name in ln or str(self.unit_path) in ln), lines[0]).strip()
        reason = f"systemd-analyze verify rejects the variant's unit {self.name}: {root}"
        return StartOutcome(ok=False, failure_kind="invalid_config", reason=reason, root_cause_line=root,
                            excerpt="\n".join(lines), info=self._info(None))

    async def _wait_ready(self, t0: float) -> StartOutcome:
        import aiohttp

        deadline = t0 + self.ready_timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3.0)) as session:
            while True:
                status = await self.status()
                if status.stopped:
                    return await self._failure("startup")
                if status.active_state == "active" and await self._probe(session):
                    self._ready_status = status
                    self.pid = status.main_pid or None
                    return StartOutcome(ok=True, ready_s=time.monotonic() - t0, pid=self.pid, info=self._info(status))
                if time.monotonic() > deadline:
                    out = await self._failure("startup", status=status)
                    out.failure_kind = "startup_timeout"
                    out.reason = (f"unit {self.name} not ready after {self.ready_timeout_s:.0f} s "
                                  f"({' then '.join(self.ready_paths)} never answered 200; {status.describe()})")
                    return out
                await asyncio.sleep(self.poll_s)

    async def _probe(self, session) -> bool:
        return await probe_ready(session, self.base_url, self.ready_paths)

    async def _failure(self, phase: str, status: UnitStatus | None = None,
                       extra_lines: Sequence[str] = ()) -> StartOutcome:
        status = status or await self.status()
        await self._settle_journal()
        await self._catch_up_journal()
        self.exit_code = status.exit_code
        self.pid = status.main_pid or self.pid
        return self._classified(status, phase, extra_lines)

    def _classified(self, status: UnitStatus, phase: str, extra_lines: Sequence[str] = ()) -> StartOutcome:
        from truthput.engines.failures import classify, find_root_cause

        lines = list(self._lines) + list(extra_lines)
        code = status.exit_code if status.stopped else None
        f = classify(code, lines, phase)
        kind, reason, root, excerpt = f.kind, f.reason, f.root_cause_line, f.excerpt
        specific = find_root_cause(lines) is not None
        special = SYSTEMD_EXIT_STATUSES.get(status.exec_main_status) if status.exec_main_code == CLD_EXITED else None
        if not specific:
            if status.result == "oom-kill":
                kind = "oom"
                reason = f"unit {self.name} was killed for running out of memory (systemd Result=oom-kill)"
            elif special is not None and status.stopped:
                kind = "oom" if special == "MEMORY" else "invalid_config"
                root = self._systemd_line(lines) or root
                reason = (f"systemd could not run the unit's ExecStart= (status={status.exec_main_status}/{special}, "
                          f"see systemd.exec(5)){': ' + root if root else ''}")
            elif status.result == "start-limit-hit":
                reason = f"unit {self.name} restarted too often and systemd gave up (Result=start-limit-hit)"
            elif status.result == "timeout" and phase == "startup":
                kind = "startup_timeout"
        return StartOutcome(ok=False, failure_kind=kind, reason=f"{reason} [{self.name}: {status.describe()}]",
                            root_cause_line=root, excerpt=excerpt, pid=status.main_pid or self.pid,
                            info=self._info(status))

    def _systemd_line(self, lines: Sequence[str]) -> str | None:
        """systemd's own line on why the unit's process did not run ("NAME: Failed to locate
        executable ...", "NAME: Failed at step USER spawning ..."), else its "Main process exited"."""
        mine = f"{self.name}: "
        for line in lines:
            if line.startswith(mine + "Failed") and "Failed with result" not in line:
                return line.strip()
        return next((ln.strip() for ln in reversed(lines) if ln.startswith(mine + "Main process exited")), None)

    def is_running(self) -> bool:
        return self._started and self.status_sync().active_state == "active"

    def crashed(self) -> StartOutcome | None:
        """If the unit died or restarted under load (its counters reset), the classified failure."""
        if not self._started:
            return None
        status = self.status_sync()
        ready = self._ready_status
        new_pid = ready is not None and bool(ready.main_pid and status.main_pid and status.main_pid != ready.main_pid)
        restarted = ready is not None and (status.n_restarts > ready.n_restarts or new_pid)
        if status.active_state == "active" and not restarted:
            return None
        self.exit_code = status.exit_code
        out = self._classified(status, "load")
        if out.failure_kind in (None, "exited", "request_errors"):
            out.failure_kind = "crash_under_load"
        if restarted and ready is not None:
            out.reason = (f"unit {self.name} restarted under load (NRestarts {ready.n_restarts} -> "
                          f"{status.n_restarts}, MainPID {ready.main_pid} -> {status.main_pid}): the server's "
                          f"counters were reset; {out.reason}")
        return out

    async def stop(self) -> None:
        if not self._installed:
            return
        try:
            if self._started:
                rc, _out, err = await self._ctl("stop", self.name, timeout_s=self.stop_grace_s + 10.0)
                if rc != 0:
                    self.teardown_notes.append(f"systemctl stop {self.name}: exit {rc}: {err.strip()[:200]}")
                    await self._ctl("kill", "--signal=SIGKILL", self.name, timeout_s=15.0)
                    await self._ctl("stop", self.name, timeout_s=30.0)
                loop = asyncio.get_running_loop()
                freed = await loop.run_in_executor(None, wait_port_free, self.port, self.host, 30.0)
                if not freed:
                    self.teardown_notes.append(f"port {self.port} still open 30 s after stopping {self.name}")
                status = await self.status()
                if self.exit_code is None:
                    self.exit_code = status.exit_code
                await self._settle_journal(quiet_s=0.2, max_s=1.0)
                await self._ctl("reset-failed", self.name, timeout_s=15.0)
        finally:
            await self._stop_journal()
            await self._uninstall(reload=True)
        for note in self.teardown_notes:
            self._emit("truthput", note)

    async def _uninstall(self, reload: bool) -> None:
        try:
            self.unit_path.unlink(missing_ok=True)
        except OSError as exc:
            self.teardown_notes.append(f"cannot remove {self.unit_path}: {exc.strerror}")
        self._installed = False
        _LIVE_UNITS.pop(self.name, None)
        if reload:
            try:
                rc, _out, err = await self._ctl("daemon-reload")
            except EngineError as exc:
                rc, err = 127, str(exc)
            if rc != 0:
                self.teardown_notes.append(f"daemon-reload after removing {self.name}: exit {rc}: {err.strip()[:200]}")

    def stop_sync(self) -> None:
        """Blocking teardown for the atexit net (no event loop there)."""
        if not self._installed:
            return
        if self._started:
            self._ctl_sync("stop", self.name, timeout_s=self.stop_grace_s + 10.0)
            self._ctl_sync("reset-failed", self.name)
        if self._journal is not None and self._journal.returncode is None:
            try:
                os.killpg(self._journal.pid, 9)
            except ProcessLookupError:
                pass
        try:
            self.unit_path.unlink(missing_ok=True)
        except OSError:
            pass
        self._installed = False
        _LIVE_UNITS.pop(self.name, None)
        self._ctl_sync("daemon-reload")
