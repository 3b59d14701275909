"""A cell's latency and goodput: every ok request's TTFT and ITL (client clock), and goodput under
the experiment's SLOs (recomputed from the stored requests, or the one the measuring side stored
under its own SLOs), averaged over the cell's trials.

Why here: reports, plots and exports read the same per-cell figures; none of them computes one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import mean, median
from typing import Any

from truthput.analyze.cells import TrialLike, group_trials
from truthput.experiment.levels import Level
from truthput.load.records import RequestRecord
from truthput.measure.model import Figure, Goodput
from truthput.measure.rates import WindowRates, window_rates


@dataclass
class LatencyCell:
    variant: str
    level: Level
    ttft_ms: list[float] = field(default_factory=list)
    """Every ok request's time to first token, sorted."""
    itl_ms: list[float] = field(default_factory=list)
    """Every ok request's mean inter-token latency, sorted."""
    n_requests: int = 0
    n_failed: int = 0
    per_trial: list[dict[str, Any]] = field(default_factory=list)
    """Each trial's own latency quantiles as the measuring side stored them."""
    requests_per_s: float | None = None
    """Requests finished inside the window per second (client clock), median over ok trials."""
    prompt_tps: float | None = None
    """Prompt tokens (usage) of requests prefilled inside the window per second, median over ok trials."""
    kv_usage_max: float | None = None
    """The server's KV-cache use gauge, highest inside the window, median over trials (a fraction)."""
    waiting_mean: float | None = None
    """Requests the server reported waiting, mean over the window's scrapes, median over trials."""
    waiting_max: float | None = None
    preemptions: float | None = None
    """Requests the server preempted inside the window (its counter), mean per trial."""


@dataclass(frozen=True)
class GoodputCell:
    variant: str
    level: Level
    slo: dict[str, float | None]
    goodput_rps: float | None
    good_tokens_per_s: float | None
    good_fraction: float | None
    n_trials: int


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return mean(vals) if vals else None


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(median(known)) if known else None


def _num(fig: Figure | None) -> float | None:
    return None if fig is None else fig.number()


def latency_and_goodput(trials: Sequence[TrialLike], records_of: Callable[[Any], list[RequestRecord]],
                        slo: dict[str, float | None] | None) -> tuple[list[LatencyCell], list[GoodputCell] | None]:
    """Per (variant, level): latency of every request, and goodput where there are SLOs (the
    experiment's, recomputed from `records_of(trial)`; else those the trials were measured under)."""
    from truthput.load.goodput import SLO, goodput, request_itl_ms, request_ttft_ms

    slo_obj = SLO(slo.get("ttft_ms"), slo.get("itl_ms")) if slo else None
    latency: list[LatencyCell] = []
    good: list[GoodputCell] = []
    for (variant, level), ts in group_trials(trials).items():
        cell = LatencyCell(variant, level)
        rows: list[Goodput] = []
        per_trial_rates: list[WindowRates] = []
        for t in ts:
            records = records_of(t)
            if t.status == "ok":
                per_trial_rates.append(window_rates(records, t.results.window))
            cell.n_requests += len(records)
            for r in records:
                if r.status != "ok":
                    cell.n_failed += 1
                    continue
                ttft, itl = request_ttft_ms(r), request_itl_ms(r)
                if ttft is not None:
                    cell.ttft_ms.append(round(ttft, 4))
                if itl is not None:
                    cell.itl_ms.append(round(itl, 4))
            lat = t.results.latency.model_dump(mode="json", include={"ttft", "itl", "tpot", "e2e", "server_window"})
            cell.per_trial.append({"trial_id": getattr(t, "id", None), "start_index": t.start_index,
                                   "trial_index": t.trial_index, **lat})
            ok = t.status == "ok"
            if slo_obj is not None and ok:
                rows.append(Goodput.model_validate(goodput(records, slo_obj, getattr(t, "window", None))))
            elif slo_obj is None and ok and t.results.goodput is not None:
                stored = t.results.goodput  # computed by the measuring side under its own SLOs
                if any(v is not None for v in stored.slo.values()):
                    rows.append(stored)
        cell.ttft_ms.sort()
        cell.itl_ms.sort()
        cell.requests_per_s = _median([r.requests_per_s for r in per_trial_rates])
        cell.prompt_tps = _median([r.prompt_tps for r in per_trial_rates])
        samples = [t.results.server_samples for t in ts if t.status == "ok"]
        cell.kv_usage_max = _median([_num(s.kv_usage_max) for s in samples])
        cell.waiting_mean = _median([_num(s.waiting_mean) for s in samples])
        cell.waiting_max = _median([_num(s.waiting_max) for s in samples])
        cell.preemptions = _mean([_num(s.preemptions) for s in samples])
        latency.append(cell)
        if rows:
            good.append(GoodputCell(
                variant, level, dict(slo or rows[0].slo),
                _mean([r.goodput_rps.number() if r.goodput_rps else None for r in rows]),
                _mean([r.good_tokens_per_s.number() if r.good_tokens_per_s else None for r in rows]),
                _mean([r.good_fraction.number() if r.good_fraction else None for r in rows]), len(rows)))
    return latency, good or None
