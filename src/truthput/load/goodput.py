"""Goodput: the requests (and tokens) per second that met the latency targets (SLOs).

Why per request: a server can raise raw throughput by queueing harder, and users feel each
request's latency, not the aggregate. A request is *good* when it finished ok, its time to first
token (TTFT, client clock: first content chunk - request sent) is within `ttft_ms`, and its mean
inter-token latency is within `itl_ms`, and its end-to-end latency (last chunk or end of the response
- request sent, client clock) is within `e2e_ms`. ITL follows the latency block's rule: a chunk bringing n
tokens counts as n intervals and tokens in the first chunk add none, so ITL = (last chunk - first
chunk) / (completion tokens - tokens of the first chunk). Without token counts (no usage, no
running count) a chunk is not a token: ITL is unknown and, with an ITL target, goodput is
missing data rather than a figure. A target left None is not checked. Requests whose tokens all
came in the first chunk have no ITL and pass that target.

Goodput figures count good requests that *finished* inside the window, over the window seconds;
tokens come from `usage.completion_tokens` (provenance `usage`), times from the client clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from truthput.errors import InputError
from truthput.load.records import RequestRecord


@dataclass(frozen=True)
class SLO:
    """Latency targets in milliseconds; None = not checked."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name, v in self.targets().items():
            if v is not None and not v > 0:
                raise InputError(f"SLO {name} {v}: must be > 0 milliseconds")

    @classmethod
    def of(cls, section: Any) -> SLO | None:
        """The targets of an experiment's `[slo]` (anything with the three attributes); None where
        there is no section or it sets no target."""
        if section is None:
            return None
        slo = cls(section.ttft_ms, section.itl_ms, section.e2e_ms)
        return slo if slo.any else None

    def targets(self) -> dict[str, float | None]:
        """Every target by its key (`[slo]`'s and the stored goodput's)."""
        return {"ttft_ms": self.ttft_ms, "itl_ms": self.itl_ms, "e2e_ms": self.e2e_ms}

    @property
    def any(self) -> bool:
        return any(v is not None for v in self.targets().values())


def request_ttft_ms(r: RequestRecord) -> float | None:
    return None if r.t_first is None else (r.t_first - r.t_start) * 1000.0


def request_e2e_ms(r: RequestRecord) -> float:
    """Request sent to response ended (client clock)."""
    return (r.t_end - r.t_start) * 1000.0


def request_itl_ms(r: RequestRecord) -> float | None:
    """Mean per-token gap after the first chunk; None without token counts or without an
    interval (fewer than 2 chunks, or every token in the first chunk)."""
    n = request_tokens(r)
    if n is None or len(r.chunk_times) < 2:
        return None
    first = r.chunk_tokens[0] if len(r.chunk_tokens) and r.chunk_tokens[0] >= 0 else 1
    intervals = n - max(int(first), 1)
    if intervals < 1:
        return None
    return (r.chunk_times[-1] - r.chunk_times[0]) / intervals * 1000.0


def request_tokens(r: RequestRecord) -> int | None:
    """Completion tokens from usage, else the last running count; None when neither was sent."""
    if r.completion_tokens is not None:
        return r.completion_tokens
    known = [x for x in r.chunk_tokens if x >= 0]
    return max(known) if known else None


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
    if slo.e2e_ms is not None and request_e2e_ms(r) > slo.e2e_ms:
        return False
    return True


def goodput(records: Sequence[RequestRecord], slo: SLO, window: tuple[float, float] | None) -> dict[str, Any]:
    """Goodput figures (each with unit and source) for one trial.

    `window` (monotonic start, end): requests finishing inside it are counted; without a window the
    span from the first request sent to the last one finished is used.
    """
    if window is None:
        if not records:
            return {"slo": slo.targets(), "requests": 0}
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
    miss_e2e = sum(1 for r in ok if slo.e2e_ms is not None and request_e2e_ms(r) > slo.e2e_ms)
    good_tokens = sum(r.completion_tokens or 0 for r in good_fin)
    all_tokens = sum(r.completion_tokens or 0 for r in fin)
    uncounted = sum(1 for r in ok if request_tokens(r) is None and len(r.chunk_times) > 1)
    if slo.itl_ms is not None and uncounted:
        why = (f"missing data: {uncounted} finished request(s) without token counts (no usage, no running "
               "count), so their inter-token latency is unknown (a chunk is not a token)")
        return {"slo": slo.targets(), "window": {"seconds": seconds, "from": win_from},
                "requests": len(records),
                "good_fraction": {"value": None, "unit": "fraction", "source": "client_clock", "note": why},
                "goodput_rps": {"value": None, "unit": "req/s", "source": "client_clock", "note": why},
                "good_tokens_per_s": {"value": None, "unit": "tok/s", "source": "usage", "note": why}}
    return {
        "slo": slo.targets(),
        "window": {"seconds": seconds, "from": win_from},
        "requests": len(records),
        "good_requests": len(good),
        "missed_ttft": miss_ttft,
        "missed_itl": miss_itl,
        "missed_e2e": miss_e2e,
        "good_fraction": {"value": (len(good) / len(records)) if records else None, "unit": "fraction",
                          "source": "client_clock", "note": "good requests / all requests (failed ones count as not good)"},
        "goodput_rps": {"value": len(good_fin) / seconds, "unit": "req/s", "source": "client_clock",
                        "note": f"{len(good_fin)} good of {len(fin)} requests finished in the window"},
        "good_tokens_per_s": {"value": good_tokens / seconds, "unit": "tok/s", "source": "usage",
                              "note": f"completion tokens of good requests finished in the window ({all_tokens} in all)"},
    }
