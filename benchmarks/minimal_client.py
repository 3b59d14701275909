"""The smallest honest streaming load client (the benchmark's floor for client CPU per token).

Closed loop of N aiohttp streams on uvloop, lines read with aiohttp's own line iterator, each
`data:` line decoded with orjson, tokens taken from the final `usage` chunk. No timing records,
no window, no store: what any client must at least do. Prints one JSON line:
{"requests": .., "ok": .., "tokens": .., "wall_s": ..}.

    python benchmarks/minimal_client.py URL --concurrency 32 --requests 640 --max-tokens 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import orjson


async def run(url: str, concurrency: int, requests: int, max_tokens: int, model: str | None) -> dict:
    root = url.rstrip("/")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        if model is None:
            async with session.get(root + "/v1/models") as r:
                model = (await r.json())["data"][0]["id"]
        counter = iter(range(requests))
        totals = {"ok": 0, "tokens": 0}

        async def worker() -> None:
            for i in counter:
                body = {"model": model, "prompt": f"request {i}: tell me a long story about rivers", "max_tokens": max_tokens,
                        "ignore_eos": True, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
                async with session.post(root + "/v1/completions", data=orjson.dumps(body),
                                        headers={"Content-Type": "application/json"}) as resp:
                    usage = None
                    async for line in resp.content:
                        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                            continue
                        obj = orjson.loads(line[6:])
                        if obj.get("usage"):
                            usage = obj["usage"]
                    if usage:
                        totals["ok"] += 1
                        totals["tokens"] += usage["completion_tokens"]

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.monotonic() - t0
    return {"requests": requests, "ok": totals["ok"], "tokens": totals["tokens"], "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--model", default=None)
    a = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(run(a.url, a.concurrency, a.requests, a.max_tokens, a.model))))


if __name__ == "__main__":
    main()
