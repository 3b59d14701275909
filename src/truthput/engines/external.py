"""A server that is already running somewhere: no lifecycle, and the report says so."""

from __future__ import annotations

import asyncio

from collections.abc import Sequence
from typing import Callable

from truthput.engines.base import StartOutcome


class ExternalEngine:
    kind = "external"
    controlled = False

    port: int | None = None
    cpus: list[int] | None = None
    on_spawn: Callable[[int], None] | None = None

    def __init__(self, url: str, ready_paths: Sequence[str] = ("/v1/models",), timeout_s: float = 10.0) -> None:
        self.base_url = url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.ready_paths = list(ready_paths)
        self.timeout_s = timeout_s
        self.pid: int | None = None

    async def start(self) -> StartOutcome:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for path in self.ready_paths:
                    async with session.get(self.base_url + path) as resp:
                        if resp.status != 200:
                            reason = f"{self.base_url}{path} answered HTTP {resp.status}"
                            return StartOutcome(ok=False, failure_kind="unreachable", reason=reason, root_cause_line=reason)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            reason = f"cannot reach {self.base_url}: {exc.__class__.__name__}: {exc}".rstrip(": ")
            return StartOutcome(ok=False, failure_kind="unreachable", reason=reason, root_cause_line=reason)
        return StartOutcome(ok=True, ready_s=0.0, info={"controlled": False})

    async def stop(self) -> None:
        return None

    def recent_log(self, n: int = 40) -> list[str]:
        return []

    def is_running(self) -> bool:
        return True

    def crashed(self) -> StartOutcome | None:
        return None
