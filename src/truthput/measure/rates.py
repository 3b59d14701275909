"""Request and prompt rates of a trial's window, as `vllm bench serve` users read them.

Counted over the same window as the headline token rate, so the three rates of a row describe
one stretch of time: requests that finished inside the window (client clock), and the prompt
tokens (usage) of requests whose first token arrived inside it (their prefill was done there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from truthput.load.records import RequestRecord
from truthput.measure.model import Window


@dataclass(frozen=True)
class WindowRates:
    """Rates over the timed window; None where the window or the counts are missing (`why` says)."""

    requests_per_s: float | None
    prompt_tps: float | None
    why: str | None = None


def window_rates(records: Sequence[RequestRecord], window: Window) -> WindowRates:
    start, end, seconds = window.start, window.end, window.seconds
    if start is None or end is None or not seconds:
        return WindowRates(None, None, "no timed window")
    ok = [r for r in records if r.status == "ok"]
    finished = sum(1 for r in ok if start <= r.t_end <= end)
    prefilled = [r for r in ok if r.t_first is not None and start <= r.t_first <= end]
    if not finished and not prefilled:
        # not a rate of zero: the window is shorter than one request (none began or ended in it)
        return WindowRates(None, None, "no request finished or began inside the window (each takes longer than "
                                       "it: a longer duration_s gives these rates)")
    if any(r.prompt_tokens is None for r in prefilled):
        return WindowRates(finished / seconds, None, "the server sent no prompt token counts (usage)")
    return WindowRates(finished / seconds, sum(r.prompt_tokens or 0 for r in prefilled) / seconds)
