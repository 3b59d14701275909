"""What the runner needs from any server, local or not: a URL, a start, a stop, and its log.

A failed start is not an exception that ends the experiment: `start()` returns a `StartOutcome`
with the failure class, and the runner records it and moves on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


@dataclass
class StartOutcome:
    ok: bool
    ready_s: float | None = None
    failure_kind: str | None = None  # see truthput.engines.failures
    reason: str | None = None
    root_cause_line: str | None = None
    excerpt: str | None = None
    pid: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


class LogSink(Protocol):
    def __call__(self, t_mono: float, stream: str, line: str) -> None: ...


class Engine(Protocol):
    kind: str
    base_url: str
    controlled: bool  # False for external servers: the config was not controlled by truthput
    port: int | None
    """The port it listens on (None: not started by truthput)."""
    pid: int | None
    """The server's process (its process group's leader) once started; None where truthput has none."""
    cpus: list[int] | None
    """The cores the server runs on (None: the host's)."""
    on_spawn: Callable[[int], None] | None
    """Called with the pid as soon as the process exists, before it is ready (None: not called)."""

    async def start(self) -> StartOutcome: ...

    async def stop(self) -> None: ...

    def recent_log(self, n: int = 40) -> list[str]: ...

    def is_running(self) -> bool: ...

    def crashed(self) -> StartOutcome | None:
        """If the server died under load, its classified failure; else None."""
        ...


async def log_lines(stream: asyncio.StreamReader) -> AsyncIterator[str]:
    """A server's output line by line, decoded leniently. A line longer than the reader's limit
    (a traceback with a huge repr) comes out in 64 KiB pieces instead of ending the pump."""
    while True:
        try:
            raw = await stream.readline()
        except (asyncio.LimitOverrunError, ValueError):
            raw = await stream.read(65536)
        if not raw:
            return
        yield raw.decode("utf-8", errors="replace").rstrip("\r\n")


async def stop_whatever_happens(engine: Engine) -> None:
    """`engine.stop()` carried to its end even when the awaiting task is cancelled meanwhile.

    A stop signal cancels the run's task; when it lands while a start is being torn down (between
    the server's SIGTERM and its exit), a stop cut short would leave the server running after
    truthput exits. The cancellation is re-raised once the server is stopped."""
    stopping = asyncio.ensure_future(engine.stop())
    try:
        await asyncio.shield(stopping)
    except asyncio.CancelledError:
        await stopping
        raise
