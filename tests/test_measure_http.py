"""The real client and closed loop against the known-truth server over HTTP, measured end to end."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from truthput.load.client import ClientConfig, StreamClient
from truthput.load.schedule import ClosedLoop
from truthput.measure.prom import Scrape
from truthput.measure.trial import measure_trial as _measure_trial


def measure_trial(*args, **kwargs) -> dict:
    """The trial's figures as the store keeps them (the results model's JSON document)."""
    return _measure_trial(*args, **kwargs).to_json_dict()

from truthserver import TruthConfig, TruthServer, truth_tokenizer


class FixedBodies:
    """A stand-in for load.workload.Workload: every request asks for the same max_tokens."""

    chain = 1

    def __init__(self, chat: bool, max_tokens: int):
        self.chat, self.max_tokens = chat, max_tokens

    def body(self, i: int) -> dict:
        if self.chat:
            return {"model": "truth", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": self.max_tokens}
        return {"model": "truth", "prompt": f"q{i}", "max_tokens": self.max_tokens}


async def _trial(cfg: TruthConfig, chat: bool, duration_s: float, reset_after_ws: float | None = None):
    server = await TruthServer(cfg).start()
    scrapes: list[Scrape] = []
    rendered: dict[str, float] = {}
    try:
        async with aiohttp.ClientSession() as http:
            async def scrape(phase: str) -> None:
                t0 = time.monotonic()
                async with http.get(server.url + "/metrics") as r:
                    text = await r.text()
                t1 = time.monotonic()
                scrapes.append(Scrape(phase, (t0 + t1) / 2, text))
                rendered[phase] = server.metrics.last_render

            async def on_ws() -> None:
                await scrape("window_start")
                if reset_after_ws is not None:
                    cfg.reset_at = time.monotonic() + reset_after_ws

            await scrape("pre")
            async with StreamClient(ClientConfig(server.url, "chat" if chat else "completions", model="truth")) as c:
                loop = ClosedLoop(c, FixedBodies(chat, cfg.max_tokens), cfg.concurrency, duration_s=duration_s)  # type: ignore[arg-type]
                result = await loop.run(on_window_start=on_ws, on_window_end=lambda: scrape("window_end"))
            await scrape("post")
    finally:
        await server.stop()
    return server, result, scrapes, rendered


def test_real_client_continuous_usage_failed_request_and_tokenizer():
    cfg = TruthConfig(concurrency=4, max_tokens=40, prefill_s=0.02, step_s=0.004, tokens_per_chunk=(1, 3, 2),
                      fail_request=2, fail_after_tokens=10, log_interval_s=0.2)
    server, result, scrapes, rendered = asyncio.run(_trial(cfg, chat=False, duration_s=1.2))
    res = measure_trial(result.records, scrapes, server.log_lines(), (result.t_window_start, result.t_window_end),
                        cfg.concurrency, tokenizer=truth_tokenizer())
    led = server.ledger
    integ = res["integrity"]
    assert integ["holds"] is True, integ["message"]
    assert integ["counter_delta"]["value"] == led.total()
    assert integ["failed_partial_tokens"]["value"] == 10
    tp = res["throughput"]
    # the counter delta is exactly what the server emitted between the two renders
    cw_tokens = tp["counter_window"]["value"] * tp["counter_window"]["seconds"]
    assert cw_tokens == pytest.approx(led.between(rendered["window_start"], rendered["window_end"]))
    # client-side placed-in-time counts differ from the counter only by network delay at the edges
    for key in ("usage_window", "tokenizer_window"):
        assert tp[key]["value"] == pytest.approx(tp["counter_window"]["value"], rel=0.08), key
    rows = {r["method"]: r for r in res["methods"]}
    assert rows["whitespace words (window)"]["error_pct_vs_counter"] == pytest.approx(-25, abs=4)
    assert rows["chunks as tokens (window)"]["cause"] == "unit"
    assert res["requests"]["failed"] == 1 and res["requests"]["ok"] == len(result.records) - 1
    # every ok request got exactly max_tokens per the server's own ledger
    for r in result.records:
        if r.status == "ok":
            assert r.completion_tokens == cfg.max_tokens
    assert res["latency"]["ttft"]["p50"]["value"] >= cfg.prefill_s


def test_real_client_chat_hostile_stream_and_counter_reset():
    cfg = TruthConfig(concurrency=3, max_tokens=24, prefill_s=0.01, step_s=0.004, spec_k=1,
                      accept_pattern=(1, 0, 1), empty_deltas=True, keepalive_every=2, role_first_chunk=True,
                      log_interval_s=0.2)
    server, result, scrapes, rendered = asyncio.run(_trial(cfg, chat=True, duration_s=1.0, reset_after_ws=0.4))
    res = measure_trial(result.records, scrapes, server.log_lines(), (result.t_window_start, result.t_window_end),
                        cfg.concurrency, speculative={"method": "mtp", "num_speculative_tokens": 1})
    led = server.ledger
    cw = res["throughput"]["counter_window"]
    assert cw["resets"] == 1
    assert cw["value"] * cw["seconds"] == pytest.approx(led.between(cfg.reset_at, rendered["window_end"]))
    integ = res["integrity"]
    assert integ["holds"] is False and "reset" in integ["message"]
    # tokens lost to the restart = emitted between the window_start render and the restart
    assert integ["difference"] == -led.between(rendered["window_start"], cfg.reset_at)
    # the role-only first chunk and empty deltas are not tokens: usage sums are exact
    ok = [r for r in result.records if r.status == "ok"]
    assert all(r.completion_tokens == cfg.max_tokens for r in ok)
    assert all(not any(t == "" and k < 0 for t, k in zip(r.chunk_texts, r.chunk_tokens)) for r in ok)
    assert res["spec_decode"]["k"] == 1
    # the role-only first chunk (sent before prefill, with usage 0) must not count as the first token
    assert res["latency"]["ttft"]["p50"]["value"] >= cfg.prefill_s


def test_real_client_metrics_one_scrape_behind_is_flagged():
    cfg = TruthConfig(concurrency=3, max_tokens=30, prefill_s=0.01, step_s=0.004, metrics_lag_scrapes=True)
    server, result, scrapes, rendered = asyncio.run(_trial(cfg, chat=False, duration_s=0.8))
    res = measure_trial(result.records, scrapes, [], (result.t_window_start, result.t_window_end), cfg.concurrency)
    cw = res["throughput"]["counter_window"]
    # the window scrapes saw the states at the pre and window_start scrapes
    assert cw["value"] * cw["seconds"] == pytest.approx(
        server.ledger.between(rendered["pre"], rendered["window_end"]))
    assert res["scrape_intervals"]["stale_suspected"] is True and cw["suspect"] is True
    # the post scrape shows the window_end state: whatever was emitted after it is missing
    assert res["integrity"]["difference"] == -server.ledger.between(rendered["post"], float("inf"))
