"""The check before any load (issue 62): long enough to see a client that sends a request every few
seconds, read for truthput's own model (another model's traffic is said, not flagged), and a request
running on a server whose counter moves only at request end is seen.

Known truth: a FAKE /metrics (aiohttp, here) whose counters move on a set schedule."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from truthput.measure.scrape import QUIET_CHECK_S, quiet_check

EMITTED = ("vllm:generation_tokens_total",)
RUNNING = ("vllm:num_requests_running",)


async def _serve(metrics):  # type: ignore[no-untyped-def]
    t0 = time.monotonic()

    async def handler(_request):  # type: ignore[no-untyped-def]
        return web.Response(text=metrics(time.monotonic() - t0), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _text(mine: float, other: float = 0.0, running: float = 0.0) -> str:
    return ("# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="m"}} {mine}\n'
            f'vllm:generation_tokens_total{{model_name="other"}} {other}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {running}\n')


def _check(metrics, seconds=QUIET_CHECK_S, model="m"):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        runner, url = await _serve(metrics)
        try:
            return await quiet_check(url, EMITTED, RUNNING, model, seconds)
        finally:
            await runner.cleanup()
    return asyncio.run(go())


def test_a_client_that_sends_every_few_seconds_is_seen():
    # 64 tokens land at 1.8 s (a request every few seconds): a 1 s look sees nothing, the check sees it
    metrics = lambda t: _text(1000 + (64 if t >= 1.8 else 0))  # noqa: E731
    assert _check(metrics, seconds=1.0).warning() is None
    check = _check(metrics)
    assert check.tokens == 64 and "rose by 64" in check.warning()
    assert check.seconds == pytest.approx(QUIET_CHECK_S, abs=0.3)


def test_another_models_traffic_is_said_not_flagged():
    check = _check(lambda t: _text(1000, other=500 + 100 * t))
    assert check.warning() is None
    assert "other models" in check.note() and "other" in check.note()


def test_a_running_request_is_seen_before_its_tokens_are_counted():
    # llama.cpp's counter moves at request end: a request in flight shows only in the running gauge
    check = _check(lambda t: _text(1000, running=1 if 0.5 <= t < 2.5 else 0))
    assert check.tokens == 0 and "up to 1 of its requests running" in check.warning()


def test_a_quiet_server_is_quiet():
    check = _check(lambda t: _text(1000, other=7))
    assert check.warning() is None and check.note() is None
