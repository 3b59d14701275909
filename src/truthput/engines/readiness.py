"""Readiness: a server is ready when every readiness path answers 200 (vLLM: /health, then /v1/models)."""

from __future__ import annotations

import asyncio
from typing import Sequence


async def probe_ready(session, base_url: str, paths: Sequence[str]) -> bool:
    """One look: True when each path (or absolute URL) answers HTTP 200 right now."""
    import aiohttp

    for path in paths:
        url = path if path.startswith("http") else base_url + path
        try:
            async with session.get(url) as resp:
                if resp.status != 200:
                    return False
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False
    return True
