"""Write the small trace samples bundled in src/truthput/load/data/traces/ (synthetic, made here from
a seeded random.Random: no real traffic): one per format `truthput.load.trace` reads. Their
statistics are in that folder's README; run again to remake them byte for byte.

    .venv/bin/python scripts/make_trace_samples.py
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "truthput" / "load" / "data" / "traces"
WORDS = ("please summarise the report below and list what changed since the last quarter explain why "
         "the figures moved write a short answer for a customer who asked about delivery times").split()


def arrivals(rng: random.Random, n: int, rate: float) -> list[float]:
    """Poisson arrivals at `rate` per second, bursts of 3 at a tenth of the gaps now and then."""
    t, out = 0.0, []
    while len(out) < n:
        burst = 3 if rng.random() < 0.1 else 1
        for _ in range(burst):
            out.append(round(t, 3))
            t += rng.expovariate(rate * (10 if burst > 1 else 1))
    return out[:n]


def mooncake(rng: random.Random) -> None:
    """60 requests over ~30 s; 6 shared 512-token first blocks (a system prompt each), a unique rest."""
    rows, next_id = [], 1000
    for t in arrivals(rng, 60, 2.0):
        group = rng.randrange(6)
        n_in = rng.randint(520, 900)
        blocks = -(-n_in // 512)
        ids = [group] + list(range(next_id, next_id + blocks - 1))
        next_id += blocks - 1
        rows.append({"timestamp": int(t * 1000), "input_length": n_in, "output_length": rng.randint(16, 64),
                     "hash_ids": ids})
    (OUT / "mooncake_sample.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def azure(rng: random.Random) -> None:
    """60 requests over ~30 s: Azure's TIMESTAMP with 7 fraction digits, context and generated tokens."""
    t0 = datetime(2023, 11, 16, 18, 15, 46, tzinfo=timezone.utc)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t in arrivals(rng, 60, 2.0):
        stamp = (t0 + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        lines.append(f"{stamp},{rng.randint(32, 700)},{rng.randint(8, 96)}")
    (OUT / "azure_sample.csv").write_text("\n".join(lines) + "\n")


def burstgpt(rng: random.Random) -> None:
    """60 rows over ~30 s, 3 of them failures (a 0-token response, as BurstGPT records them)."""
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    failed = set(rng.sample(range(60), 3))
    for k, t in enumerate(arrivals(rng, 60, 2.0)):
        req, resp = rng.randint(16, 600), 0 if k in failed else rng.randint(8, 120)
        lines.append(f"{t + 5.0:.3f},ChatGPT,{req},{resp},{req + resp},Conversation log")
    (OUT / "burstgpt_sample.csv").write_text("\n".join(lines) + "\n")


def user_jsonl(rng: random.Random) -> None:
    """40 requests over ~20 s as a gateway logs them: an ISO timestamp and the request's own text."""
    t0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=timezone.utc)
    rows = []
    for t in arrivals(rng, 40, 2.0):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
        rows.append({"timestamp": (t0 + timedelta(seconds=t)).isoformat(), "prompt": text,
                     "max_tokens": rng.randint(16, 64)})
    (OUT / "user_sample.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    for make in (mooncake, azure, burstgpt, user_jsonl):
        make(random.Random(f"truthput-trace-sample:{make.__name__}"))
    print(f"wrote {', '.join(sorted(p.name for p in OUT.glob('*_sample.*')))} to {OUT}")
