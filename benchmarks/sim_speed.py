"""Benchmark: how many streamed tokens per second the simulator serves, per second of its own CPU.

Starts `python -m truthput.sim serve` as a subprocess with a FAST FAKE efficiency profile (step
times near zero, so the server's own CPU cost is what binds), streams N concurrent requests with
truthput's own client and prints tokens/s as the client received them and as the server's counter
counted them (they must agree), plus the server process's CPU seconds (one core at most: the
server is single-threaded). The simulator is every test's engine: it should serve well over
10,000 tokens per server-CPU second at 256 streams (16-22k on the 2-core CI hosts).

    python benchmarks/sim_speed.py --streams 256 --max-tokens 100
"""

from __future__ import annotations

import argparse
from typing import Any
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(port: int, streams: int, max_tokens: int, chat: bool, pid: int) -> tuple[int, float, float]:
    import aiohttp

    from truthput.load.client import ClientConfig, StreamClient
    from truthput.measure.prom import Scrape, parse_scrape

    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)

        async def counter() -> float:
            async with s.get(url + "/metrics") as r:
                value = parse_scrape(Scrape("bench", 0.0, await r.text())).total("vllm:generation_tokens_total")
            assert value is not None, "the simulator's /metrics has no vllm:generation_tokens_total"
            return value

        before = await counter()
        cfg = ClientConfig(url, endpoint="chat" if chat else "completions")
        async with StreamClient(cfg) as client:
            await client.resolve_model()
            cpu0 = _cpu_seconds(pid)
            t0 = time.monotonic()
            body: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True}
            if chat:
                body["messages"] = [{"role": "user", "content": "tell me a story"}]
            else:
                body["prompt"] = "tell me a story"
            res = await asyncio.gather(*(client.stream(i, dict(body)) for i in range(streams)))
            elapsed = time.monotonic() - t0
            cpu = _cpu_seconds(pid) - cpu0
        after = await counter()
    got = sum(r.completion_tokens or 0 for r in res)
    assert got == after - before == streams * max_tokens, (got, after - before)
    return got, elapsed, cpu


def measure(streams: int, max_tokens: int, spec_tokens: int = 0, chat: bool = False) -> dict:
    """Run the benchmark once; returns tokens, wall seconds and server CPU seconds."""
    port = _free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"format": "truthput-sim-profile/1",
                   "efficiency": {"bw_frac": 1000.0, "flops_frac": 1000.0, "step_overhead_s": 0.0,
                                  "tp_latency_s": 0.0},
                   "metadata": {"note": "FAST FAKE profile: step times near zero, for CPU benchmarks"}}, fh)
        profile = fh.name
    cmd = [sys.executable, "-m", "truthput.sim", "serve", "--sim-gpu", "H100", "--sim-model", "llama-3.1-8b",
           "--max-model-len", "4096", "--port", str(port), "--sim-profile", profile, "--sim-startup-s", "0",
           "--max-num-seqs", str(max(streams, 1)), "--disable-log-stats"]
    if spec_tokens:
        cmd += ["--spec-method", "mtp", "--spec-tokens", str(spec_tokens)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        tokens, elapsed, cpu = asyncio.run(_run(port, streams, max_tokens, chat, proc.pid))
    finally:
        proc.terminate()
        proc.wait(5)
        os.unlink(profile)
    return {"tokens": tokens, "wall_s": elapsed, "server_cpu_s": cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--spec-tokens", type=int, default=0)
    ap.add_argument("--chat", action="store_true")
    args = ap.parse_args(argv)
    m = measure(args.streams, args.max_tokens, args.spec_tokens, args.chat)
    tokens, elapsed, cpu = m["tokens"], m["wall_s"], m["server_cpu_s"]
    print(f"streams={args.streams} max_tokens={args.max_tokens} spec_tokens={args.spec_tokens} chat={args.chat}")
    print(f"tokens={tokens} (client usage == server counter) wall={elapsed:.2f}s "
          f"-> {tokens / elapsed:,.0f} streamed tokens/s; server CPU {cpu:.2f}s "
          f"-> {tokens / max(cpu, 1e-9):,.0f} tokens per server-CPU-second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
