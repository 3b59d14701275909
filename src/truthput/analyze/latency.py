"""A cell's latency and goodput: every ok request's TTFT and ITL (client clock), and goodput under
the experiment's SLOs (recomputed from the stored requests, or the one the measuring side stored
under its own SLOs), averaged over the cell's trials.

Why here: reports, plots and exports read the same per-cell figures; none of them computes one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import mean, median
from typing import Any

from pydantic import Field

from truthput.analyze.cells import TrialLike, group_trials
from truthput.analyze.rows import Figure as DocFigure, LevelRow, Slo, clean, figure
from truthput.experiment.levels import level_json
from truthput.load.records import RequestRecord
from truthput.measure.model import Figure as MeasuredFigure, Goodput
from truthput.measure.rates import WindowRates, window_rates


LATENCY_NOTE = ("per request, from the requests table: TTFT = first chunk - request sent; "
                "ITL = (last chunk - first chunk) / (completion tokens - 1)")


class LatencyRow(LevelRow):
    """A cell's latency (every ok request's TTFT and ITL, sorted), request and prompt rates and the
    server's queue gauges."""

    variant: str
    ttft_ms: list[float] = Field(default_factory=list)
    itl_ms: list[float] = Field(default_factory=list)
    n_requests: int = 0
    n_failed: int = 0
    from_results: list[Any] = Field(default_factory=list)
    """Each trial's own latency quantiles as the measuring side stored them."""
    requests_per_s: DocFigure | None = None
    prompt_tps: DocFigure | None = None
    kv_usage_max: DocFigure | None = None
    waiting_mean: DocFigure | None = None
    waiting_max: DocFigure | None = None
    preemptions: DocFigure | None = None
    source: str
    note: str

    def ecdf(self, key: str) -> tuple[list[float], list[float]]:
        """The empirical CDF of `ttft_ms` or `itl_ms`: each request's value, sorted, and the share
        of the cell's requests at or below it."""
        values: list[float] = sorted(getattr(self, key))
        return values, [(k + 1) / len(values) for k in range(len(values))]


class GoodputRow(LevelRow):
    """A cell's goodput under the SLOs, mean over its trials."""

    variant: str
    slo: Slo
    goodput_rps: DocFigure
    good_tokens_per_s: DocFigure
    good_fraction: DocFigure
    n_trials: int


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return mean(vals) if vals else None


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(median(known)) if known else None


def _num(fig: MeasuredFigure | None) -> float | None:
    return None if fig is None else fig.number()


def latency_and_goodput(trials: Sequence[TrialLike], records_of: Callable[[Any], list[RequestRecord]],
                        slo: Slo | None, simulated: bool) -> tuple[list[LatencyRow], list[GoodputRow] | None]:
    """Per (variant, level): latency of every request, and goodput where there are SLOs (the
    experiment's, recomputed from `records_of(trial)`; else those the trials were measured under)."""
    from truthput.load.goodput import SLO, goodput, request_itl_ms, request_ttft_ms

    slo_obj = SLO.of(slo)
    latency: list[LatencyRow] = []
    good: list[GoodputRow] = []
    for (variant, level), ts in group_trials(trials).items():
        ttft_ms: list[float] = []
        itl_ms: list[float] = []
        per_trial: list[dict[str, Any]] = []
        n_requests = n_failed = 0
        rows: list[Goodput] = []
        per_trial_rates: list[WindowRates] = []
        for t in ts:
            records = records_of(t)
            if t.status == "ok":
                per_trial_rates.append(window_rates(records, t.results.window))
            n_requests += len(records)
            for r in records:
                if r.status != "ok":
                    n_failed += 1
                    continue
                ttft, itl = request_ttft_ms(r), request_itl_ms(r)
                if ttft is not None:
                    ttft_ms.append(round(ttft, 4))
                if itl is not None:
                    itl_ms.append(round(itl, 4))
            lat = t.results.latency.model_dump(mode="json", include={"ttft", "itl", "tpot", "e2e", "server_window"})
            per_trial.append({"trial_id": getattr(t, "id", None), "start_index": t.start_index,
                              "trial_index": t.trial_index, **lat})
            ok = t.status == "ok"
            if slo_obj is not None and ok:
                rows.append(Goodput.model_validate(goodput(records, slo_obj, getattr(t, "window", None))))
            elif slo_obj is None and ok and t.results.goodput is not None:
                stored = t.results.goodput  # computed by the measuring side under its own SLOs
                if any(v is not None for v in stored.slo.values()):
                    rows.append(stored)
        samples = [t.results.server_samples for t in ts if t.status == "ok"]

        def fig(value: float | None, unit: str, source: str, note: str | None = None) -> DocFigure:
            return figure(value, unit, source, simulated, note=note) if note else figure(value, unit, source,
                                                                                         simulated)

        latency.append(LatencyRow(
            variant=variant, **level_json(level), ttft_ms=sorted(ttft_ms), itl_ms=sorted(itl_ms),
            n_requests=n_requests, n_failed=n_failed, from_results=clean(per_trial),
            requests_per_s=fig(_median([r.requests_per_s for r in per_trial_rates]), "req/s", "client_clock",
                               "requests finished inside the window / its seconds; median over trials"),
            prompt_tps=fig(_median([r.prompt_tps for r in per_trial_rates]), "tok/s", "usage",
                           "prompt tokens of requests whose first token came inside the window / its seconds; "
                           "median over trials"),
            kv_usage_max=fig(_median([_num(s.kv_usage_max) for s in samples]), "fraction", "server_counter",
                             "the server's KV-cache use gauge, highest at the window's scrapes; median over trials"),
            waiting_mean=fig(_median([_num(s.waiting_mean) for s in samples]), "requests", "server_counter"),
            waiting_max=fig(_median([_num(s.waiting_max) for s in samples]), "requests", "server_counter"),
            preemptions=fig(_mean([_num(s.preemptions) for s in samples]), "requests", "server_counter",
                            "the server's preemption counter over the window; mean per trial"),
            source="simulator" if simulated else "client_clock", note=LATENCY_NOTE))
        if rows:
            good.append(GoodputRow(
                variant=variant, **level_json(level),
                slo=slo if slo is not None else Slo(**rows[0].slo),
                goodput_rps=fig(_mean([r.goodput_rps.number() if r.goodput_rps else None for r in rows]),
                                "req/s", "client_clock"),
                good_tokens_per_s=fig(_mean([r.good_tokens_per_s.number() if r.good_tokens_per_s else None
                                             for r in rows]), "tok/s", "usage"),
                good_fraction=fig(_mean([r.good_fraction.number() if r.good_fraction else None for r in rows]),
                                  "fraction", "client_clock"),
                n_trials=len(rows)))
    return latency, good or None
