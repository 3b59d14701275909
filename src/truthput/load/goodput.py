"""Goodput: the requests (and tokens) per second that met the latency targets (SLOs).

Why per request: a server can raise raw throughput by queueing harder, and users feel each
request's latency, not the aggregate. A request is *good* when it finished ok, its time to first
token (TTFT, client clock: first content chunk - request sent) is within `ttft_ms`, and its mean
inter-token latency (ITL = (last chunk - first chunk) / (completion tokens - 1), the per-token
figure, so a chunk carrying 3 tokens counts as 3 gaps) is within `itl_ms`. A target left None is
not checked. Requests with one token have no ITL and pass that target.

Goodput figures count good requests that *finished* inside the window, over the window seconds;
tokens come from `usage.completion_tokens` (provenance `usage`), times from the client clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from truthput.errors import SpecError
from truthput.load.records import RequestRecord


@dataclass(frozen=True)
class SLO:
    """Latency targets in milliseconds; None = not checked."""

    ttft_ms: float | None = None
    itl_ms: float | None = None

    def __post_init__(self) -> None:
        for name, v in (("ttft_ms", self.ttft_ms), ("itl_ms", self.itl_ms)):
            if v is not None and not v > 0:
                raise SpecError(f"SLO {name} {v}: must be > 0 milliseconds")

    @property
    def any(self) -> bool:
        return self.ttft_ms is not None or self.itl_ms is not None


def request_ttft_ms(r: RequestRecord) -> float | None:
    return None if r.t_first is None else (r.t_first - r.t_start) * 1000.0


def request_itl_ms(r: RequestRecord) -> float | None:
    """Mean per-token gap after the first chunk; None without at least 2 tokens and 2 chunks."""
    n = r.completion_tokens
    if n is None:
        known = [x for x in r.chunk_tokens if x >= 0]
        n = max(known) if known else len(r.chunk_times)
    if n < 2 or len(r.chunk_times) < 2:
        return None
    return (r.chunk_times[-1] - r.chunk_times[0]) / (n - 1) * 1000.0


def is_good(r: RequestRecord, slo: SLO) -> bool:
    if r.status != "ok" or r.t_first is None:
        return False
    if slo.ttft_ms is not None:
        ttft = request_ttft_ms(r)
        if ttft is None or ttft > slo.ttft_ms:
            return False
    if slo.itl_ms is not None:
        itl = request_itl_ms(r)
        if itl is not None and itl > slo.itl_ms:
            return False
    return True


def goodput(records: Sequence[RequestRecord], slo: SLO, window: tuple[float, float] | None) -> dict[str, Any]:
    """Goodput figures (each with unit and source) for one trial.

    `window` (monotonic start, end): requests finishing inside it are counted; without a window the
    span from the first request sent to the last one finished is used.
    """
    if window is None:
        if not records:
            return {"slo": {"ttft_ms": slo.ttft_ms, "itl_ms": slo.itl_ms}, "requests": 0}
        window = (min(r.t_start for r in records), max(r.t_end for r in records))
        win_from = "first request sent .. last request finished"
    else:
        win_from = "trial window"
    t0, t1 = window
    seconds = max(t1 - t0, 1e-9)
    ok = [r for r in records if r.status == "ok"]
    good = [r for r in ok if is_good(r, slo)]
    fin = [r for r in ok if t0 <= r.t_end <= t1]
    good_fin = [r for r in fin if is_good(r, slo)]
    miss_ttft = sum(1 for r in ok if slo.ttft_ms is not None and (request_ttft_ms(r) or 0.0) > slo.ttft_ms)
    miss_itl = sum(1 for r in ok if slo.itl_ms is not None and (request_itl_ms(r) or 0.0) > slo.itl_ms)
    good_tokens = sum(r.completion_tokens or 0 for r in good_fin)
    all_tokens = sum(r.completion_tokens or 0 for r in fin)
    return {
        "slo": {"ttft_ms": slo.ttft_ms, "itl_ms": slo.itl_ms},
        "window": {"seconds": seconds, "from": win_from},
        "requests": len(records),
        "good_requests": len(good),
        "missed_ttft": miss_ttft,
        "missed_itl": miss_itl,
        "good_fraction": {"value": (len(good) / len(records)) if records else None, "unit": "fraction",
                          "source": "client_clock", "note": "good requests / all requests (failed ones count as not good)"},
        "goodput_rps": {"value": len(good_fin) / seconds, "unit": "req/s", "source": "client_clock",
                        "note": f"{len(good_fin)} good of {len(fin)} requests finished in the window"},
        "good_tokens_per_s": {"value": good_tokens / seconds, "unit": "tok/s", "source": "usage",
                              "note": f"completion tokens of good requests finished in the window ({all_tokens} in all)"},
    }
