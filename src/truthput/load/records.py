"""What the load generator hands to measurement: one record per streamed request.

All times are `time.monotonic()` seconds in the client process (the same clock the runner uses
for /metrics scrapes), so request timing and counter windows can be compared directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it.

    `chunk_times[i]` is when the i-th SSE data chunk that carried generated text (or a usage
    count increase) arrived; `chunk_tokens[i]` is the server's running `completion_tokens` after
    that chunk when the server sent `continuous_usage_stats`, else -1. `chunk_texts[i]` is the
    text delta of that chunk ("" for usage-only chunks). Nothing here is derived: the counting
    methods in `truthput.measure` decide what a token is.
    """

    idx: int
    t_start: float
    t_end: float = 0.0
    t_first: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    chunk_texts: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    status: str = "ok"  # "ok" | "error"
    http_status: int | None = None
    error: str | None = None
    worker: int = 0

    @property
    def text(self) -> str:
        return "".join(self.chunk_texts)

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_times)
