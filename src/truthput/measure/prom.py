"""Raw /metrics scrapes and the few reads measurement needs from them.

Parsing is prometheus_client's own text parser (no hand-written exposition parser). A scrape is
indexed once by sample name; counters are summed over label sets (vLLM labels every series with
`engine` and `model_name`, one series per engine under data parallelism), optionally filtered.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(slots=True)
class Scrape:
    """One /metrics read: `t_mono` is the midpoint of request and response (time.monotonic())."""

    phase: str  # pre | window_start | window_end | post | periodic
    t_mono: float
    text: str | None
    error: str | None = None
    half_span_s: float = 0.0  # half the request/response time: how far the server's moment may be from t_mono


@dataclass(slots=True)
class ParsedScrape:
    """A scrape indexed by sample name: name -> [(labels, value), ...]; `error` when unreadable."""

    phase: str
    t_mono: float
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    error: str | None = None
    half_span_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def has(self, name: str) -> bool:
        return name in self.samples

    def total(self, name: str, label_filter: Mapping[str, str] | None = None) -> float | None:
        """Sum of `name` over all label sets matching `label_filter`; None when absent."""
        return sum_samples(self, name, label_filter)

    def first_present(self, names: tuple[str, ...]) -> str | None:
        return next((n for n in names if n in self.samples), None)


def parse_scrape(scrape: Scrape) -> ParsedScrape:
    """Index a scrape; a fetch error or a parse error is kept as `error`, never raised."""
    parsed = ParsedScrape(phase=scrape.phase, t_mono=scrape.t_mono, half_span_s=scrape.half_span_s)
    if scrape.text is None:
        parsed.error = scrape.error or "no text (scrape failed)"
        return parsed
    from prometheus_client.parser import text_string_to_metric_families

    index: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(scrape.text):
            for sample in family.samples:
                index[sample.name].append((sample.labels, float(sample.value)))
    except Exception as exc:  # the parser raises ValueError and friends on malformed text
        parsed.error = f"unparseable /metrics text at {scrape.phase} scrape: {exc}"
        return parsed
    parsed.samples = dict(index)
    return parsed


def sum_samples(parsed: ParsedScrape, name: str, label_filter: Mapping[str, str] | None = None) -> float | None:
    """Sum a metric over label sets (e.g. over `engine`); None when the name is not in the scrape."""
    rows = parsed.samples.get(name)
    if rows is None:
        return None
    total = 0.0
    matched = False
    for labels, value in rows:
        if label_filter and any(labels.get(k) != v for k, v in label_filter.items()):
            continue
        if math.isnan(value):
            continue
        total += value
        matched = True
    return total if matched or not label_filter else None


def by_label(parsed: ParsedScrape, name: str, label: str) -> dict[str, float]:
    """Values of `name` summed per value of one label (e.g. per `position`)."""
    out: dict[str, float] = defaultdict(float)
    for labels, value in parsed.samples.get(name, []):
        if label in labels:
            out[labels[label]] += value
    return dict(out)


@dataclass(slots=True)
class Histogram:
    """A Prometheus histogram summed over label sets: cumulative bucket counts by upper bound."""

    buckets: list[tuple[float, float]]  # (le, cumulative count), sorted by le, +Inf last
    sum: float
    count: float

    def minus(self, earlier: "Histogram") -> "Histogram":
        """The observations made between two scrapes (buckets are counters)."""
        before = dict(earlier.buckets)
        return Histogram(
            buckets=[(le, c - before.get(le, 0.0)) for le, c in self.buckets],
            sum=self.sum - earlier.sum,
            count=self.count - earlier.count,
        )

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def histogram_quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket, as Prometheus' histogram_quantile does."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.buckets[-1][1]
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return prev_le  # the highest finite bound, like Prometheus
                if c == prev_c:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = le, c
        return prev_le


def histogram(parsed: ParsedScrape, base: str) -> Histogram | None:
    """Read histogram `base` (its _bucket/_sum/_count samples); None when absent."""
    rows = parsed.samples.get(base + "_bucket")
    if rows is None:
        return None
    per_le: dict[float, float] = defaultdict(float)
    for labels, value in rows:
        le = labels.get("le")
        if le is None:
            continue
        per_le[float(le)] += value
    return Histogram(
        buckets=sorted(per_le.items()),
        sum=sum_samples(parsed, base + "_sum") or 0.0,
        count=sum_samples(parsed, base + "_count") or 0.0,
    )
