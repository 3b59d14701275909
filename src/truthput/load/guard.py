"""The output guard's requests: the same fixed prompts at temperature 0 to every variant, so that a
variant that changes greedy output (a quantisation, a broken speculative setting) is seen.

`truthput.analyze.guard` compares what came back."""

from __future__ import annotations

from typing import Any

from truthput.load.client import StreamClient

SUBJECTS = ("the history of the printing press", "how a bicycle gear works", "why the sky is blue",
            "the rules of chess", "how bread rises", "the water cycle", "how a compiler works", "tides")


def guard_body(endpoint: str, max_tokens: int, i: int) -> dict[str, Any]:
    """The i-th guard request: greedy, seeded, a fixed length whatever the model would say."""
    prompt = f"Explain {SUBJECTS[i % len(SUBJECTS)]} in plain words, step by step."
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "seed": 0, "ignore_eos": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


async def guard_texts(client: StreamClient, endpoint: str, max_tokens: int, prompts: int) -> list[str]:
    """The text each guard prompt got back, or `<error: ...>` where its request failed."""
    texts = []
    for i in range(prompts):
        rec = await client.stream(i, guard_body(endpoint, max_tokens, i))
        texts.append(rec.text if rec.status == "ok" else f"<error: {rec.error}>")
    return texts
