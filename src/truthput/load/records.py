"""What the load generator hands to measurement: one record per streamed request.

All times are `time.monotonic()` seconds in the client process (the same clock the runner uses
for /metrics scrapes), so request timing and counter windows can be compared directly.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, MutableSequence
from dataclasses import dataclass, field


def float_column() -> MutableSequence[float]:
    """Chunk arrival times: an `array('d')`, not a list of float objects. Why: a trial holds one per
    chunk (164k for the reference load); packed doubles are 8 bytes each instead of a 24-byte
    object plus a pointer, and measurement reads them as one buffer instead of object by object."""
    return array("d")


def int_column() -> MutableSequence[int]:
    """Running token counts, packed like `float_column` (-1 where the server sent none)."""
    return array("q")


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it.

    `chunk_times[i]` is when the i-th SSE data chunk that carried generated text (or a usage
    count increase) arrived; `chunk_tokens[i]` is the server's running `completion_tokens` after
    that chunk when the server sent `continuous_usage_stats`, else -1. `chunk_texts[i]` is the
    text delta of that chunk ("" for usage-only chunks): answer, reasoning or tool-call
    arguments, whichever the chunk carried (the server counts them all as generated tokens). Nothing here is derived: the counting
    methods in `truthput.measure` decide what a token is.
    """

    idx: int
    t_start: float
    t_end: float = 0.0
    t_first: float | None = None
    chunk_times: MutableSequence[float] = field(default_factory=float_column)
    chunk_tokens: MutableSequence[int] = field(default_factory=int_column)
    chunk_texts: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    status: str = "ok"  # "ok" | "error"
    http_status: int | None = None
    error: str | None = None
    worker: int = 0
    server_decode_tps: float | None = None
    """The server's own per-request decode rate where it reports one (llama.cpp's
    `timings.predicted_per_second`: tokens / decode time, no prompt processing or queueing)."""
    cached_tokens: int | None = None
    """Prompt tokens the server served from its prefix cache for this request, where its answer says
    (llama.cpp's `timings.cache_n`; `usage.prompt_tokens_details.cached_tokens` of vLLM with
    --enable-prompt-tokens-details, SGLang)."""

    @property
    def text(self) -> str:
        return "".join(self.chunk_texts)

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_times)


def client_tokens(records: Iterable[RequestRecord]) -> int:
    """Tokens the client received: every finished request's usage, plus the running count of
    failed ones (what the server's counter should have risen by)."""
    total = 0
    for r in records:
        if r.status == "ok":
            total += r.completion_tokens or 0
        else:
            known = [x for x in r.chunk_tokens if x >= 0]
            total += max(known) if known else (r.completion_tokens or 0)
    return total
