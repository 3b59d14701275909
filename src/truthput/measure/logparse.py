"""The engines' periodic throughput log lines, parsed with the time the runner read them.

vLLM logs every VLLM_LOG_STATS_INTERVAL s (default 10) a line "Avg prompt throughput: X tokens/s,
Avg generation throughput: Y tokens/s, Running: N reqs, Waiting: M reqs[, Preemptions: P],
GPU|CPU KV cache usage: U%, Prefix cache hit rate: H%", prefixed "Engine 000: " or "N Engines
Aggregated: " (older versions: no prefix, fewer parts), and with speculation a "SpecDecoding
metrics: ..." line. Y is the emitted-token count of the last interval / its length: the same count
as the counter, over a different window. A line's interval is (previous line's time, its time];
the first line's interval is assumed to be the default interval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

DEFAULT_INTERVAL_S = 10.0

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_THROUGHPUT = re.compile(
    r"(?:(?P<agg>\d+) Engines Aggregated: |Engine (?P<engine>\d+): )?"
    r"Avg prompt throughput: " + _NUM + r" tokens/s, Avg generation throughput: " + _NUM + r" tokens/s"
)
_RUNNING = re.compile(r"Running: (\d+) reqs")
_WAITING = re.compile(r"(?:Waiting|Pending): (\d+) reqs")
_KV = re.compile(r"(GPU|CPU) KV cache usage: " + _NUM + "%")
_SGLANG = re.compile(r"Decode batch\..*?#running-req: (\d+).*?gen throughput \(token/s\): " + _NUM)
_SPEC = re.compile(r"SpecDecoding metrics: (?P<body>.*)")
_SPEC_FIELDS = {
    "mean_acceptance_length": re.compile(r"Mean acceptance length: " + _NUM),
    "accepted_tps": re.compile(r"Accepted throughput: " + _NUM + " tokens/s"),
    "drafted_tps": re.compile(r"Drafted throughput: " + _NUM + " tokens/s"),
    "accepted": re.compile(r"Accepted: (\d+) tokens"),
    "drafted": re.compile(r"Drafted: (\d+) tokens"),
    "acceptance_rate_pct": re.compile(r"(?:Avg )?Draft acceptance rate: " + _NUM + "%"),
}
_PER_POS = re.compile(r"Per-position acceptance rate: ([0-9., ]+?)(?:, Avg|$)")


@dataclass(slots=True)
class ThroughputLine:
    t_mono: float
    generation_tps: float
    prompt_tps: float | None
    running: int | None
    waiting: int | None
    engine: str  # "0", "1", ... or "aggregated" or "" (old format)
    kv_usage_pct: float | None
    kv_kind: str | None  # GPU | CPU
    line: str
    t_interval_start: float = 0.0

    @property
    def interval_s(self) -> float:
        return self.t_mono - self.t_interval_start


@dataclass(slots=True)
class SpecLine:
    t_mono: float
    mean_acceptance_length: float | None
    accepted_tps: float | None
    drafted_tps: float | None
    accepted: int | None
    drafted: int | None
    per_position: list[float]
    acceptance_rate_pct: float | None
    line: str
    t_interval_start: float = 0.0


def parse_throughput_line(t_mono: float, line: str) -> ThroughputLine | None:
    """One vLLM (any version) or SGLang throughput line, or None."""
    m = _THROUGHPUT.search(line)
    if m:
        running, waiting, kv = _RUNNING.search(line), _WAITING.search(line), _KV.search(line)
        engine = "aggregated" if m.group("agg") else (str(int(m.group("engine"))) if m.group("engine") else "")
        return ThroughputLine(
            t_mono=t_mono,
            prompt_tps=float(m.group(3)),
            generation_tps=float(m.group(4)),
            running=int(running.group(1)) if running else None,
            waiting=int(waiting.group(1)) if waiting else None,
            engine=engine,
            kv_usage_pct=float(kv.group(2)) if kv else None,
            kv_kind=kv.group(1) if kv else None,
            line=line,
        )
    s = _SGLANG.search(line)
    if s:
        return ThroughputLine(t_mono, float(s.group(2)), None, int(s.group(1)), None, "", None, None, line)
    return None


def parse_spec_line(t_mono: float, line: str) -> SpecLine | None:
    m = _SPEC.search(line)
    if not m:
        return None
    body = m.group("body")
    vals: dict[str, float | None] = {}
    for key, rx in _SPEC_FIELDS.items():
        f = rx.search(body)
        vals[key] = float(f.group(1)) if f else None
    pp = _PER_POS.search(body)
    per_pos = [float(x) for x in re.split(r",\s*", pp.group(1).strip().rstrip(",")) if x] if pp else []
    return SpecLine(
        t_mono=t_mono,
        mean_acceptance_length=vals["mean_acceptance_length"],
        accepted_tps=vals["accepted_tps"],
        drafted_tps=vals["drafted_tps"],
        accepted=int(vals["accepted"]) if vals["accepted"] is not None else None,
        drafted=int(vals["drafted"]) if vals["drafted"] is not None else None,
        per_position=per_pos,
        acceptance_rate_pct=vals["acceptance_rate_pct"],
        line=line,
    )


def parse_log(
    lines: Iterable[tuple[float, str]], interval_s: float | None = None
) -> tuple[list[ThroughputLine], list[SpecLine]]:
    """All throughput and spec-decode lines with their intervals set from the previous line.

    The first line's interval is `interval_s` when given, else the median spacing of the lines
    (the engine's VLLM_LOG_STATS_INTERVAL), else the default of 10 s. Note that vLLM skips a line
    when the engine was idle, so a gap can be longer than one interval: such a line's interval
    is taken as one spacing, not the whole gap. A SpecDecoding line is different: it covers the
    time since the previous SpecDecoding line (the first one seen: one spacing).
    """
    tput: list[ThroughputLine] = []
    spec: list[SpecLine] = []
    for t, line in sorted(lines, key=lambda p: p[0]):
        if "throughput" in line:
            tl = parse_throughput_line(t, line)
            if tl is not None:
                tput.append(tl)
                continue
        if "SpecDecoding" in line:
            sl = parse_spec_line(t, line)
            if sl is not None:
                spec.append(sl)
    step = interval_s or _median_spacing(tput) or DEFAULT_INTERVAL_S
    last_t: dict[str, float] = {}
    for tl in tput:
        prev = last_t.get(tl.engine)
        tl.t_interval_start = prev if prev is not None and tl.t_mono - prev <= 1.5 * step else tl.t_mono - step
        last_t[tl.engine] = tl.t_mono
    # vLLM's spec-decode logger resets its counts only when it logs, and it skips intervals
    # without drafts: a line covers the time since the previous SpecDecoding line, however long.
    last_spec: float | None = None
    for sl in spec:
        sl.t_interval_start = last_spec if last_spec is not None else sl.t_mono - step
        last_spec = sl.t_mono
    return tput, spec


def _median_spacing(lines: Sequence[ThroughputLine]) -> float | None:
    by_engine: dict[str, list[float]] = {}
    for x in lines:
        by_engine.setdefault(x.engine, []).append(x.t_mono)
    gaps = sorted(b - a for ts in by_engine.values() for a, b in zip(ts, ts[1:]) if b > a)
    return gaps[len(gaps) // 2] if gaps else None


def lines_in_window(items: Sequence[Any], window: tuple[float, float], tolerance_s: float = 1.0) -> list[Any]:
    """Lines whose whole interval lies in the window; the runner reads a line a little after the
    engine wrote it, so an edge may stick out by min(tolerance_s, 10% of the line's interval)."""
    ws, we = window
    out = []
    for x in items:
        tol = min(tolerance_s, 0.1 * max(x.t_mono - x.t_interval_start, 0.0))
        if x.t_interval_start >= ws - tol and x.t_mono <= we + tol:
            out.append(x)
    return out


def time_weighted_mean(items: Sequence[Any], attr: str) -> float | None:
    """Mean rate over the lines' intervals (rate x seconds summed / seconds summed)."""
    num = den = 0.0
    for x in items:
        v = getattr(x, attr)
        d = x.t_mono - x.t_interval_start
        if v is None or d <= 0:
            continue
        num += v * d
        den += d
    return num / den if den > 0 else None
