"""Everything measured about one trial, every figure with its provenance, and every other way of
counting set against the server's counter with the reason it is off.

The reference is the engine's emitted-token counter delta between the `window_start` and
`window_end` scrapes divided by the time between those scrapes. Client-side methods are computed
over exactly the same interval (the scrape times), so their differences are the methods'
own errors (unit, window, definition), not a window mismatch we introduced.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from truthput.load.records import RequestRecord
from truthput.measure import logparse, validity
from truthput.measure.counters import CounterDelta, counter_delta, dips
from truthput.measure.latency import client_latency, server_histograms
from truthput.measure.methods import (
    final_usage_per_chunk,
    ChunkTable,
    build_chunk_table,
    figure,
    in_window,
    per_request_sum,
    text_chunks,
    tokenizer_tokens_per_chunk,
    usage_tokens_per_chunk,
    words_per_chunk,
)
from truthput.measure.model import (
    COUNT_WRONG_FLAGS,
    Check,
    ErrorCount,
    Figure,
    Integrity,
    IntervalRow,
    Latency,
    LogLines,
    MethodRow,
    PerStream,
    Requests,
    ScrapeIntervals,
    ScrapeRef,
    ServerSamples,
    SpecDecode,
    Throughput,
    TrialResults,
    WholeTrial,
    Window,
)
from truthput.measure.names import EngineMetricNames, metric_names
from truthput.measure.prom import Histogram, ParsedScrape, Scrape, by_label, histogram, parse_scrape
from truthput.measure.specdecode import SpecDeltas, drafted_plus_accepted_explanation, spec_decode_stats
from truthput.measure.slots import SlotsRead, slots_window

AGREE_PCT = 0.5  # within this, a method "agrees" with the reference


def _pct(value: float | None, ref: float | None) -> float | None:
    if value is None or ref is None or ref == 0:
        return None
    return (value - ref) / ref * 100.0


class _Scrapes:
    """Parsed scrapes in time order with phase lookup and counter series."""

    def __init__(self, scrapes: Sequence[Scrape], counter_names: tuple[str, ...] = (), model: str | None = None) -> None:
        self.all: list[ParsedScrape] = sorted((parse_scrape(s) for s in scrapes), key=lambda p: p.t_mono)
        self.counter_names = counter_names
        """The engine's emitted-token counter names, named when /metrics has none of them."""
        self.model: str | None = None
        """The `model_name` every read is restricted to (the model truthput asked for), when the
        server labels its series by model and serves that one; None: series summed as they are."""
        self.other_models: list[str] = []
        self.unmatched_models: list[str] = []
        """Models the series name when none of them is the one truthput asked for (not filtered)."""
        self.whole: list[ParsedScrape] = self.all
        if model:
            self._restrict_to(model)

    def _restrict_to(self, model: str) -> None:
        """A server serving several models labels each series with `model_name`: keep truthput's
        model's series (and unlabelled ones) in every read, the rest in `whole` for `other_delta`."""
        seen = {labels["model_name"] for p in self.all for rows in p.samples.values() for labels, _ in rows
                if "model_name" in labels}
        if not seen:
            return
        if model not in seen:
            self.unmatched_models = sorted(seen)
            return
        self.model, self.other_models = model, sorted(seen - {model})
        if not self.other_models:
            return
        kept = []
        for p in self.all:
            q = ParsedScrape(phase=p.phase, t_mono=p.t_mono, error=p.error, half_span_s=p.half_span_s)
            q.samples = {name: [(lb, v) for lb, v in rows if lb.get("model_name", model) == model]
                         for name, rows in p.samples.items()}
            kept.append(q)
        self.all = kept

    def counter_reads(self, name: str | None, win: tuple[float, float] | None = None) -> list[ParsedScrape]:
        """The readable scrapes that carry counter `name` (inside `win` if given), in time order,
        stale ones (dips: `measure.counters.dips`) left out, as every counter delta leaves them."""
        if not name:
            return []
        ok = [p for p in self.all if p.ok and p.has(name) and (win is None or win[0] <= p.t_mono <= win[1])]
        stale = dips([(p.t_mono, p.total(name) or 0.0, _created_at(p, name)) for p in ok])
        return [p for i, p in enumerate(ok) if i not in stale]

    def other_delta(self, name: str | None, start: ParsedScrape | None, end: ParsedScrape | None) -> float | None:
        """How far the other models' series of `name` moved between two of these scrapes."""
        if not self.other_models or name is None or start is None or end is None:
            return None
        by_time = {p.t_mono: p for p in self.whole}
        a, b = by_time.get(start.t_mono), by_time.get(end.t_mono)
        if a is None or b is None or not a.ok or not b.ok:
            return None
        moved = 0.0
        for other in self.other_models:
            va, vb = a.total(name, {"model_name": other}), b.total(name, {"model_name": other})
            if va is not None and vb is not None and vb >= va:
                moved += vb - va
        return moved

    def phase(self, name: str, last: bool = False) -> ParsedScrape | None:
        hits = [p for p in self.all if p.phase == name]
        if not hits:
            return None
        return hits[-1] if last else hits[0]

    def first_name(self, candidates: tuple[str, ...]) -> str | None:
        for name in candidates:
            if any(p.has(name) for p in self.all):
                return name
        return None

    def delta(self, name: str | None, start: ParsedScrape | None, end: ParsedScrape | None,
              label_filter: dict[str, str] | None = None) -> CounterDelta:
        if name is None:
            if not self.all:
                return CounterDelta(value=None, note="no /metrics scrapes")
            if not any(p.ok for p in self.all):
                first = self.all[0]
                return CounterDelta(value=None, note=f"no readable /metrics scrape ({first.phase}: {first.error})")
            wanted = " or ".join(self.counter_names) or "the engine's token counter"
            return CounterDelta(value=None, note=f"metric not exposed: the server's /metrics has no {wanted} "
                                "(is --engine / [server] engine the server's kind?)")
        if start is None or end is None:
            return CounterDelta(value=None, note="scrape for this interval missing")
        samples: list[tuple[float, float | None, float | None]] = []
        for p in self.all:
            if p.t_mono < start.t_mono or p.t_mono > end.t_mono:
                continue
            if not p.ok:
                samples.append((p.t_mono, None, None))
                continue
            if p.phase == "periodic" and not p.has(name):
                continue  # in-window samples keep only the families they sample
            samples.append((p.t_mono, p.total(name, label_filter), _created_at(p, name)))
        d = counter_delta(samples)
        if d.value is None and not d.note.startswith("metric"):
            d.note = f"{name}: {d.note}"
        return d


def _created_at(p: ParsedScrape, name: str) -> float | None:
    """When counter `name` was created, as this scrape says (its `_created` series; None without)."""
    if not name.endswith("_total"):
        return None
    rows = p.samples.get(name[: -len("_total")] + "_created") or []
    return max(val for _, val in rows) if rows else None


def _counter_fig(d: CounterDelta, unit: str, name: str | None, per_second: bool, window: str) -> Figure:
    value = d.rate() if per_second else d.value
    extra: dict[str, Any] = {"metric": name, "resets": d.resets}
    if d.went_backwards_without_reset:
        extra["went_backwards_without_reset"] = True
    if d.seconds is not None:
        extra["seconds"] = d.seconds
    return figure(value, unit, "server_counter", d.note or None, window=window, **extra)


def _finished_in(records: Sequence[RequestRecord], t_from: float, t_to: float) -> list[tuple[float, int]]:
    """(client end time, usage.completion_tokens) of the ok requests that ended in (t_from, t_to]."""
    return sorted((r.t_end, int(r.completion_tokens)) for r in records
                  if r.status == "ok" and r.t_end and r.completion_tokens is not None and t_from < r.t_end <= t_to)


WHOLE_REQUEST_SPAN = 0.5
"""A counter that moves at request completion times a window only when the completions inside it
span at least this share of it (else one burst of completions would stand for the whole window)."""


def _final_usage_window(records: Sequence[RequestRecord], n: _Counts) -> Figure | None:
    """Usage placed in time without running usage: each request's final count spread over its text
    chunks, counted where they arrived in the window. For an engine whose counter moves only when a
    request ends, and for any counter known to be wrong."""
    if n.win is None or not n.seconds:
        return None
    mask = in_window(n.table, n.win)
    reqs = np.unique(n.table.rec[mask]) if mask.any() else np.zeros(0, dtype=np.int64)
    if not reqs.size or any(records[int(i)].completion_tokens is None for i in reqs):
        return None
    spread = final_usage_per_chunk(n.table, records)
    return figure(float(spread[mask].sum()) / n.seconds, "tok/s", "usage",
                  "final usage.completion_tokens of each request spread over its text chunks, counted where they "
                  "arrived in the window", window="window")


def _whole_requests_window(records: Sequence[RequestRecord], d_win: CounterDelta, win: tuple[float, float],
                           name: str | None, engine: str) -> Figure:
    """Output tok/s from a counter that adds a request's tokens when the request ends.

    Between two scrapes such a counter counts whole requests, so timing it by the scrapes is off by
    up to a request per stream at each edge. Instead the window is defined by completions: from the
    first request that finished after the window opened to the last that finished before it
    closed; its tokens are the counter's rise over the scrapes less the first request's (which
    opens the window), over the time between those two completions."""
    done = _finished_in(records, win[0], win[1])
    extra: dict[str, Any] = {"metric": name, "resets": d_win.resets, "window_from": "request completions"}
    if d_win.value is None:
        return figure(None, "tok/s", "server_counter", d_win.note or "no counter delta", window="window", **extra)
    if len(done) < 2 or done[-1][0] <= done[0][0]:
        return figure(None, "tok/s", "server_counter",
                      f"missing data: {len(done)} request(s) finished in the window; {engine}'s counter adds a "
                      "request's tokens when it ends, so at least two completions are needed to time it "
                      "(lengthen the window)", window="window", **extra)
    seconds = done[-1][0] - done[0][0]
    if seconds < WHOLE_REQUEST_SPAN * (win[1] - win[0]):
        return figure(None, "tok/s", "server_counter",
                      f"missing data: the {len(done)} requests that finished in the window did so within "
                      f"{seconds:.2f} s of its {win[1] - win[0]:.2f} s (streams that finish together); {engine}'s "
                      "counter adds a request's tokens when it ends, so it cannot time this window", window="window",
                      **extra)
    tokens = d_win.value - done[0][1]
    return figure(tokens / seconds, "tok/s", "server_counter",
                  f"counter rise over the {len(done) - 1} whole requests that finished between the window's first "
                  f"and last completion ({seconds:.2f} s): {engine}'s counter adds a request's tokens when it ends",
                  window="window", seconds=seconds, requests=len(done) - 1, **extra)


def _tokens_in_flight_partial(r: RequestRecord) -> int | None:
    """Tokens a failed request received, when the server sent a running count."""
    known = [x for x in r.chunk_tokens if x >= 0]
    if known:
        return max(known)
    return r.completion_tokens


def _requests(records: Sequence[RequestRecord], continuous: int) -> Requests:
    errors = Counter((r.error or (f"HTTP {r.http_status}" if r.http_status else "error"))[:120]
                     for r in records if r.status != "ok")
    ok = [r for r in records if r.status == "ok"]
    done = [r.completion_tokens for r in ok if r.completion_tokens is not None]
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return Requests(
        completion_tokens_mean=sum(done) / len(done) if done else None,
        prompt_tokens_mean=sum(prompts) / len(prompts) if prompts else None,
        completion_tokens_sd=float(np.std(done)) if done else None,
        prompt_tokens_sd=float(np.std(prompts)) if prompts else None,
        finish_reasons=dict(Counter(r.finish_reason or "unknown" for r in ok)),
        total=len(records),
        ok=len(ok),
        failed=sum(1 for r in records if r.status != "ok"),
        failed_mid_stream=sum(1 for r in records if r.status != "ok" and r.chunk_times),
        continuous_usage=continuous,
        errors=[ErrorCount(error=e, count=c) for e, c in errors.most_common(10)],
    )


def _simulated_energy(sc: _Scrapes, ws: ParsedScrape | None, we: ParsedScrape | None,
                      d_win: CounterDelta) -> dict[str, Any] | None:
    """Joules per emitted token over the timed window, both counters read at the window's scrapes
    (the headline's span): the simulator's modelled GPU energy, so the idle tail after the load is
    not charged to the tokens. None for a server without that counter."""
    from truthput.measure.names import SIMULATED_ENERGY

    if sc.first_name((SIMULATED_ENERGY,)) is None:
        return None
    joules = sc.delta(SIMULATED_ENERGY, ws, we).value
    if not joules or not d_win.value:
        return None
    return {"value": joules / d_win.value, "unit": "J/token", "source": "simulator", "window": "window",
            "note": "SIMULATED: the simulator's power model over its modelled steps, not NVML"}


def _integrity(records: Sequence[RequestRecord], sc: _Scrapes, emitted: str | None) -> Integrity:
    pre, post = sc.phase("pre"), sc.phase("post", last=True)
    d = sc.delta(emitted, pre, post)
    ok = [r for r in records if r.status == "ok"]
    failed = [r for r in records if r.status != "ok"]
    usage_ok = sum(r.completion_tokens or 0 for r in ok)
    ok_without_usage = sum(1 for r in ok if r.completion_tokens is None)
    partial_known = 0
    partial_unknown = 0
    partial_chunks = 0
    for r in failed:
        p = _tokens_in_flight_partial(r)
        if p is None:
            if r.chunk_times:
                partial_unknown += 1
                partial_chunks += len(r.chunk_times)
        else:
            partial_known += p
    expected = usage_ok + partial_known
    out = Integrity(
        counter_delta=_counter_fig(d, "tokens", emitted, per_second=False, window="pre->post"),
        usage_sum_ok=figure(usage_ok, "tokens", "usage", f"{len(ok)} finished requests", window="trial"),
        failed_requests=len(failed),
        failed_partial_tokens=figure(partial_known, "tokens", "usage",
                                     "running usage count at the last chunk of failed requests", window="trial"),
        failed_without_count=partial_unknown,
        failed_chunks_without_count=partial_chunks,
        ok_without_usage=ok_without_usage,
    )
    if d.value is None:
        out.message = f"integrity not checked: {d.note or 'no counter'}"
        return out
    diff = int(round(d.value - expected))
    out.difference = diff
    out.holds = diff == 0
    if diff == 0:
        msg = f"holds: counter delta {d.value:g} == usage {usage_ok} + failed requests' partial {partial_known}"
    else:
        msg = f"differs by {diff:+d}: counter delta {d.value:g} vs usage {usage_ok} + failed partial {partial_known}"
        why = []
        if partial_unknown:
            why.append(f"{partial_unknown} failed request(s) streamed {partial_chunks} chunks without a token count")
        if ok_without_usage:
            why.append(f"{ok_without_usage} finished request(s) without usage")
        if d.resets:
            why.append(f"counter reset {d.resets}x: tokens before each restart since the previous scrape are lost")
        if d.went_backwards_without_reset:
            why.append("counter went backwards without a restart (stale /metrics)")
        if diff < 0 and not d.resets:
            last_end = max((r.t_end for r in records), default=None)
            why.append(
                "counter below usage: /metrics may lag (post scrape at "
                f"t={post.t_mono:.3f}, last request ended t={last_end:.3f})" if post and last_end else
                "counter below usage: /metrics may lag"
            )
        if diff > 0 and not why:
            why.append("server emitted tokens the client did not account (other clients? cancelled requests?)")
        if why:
            msg += " (" + "; ".join(why) + ")"
    out.message = msg
    return out


def _scrape_intervals(sc: _Scrapes, emitted: str | None, table: ChunkTable, usage_pc: np.ndarray,
                      records: Sequence[RequestRecord], win: tuple[float, float] | None) -> ScrapeIntervals:
    """Counter increase vs usage tokens that arrived, per interval between consecutive scrapes.

    The two count the same tokens, so per interval they agree up to what crosses its two edges:
    the chunks each stream in flight at an edge may have on the wire or in the server's output
    queue (up to the largest chunk seen), and the tokens produced while a scrape was being served
    (the scrape's moment is known only to within half its round trip). A /metrics that serves an
    older state (a cache, a lagging exporter, a proxy) shows as a counter trailing usage by more
    than that. Only intervals inside the steady-state window are judged: ramp-up and drain are
    not what the figure measures, and a drain's last tokens may reach a counter after the client.
    """
    ok = sc.counter_reads(emitted)
    rows: list[IntervalRow] = []
    if len(ok) < 2 or not bool(table.continuous.any()) or not bool(table.continuous[table.rec].all()):
        return ScrapeIntervals(rows=rows, stale_suspected=None,
                               note="needs two scrapes with the counter and continuous usage on every request")
    tpc = max(int(usage_pc.max()) if usage_pc.size else 1, 1)
    starts = np.asarray([r.t_start for r in records], dtype=float)
    ends = np.asarray([r.t_end if r.t_end else np.inf for r in records], dtype=float)
    for a, b in zip(ok, ok[1:]):
        d = sc.delta(emitted, a, b)
        m = (table.t > a.t_mono) & (table.t <= b.t_mono)
        arrived = int(usage_pc[m].sum())
        inside = win is not None and a.t_mono >= win[0] - 1e-9 and b.t_mono <= win[1] + 1e-9
        slack = None
        if inside and b.t_mono > a.t_mono:
            rate = arrived / (b.t_mono - a.t_mono)
            slack = sum(tpc * (validity.EDGE_CHUNKS_PER_STREAM * int(((starts < p.t_mono) & (ends > p.t_mono)).sum())
                               + 2) + rate * max(p.half_span_s, validity.SCRAPE_MOMENT_S) for p in (a, b))
        rows.append(IntervalRow.model_validate(
            {"from": a.phase, "to": b.phase, "t_from": a.t_mono, "t_to": b.t_mono, "counter": d.value,
             "usage_arrived": arrived, "resets": d.resets, "slack": slack,
             "difference": None if d.value is None else d.value - arrived}))
    trailing = [r for r in rows if r.slack is not None and r.counter is not None and not r.resets
                and r.usage_arrived > 0 and r.difference is not None and r.difference < -r.slack]
    stale = bool(trailing)
    note = ""
    if stale:
        worst = min(trailing, key=lambda r: (r.difference or 0.0) + (r.slack or 0.0))
        note = (f"/metrics looks stale: between the {worst.start_phase} and {worst.end_phase} scrapes the counter rose "
                f"{worst.counter:g} while {worst.usage_arrived} tokens arrived at the client (more than the "
                f"{worst.slack:.0f} the streams in flight at the two scrapes can explain); counter-based figures "
                "are suspect")
    return ScrapeIntervals(rows=rows, stale_suspected=stale, note=note)


def _log_block(log_lines: Sequence[tuple[float, str]] | None, win: tuple[float, float] | None,
               trial_span: tuple[float, float] | None, spec_k: int | None, emitted_window: float | None,
               drafted_window: float | None, accepted_window: float | None) -> LogLines:
    tput, spec = logparse.parse_log(log_lines or [])
    out = LogLines(lines_seen=len(tput), spec_lines_seen=len(spec))
    agg = [x for x in tput if x.engine == "aggregated"]
    use = agg if agg else tput
    engines = sorted({x.engine for x in use})
    inwin = logparse.lines_in_window(use, win) if win else []
    if inwin:
        mean = sum(logparse.time_weighted_mean([x for x in inwin if x.engine == e], "generation_tps") or 0.0
                   for e in engines)
        peak = max(x.generation_tps for x in inwin) if len(engines) <= 1 else None
        out.generation_mean_window = figure(
            mean, "tok/s", "log_line", f"time-weighted mean of {len(inwin)} line(s) whose interval lies in the window",
            window="window")
        out.generation_peak_window = figure(peak, "tok/s", "log_line", "highest single line in the window",
                                            window="window")
        out.kv_kind = next((x.kv_kind for x in inwin if x.kv_kind), None)
    else:
        note = "no log line in window" if use else "no throughput log line at all"
        out.generation_mean_window = figure(None, "tok/s", "log_line", note, window="window")
        out.generation_peak_window = figure(None, "tok/s", "log_line", note, window="window")
    if trial_span and use:
        span = [x for x in use if trial_span[0] - 1 <= x.t_mono <= trial_span[1] + logparse.DEFAULT_INTERVAL_S]
        if span:
            out.generation_peak_trial = figure(max(x.generation_tps for x in span), "tok/s", "log_line",
                                               "highest line during the trial (what people quote as 'peak')",
                                               window="trial")
    spec_in = logparse.lines_in_window(spec, win) if win else []
    if spec_in:
        acc = logparse.time_weighted_mean(spec_in, "accepted_tps")
        dr = logparse.time_weighted_mean(spec_in, "drafted_tps")
        out.spec_accepted_tps = figure(acc, "tok/s", "log_line", window="window")
        out.spec_drafted_tps = figure(dr, "tok/s", "log_line", window="window")
        gen = out.generation_mean_window.value
        if acc is not None and dr is not None and gen:
            rel = (acc + dr - gen) / gen * 100
            out.drafted_plus_accepted_vs_generation = Check(
                ok=abs(rel) < 5.0,
                numbers={"accepted_tps": acc, "drafted_tps": dr, "generation_tps": gen, "diff_pct": rel},
                message=f"accepted {acc:.1f} + drafted {dr:.1f} = {acc + dr:.1f} vs generation {gen:.1f} ({rel:+.1f}%)",
            )
    if emitted_window is not None and drafted_window is not None and accepted_window is not None:
        out.drafted_plus_accepted_explanation = drafted_plus_accepted_explanation(
            spec_k, emitted_window, drafted_window, accepted_window)
    return out


def _row(method: str, value: float | None, ref: float | None, cause_if_off: str, source: str,
         note: str | None = "", breakdown: dict[str, float | None] | None = None) -> MethodRow:
    err = _pct(value, ref)
    if value is None or err is None:
        cause = "missing data"  # no figure, or no reference to hold it against
    elif abs(err) < AGREE_PCT:
        cause = "agrees"
    else:
        cause = cause_if_off
    return MethodRow(method=method, tokps=value, error_pct_vs_counter=err, cause=cause, source=source,
                     note=note or "", breakdown_pct=breakdown or None)


@dataclass
class _Counts:
    """Per-chunk counts by every method, and the trial's window (shared by the sections)."""

    table: ChunkTable
    usage_pc: np.ndarray
    words_pc: np.ndarray
    chunks_pc: np.ndarray
    tok_pc: np.ndarray | None
    tok_req: np.ndarray | None
    win: tuple[float, float] | None
    win_from_scrapes: bool
    trial_span: tuple[float, float] | None

    @property
    def seconds(self) -> float | None:
        return (self.win[1] - self.win[0]) if self.win else None


def _throughput(sc: _Scrapes, emitted: str | None, d_win: CounterDelta, n: _Counts,
                has_tokenizer: bool) -> Throughput:
    tp = Throughput(counter_window=_counter_fig(d_win, "tok/s", emitted, per_second=True, window="window"))
    if n.win is None:
        tp.counter_window = figure(None, "tok/s", "server_counter", "no window", window="window")
    seconds = n.seconds
    table, usage_pc = n.table, n.usage_pc
    mask = in_window(table, n.win) if n.win else np.zeros(table.size, dtype=bool)
    reqs_in_window = np.unique(table.rec[mask]) if mask.any() else np.zeros(0, dtype=np.int64)
    cont_in = table.continuous[reqs_in_window] if reqs_in_window.size else np.zeros(0, dtype=bool)
    if seconds and reqs_in_window.size and cont_in.all():
        tp.usage_window = figure(float(usage_pc[mask].sum()) / seconds, "tok/s", "usage",
                                 "running usage count differences of chunks arriving in the window", window="window")
    elif seconds and cont_in.any():
        part = mask & table.continuous[table.rec]
        tp.usage_window = figure(None, "tok/s", "usage",
                                 f"missing data: {int((~cont_in).sum())} of {reqs_in_window.size} requests in the window "
                                 "lack continuous usage; partial figure in 'partial_value'",
                                 window="window", partial_value=float(usage_pc[part].sum()) / seconds)
    else:
        tp.usage_window = figure(None, "tok/s", "usage", "missing data: no continuous usage (usage only at the end) "
                                 "so tokens cannot be placed in time", window="window")
    tok_w = float(n.tok_pc[mask].sum()) / seconds if (n.tok_pc is not None and seconds) else None
    tp.tokenizer_window = figure(tok_w, "tok/s", "tokenizer", None if has_tokenizer else "missing data: no tokenizer",
                                 window="window")
    chunks_w = float(n.chunks_pc[mask].sum()) / seconds if seconds else None
    words_w = float(n.words_pc[mask].sum()) / seconds if seconds else None
    tp.chunks_window = figure(chunks_w, "chunks/s", "chunks", "one text chunk counted as one token", window="window")
    tp.words_window = figure(words_w, "words/s", "words", "whitespace-separated words", window="window")
    return tp


def _whole_trial(records: Sequence[RequestRecord], sc: _Scrapes, emitted: str | None, n: _Counts,
                 concurrency: int, d_trial: CounterDelta) -> tuple[WholeTrial, np.ndarray]:
    ok = [r for r in records if r.status == "ok"]
    with_usage = [r for r in ok if r.completion_tokens is not None]
    usage_total = sum(r.completion_tokens or 0 for r in with_usage)
    wall = (n.trial_span[1] - n.trial_span[0]) if n.trial_span else None
    if with_usage:
        whole = WholeTrial(usage_trial=figure(
            usage_total / wall if wall else None, "tok/s", "usage",
            "sum of usage.completion_tokens / (last response end - first request start): includes ramp-up and drain",
            window="trial"))
    else:
        whole = WholeTrial(usage_trial=figure(None, "tok/s", "usage", "missing data: no finished request reported usage",
                                              window="trial"))
    pre, drained, settled = sc.phase("pre"), sc.phase("post"), sc.phase("post", last=True)
    counter_trial = _counter_fig(d_trial, "tok/s", emitted, per_second=True, window="pre->post")
    note = " pre->post scrapes: 'read counter, run load, read again, divide by wall time'"
    if drained is not settled and pre is not None and drained is not None and settled is not None \
            and d_trial.value is not None:
        # the counter's settled value, over the time to the end of the drain (truthput's own
        # wait for a lagging /metrics to settle is not the server's time)
        counter_trial.value = d_trial.value / (drained.t_mono - pre.t_mono)
        setattr(counter_trial, "seconds", drained.t_mono - pre.t_mono)
        note += f"; the {settled.t_mono - drained.t_mono:.2f} s waiting for the counter to settle left out"
    counter_trial.note = ((counter_trial.note or "") + note).strip()
    whole.counter_trial = counter_trial
    words_req = per_request_sum(n.table, n.words_pc)
    ok_idx = np.array([i for i, r in enumerate(records) if r.status == "ok" and r.completion_tokens], dtype=np.int64)
    usage_ok_tokens = sum(records[i].completion_tokens or 0 for i in ok_idx)
    if usage_ok_tokens:
        whole.words_per_token = figure(float(words_req[ok_idx].sum()) / usage_ok_tokens, "words/token", "words",
                                       "whitespace words / usage.completion_tokens over finished requests: "
                                       "divide a word rate by this to get tokens", window="trial")
        if n.tok_req is not None:
            tok_sum = int(n.tok_req[ok_idx].sum())
            whole.tokenizer_vs_usage = figure(_pct(tok_sum, usage_ok_tokens), "%", "tokenizer",
                                              f"client tokenizer {tok_sum} vs usage {usage_ok_tokens} tokens over "
                                              "finished requests (re-tokenizing text need not give the model's ids)",
                                              window="trial")
    # the per-request word probe people write by hand
    rates_first, rates_start = [], []
    for i, r in enumerate(records):
        if r.status != "ok" or r.t_first is None or not r.chunk_times:
            continue
        active = r.chunk_times[-1] - r.t_first
        if active > 0:
            rates_first.append(words_req[i] / active)
        if r.t_end > r.t_start:
            rates_start.append(words_req[i] / (r.t_end - r.t_start))
    probe_first = float(np.mean(rates_first)) * concurrency if rates_first else None
    probe_start = float(np.mean(rates_start)) * concurrency if rates_start else None
    whole.word_probe_per_request = figure(
        probe_first, "words/s", "words",
        "per-request probe: mean over requests of words / (last chunk - first token), x concurrency; "
        "each request's active time, not the wall-clock window",
        window="per request",
        per_stream_mean=float(np.mean(rates_first)) if rates_first else None,
        from_request_start=probe_start,
    )
    return whole, words_req


def _spec_decode(records: Sequence[RequestRecord], sc: _Scrapes, names: EngineMetricNames, emitted: str | None,
                 speculative: dict[str, Any] | None, win: tuple[float, float] | None, d_win: CounterDelta,
                 ws_s: ParsedScrape | None, we_s: ParsedScrape | None
                 ) -> tuple[SpecDecode | None, float | None, float | None]:
    """Spec-decode statistics, and the window's draft-token and accepted-token deltas."""
    k = int(speculative["num_speculative_tokens"]) if speculative and speculative.get("num_speculative_tokens") else None
    spec_method = speculative.get("method") if speculative else None
    drafts_name = sc.first_name(names.candidates("spec_drafts"))
    if drafts_name:
        dt_name = sc.first_name(names.candidates("spec_draft_tokens"))
        acc_name = sc.first_name(names.candidates("spec_accepted"))
        pp_name = sc.first_name(names.candidates("spec_accepted_per_pos"))

        def deltas(a: ParsedScrape | None, b: ParsedScrape | None) -> SpecDeltas | None:
            parts = [sc.delta(nm, a, b) for nm in (emitted, drafts_name, dt_name, acc_name)]
            values = [p.value for p in parts]
            if any(v is None for v in values):
                return None
            per_pos: dict[int, float] = {}
            if pp_name and a is not None and b is not None:
                positions: set[str] = set()
                for p in sc.all:
                    if p.ok:
                        positions.update(by_label(p, pp_name, "position"))
                at_start = by_label(a, pp_name, "position") if a.ok else {}
                for pos in sorted(positions, key=int):
                    dd = sc.delta(pp_name, a, b, {"position": pos})
                    if dd.value is not None:
                        per_pos[int(pos)] = dd.value
                    elif a.ok and b.ok and a.has(acc_name or "") and pos not in at_start:
                        # llama.cpp creates a position's series when a draft first reaches it: absent
                        # at the start while the accepted total is there means it was 0 then
                        end = by_label(b, pp_name, "position").get(pos)
                        if end is not None:
                            per_pos[int(pos)] = end
            em, dr, dt, ac = (float(v) for v in values if v is not None)
            return SpecDeltas(em, dr, dt, ac, per_pos)

        first_all = sum(1 for r in records if r.t_first is not None)
        trial_d = deltas(sc.phase("pre"), sc.phase("post", last=True))
        win_d = deltas(ws_s, we_s)
        block = SpecDecode(k=k, method=spec_method)
        d_dt_w = d_acc_w = None
        if trial_d:
            block.trial = spec_decode_stats(trial_d, k, spec_method, first_all, "pre->post (whole trial)")
        if win_d:
            first_in_win = sum(1 for r in records if r.t_first is not None and win and win[0] < r.t_first <= win[1])
            w = spec_decode_stats(win_d, k, spec_method, None, "window_start->window_end")
            undr = win_d.emitted - win_d.drafts - win_d.accepted
            w.checks["emitted_identity"] = Check(
                ok=undr >= first_in_win - 0.5,
                numbers={"undrafted": undr, "first_tokens_in_window": first_in_win},
                message=f"undrafted steps {undr:g} >= first tokens arriving in the window {first_in_win}"
                        " (boundary steps make the window check approximate; the whole-trial check is exact)",
            )
            block.window = w
            d_dt_w, d_acc_w = win_d.draft_tokens, win_d.accepted
        return block, d_dt_w, d_acc_w
    vname = sc.first_name(names.candidates("spec_verify_calls"))
    if vname:
        # SGLang: one verify call per decode step of the batch; its gauges only cover the last interval
        dv = sc.delta(vname, ws_s, we_s)
        acc_len = (d_win.value / dv.value) if (d_win.value is not None and dv.value) else None
        return SpecDecode(k=k, method=spec_method, accept_length_window=figure(
            acc_len, "tokens/verify", "server_counter", "delta emitted tokens / delta verify calls over the window",
            window="window", verify_calls=dv.value)), None, None
    if speculative:
        return SpecDecode(k=k, method=spec_method,
                          note="speculative decoding configured but no spec-decode counters exposed"), None, None
    return None, None, None


def _per_stream(records: Sequence[RequestRecord], counter_tps: float | None) -> PerStream:
    ps = []
    for r in records:
        if r.status != "ok" or r.t_first is None or not r.chunk_times or not r.completion_tokens \
                or r.completion_tokens < 2:
            continue
        dt = r.chunk_times[-1] - r.t_first
        if dt > 0:
            ps.append((r.completion_tokens - 1) / dt)
    return PerStream(
        decode_tps_mean=figure(float(np.mean(ps)) if ps else None, "tok/s/stream", "usage",
                               "per request: (completion_tokens - 1) / (last chunk - first token); "
                               "NOT aggregate throughput", window="per request"),
        decode_tps_median=figure(float(np.median(ps)) if ps else None, "tok/s/stream", "usage", window="per request"),
        n=len(ps),
        aggregate_tps=figure(counter_tps, "tok/s", "server_counter",
                             "aggregate: counter tokens / wall time of the window", window="window"),
    )


def _latency(records: Sequence[RequestRecord], sc: _Scrapes, names: EngineMetricNames, n: _Counts,
             ws_s: ParsedScrape | None, we_s: ParsedScrape | None) -> Latency:
    lat = client_latency(records, n.table, n.usage_pc, n.tok_pc)
    hists: dict[str, Histogram | None] = {}
    hist_notes: dict[str, str] = {}
    for key, name_field in (("ttft", "ttft_hist"), ("itl", "itl_hist"), ("tpot", "tpot_hist"), ("e2e", "e2e_hist")):
        base = sc.first_name(tuple(nm + "_bucket" for nm in names.candidates(name_field)))
        if base is None or ws_s is None or we_s is None or not ws_s.ok or not we_s.ok:
            hists[key] = None
            continue
        h0, h1 = histogram(ws_s, base[: -len("_bucket")]), histogram(we_s, base[: -len("_bucket")])
        if h0 and h1 and h1.count < h0.count:
            hist_notes[key] = "histogram count dropped inside the window (server restart): not usable"
            hists[key] = None
            continue
        hists[key] = h1.minus(h0) if (h0 and h1) else None
    lat.server_window = server_histograms(hists, hist_notes)
    return lat


def _prefix_cache(sc: _Scrapes, names: EngineMetricNames, ws_s: ParsedScrape | None,
                  we_s: ParsedScrape | None) -> Figure:
    """The window's prefix-cache hit rate, from the server's counters: hits / queries (prompt tokens;
    an engine that counts no lookups: hits / (hits + computed))."""
    queries = sc.first_name(names.candidates("prefix_cache_queries"))
    hits = sc.first_name(names.candidates("prefix_cache_hits"))
    computed = sc.first_name(names.candidates("prefix_cache_computed"))
    if hits is not None and queries is None and computed is not None:
        h, c = sc.delta(hits, ws_s, we_s), sc.delta(computed, ws_s, we_s)
        if h.value is None or c.value is None or h.value + c.value <= 0:
            return figure(None, "fraction", "server_counter", h.note or c.note or "no prompt token in the window",
                          window="window")
        return figure(h.value / (h.value + c.value), "fraction", "server_counter",
                      f"{h.value:.0f} of {h.value + c.value:.0f} prompt tokens in the window were cached ({hits} / "
                      f"({hits} + {computed}), added as each request ends)", window="window")
    if queries is None or hits is None:
        return figure(None, "fraction", "server_counter", "not exposed: the server's /metrics has no prefix-cache "
                      "counters", window="window")
    q, h = sc.delta(queries, ws_s, we_s), sc.delta(hits, ws_s, we_s)
    if q.value is None or h.value is None:
        return figure(None, "fraction", "server_counter", q.note or h.note, window="window")
    if q.value <= 0:
        prompts = sc.first_name(names.candidates("prompt_tokens"))
        served = sc.delta(prompts, ws_s, we_s).value if prompts is not None else None
        if served:  # vLLM counts no lookup with prefix caching off: every prompt token was computed
            return figure(0.0, "fraction", "server_counter",
                          f"none of the {served:.0f} prompt tokens in the window was looked up in the prefix cache "
                          f"({queries} did not move: prefix caching is off), so none was cached", window="window")
        return figure(None, "fraction", "server_counter", "no prompt token was looked up in the window", window="window")
    said = f"{h.value:.0f} of {q.value:.0f} prompt tokens looked up in the window were cached ({hits} / {queries})"
    ext_q, ext_h = (sc.first_name(names.candidates(f)) for f in ("external_cache_queries", "external_cache_hits"))
    if ext_q is not None and ext_h is not None:
        eq, eh = sc.delta(ext_q, ws_s, we_s).value, sc.delta(ext_h, ws_s, we_s).value
        if eq and eh is not None:
            said += f"; a KV connector's tier found {eh:.0f} of the {eq:.0f} it was asked for ({ext_h} / {ext_q})"
    return figure(h.value / q.value, "fraction", "server_counter", said, window="window")


def _prefix_cache_per_request(records: Sequence[RequestRecord], win: tuple[float, float] | None) -> Figure | None:
    """The window's hit rate from each request's own answer: cached / prompt tokens of the ok
    requests that ended in it and said both (None: no answer said)."""
    said = [r for r in records if r.status == "ok" and r.cached_tokens is not None and r.prompt_tokens
            and (win is None or win[0] <= r.t_end <= win[1])]
    if not said:
        return None
    cached = sum(r.cached_tokens or 0 for r in said)
    prompt = sum(r.prompt_tokens or 0 for r in said)
    return figure(cached / prompt, "fraction", "usage",
                  f"{cached} of {prompt} prompt tokens of the {len(said)} requests that ended in the window were "
                  "cached, as each answer says (timings.cache_n / usage.prompt_tokens_details.cached_tokens)",
                  window="window")


def _server_samples(sc: _Scrapes, names: EngineMetricNames, win: tuple[float, float] | None) -> ServerSamples:
    """Running and waiting requests as the server reported them at the scrapes inside the window."""
    running = sc.first_name(names.candidates("running"))
    waiting = sc.first_name(names.candidates("waiting"))
    if win is None or running is None:
        why = "no window" if win is None else "the engine exposes no running-requests gauge"
        return ServerSamples(note=f"not sampled: {why}")
    inside = [p for p in sc.all if p.ok and win[0] <= p.t_mono <= win[1] and p.has(running)]
    run_vals = [v for v in (p.total(running) for p in inside) if v is not None]
    if not run_vals:
        return ServerSamples(note="no readable scrape inside the window")
    wait_vals = [v for v in (p.total(waiting) for p in inside) if v is not None] if waiting else []
    kv = sc.first_name(names.candidates("kv_usage"))
    kv_vals = [v for v in (p.total(kv) for p in inside) if v is not None] if kv else []
    preempt = sc.first_name(names.candidates("preemptions"))
    d_pre = sc.delta(preempt, inside[0], inside[-1]) if preempt and len(inside) > 1 else None
    times = [p.t_mono for p in inside]
    interval = float(np.mean(np.diff(times))) if len(times) > 1 else None
    note = f"{len(run_vals)} scrape(s) of {running} inside the window (window_start, periodic, window_end)"

    def gauge(values: list[float], stat: Any, unit: str) -> Figure | None:
        return figure(float(stat(values)), unit, "server_counter", window="window") if values else None

    return ServerSamples(
        n=len(run_vals), interval_s=interval,
        running_mean=figure(float(np.mean(run_vals)), "requests", "server_counter", note, window="window"),
        running_min=gauge(run_vals, min, "requests"),
        running_max=gauge(run_vals, max, "requests"),
        waiting_mean=gauge(wait_vals, np.mean, "requests"),
        waiting_max=gauge(wait_vals, max, "requests"),
        kv_usage_mean=gauge(kv_vals, np.mean, "fraction"),
        kv_usage_max=gauge(kv_vals, max, "fraction"),
        preemptions=figure(d_pre.value, "requests", "server_counter", window="window")
        if d_pre is not None and d_pre.value is not None else None,
        note=note,
    )


def _check(result: TrialResults, sc: _Scrapes, emitted: str | None, counts: _Counts, engine: str, concurrency: int,
           records: Sequence[RequestRecord], d_win: CounterDelta, d_trial: CounterDelta, ws_s: ParsedScrape | None,
           we_s: ParsedScrape | None, open_loop: bool = False, whole_requests: bool = False) -> None:
    """The validity checks (`truthput.measure.validity`) on the figures computed so far."""
    intervals: list[tuple[float, float, float | None, int]] = []
    if counts.win is not None and emitted:
        inside = sc.counter_reads(emitted, counts.win)
        for a, b in zip(inside, inside[1:]):
            d = sc.delta(emitted, a, b)
            intervals.append((a.t_mono, b.t_mono, d.value, d.resets))
        if ws_s is not None and we_s is not None and len(inside) > 2:
            intervals.append((ws_s.t_mono, we_s.t_mono, d_win.value, d_win.resets))
    usage_w, seconds = result.throughput.usage_window.number(), counts.seconds
    usage_tokens = usage_w * seconds if usage_w is not None and seconds else None
    known = counts.usage_pc[counts.usage_pc > 0]
    moments = sum(max(p.half_span_s, validity.SCRAPE_MOMENT_S) for p in (ws_s, we_s) if p is not None)
    rate = usage_w or 0.0
    placed = spans = None
    final_usage = all(r.completion_tokens is not None for r in records if r.status == "ok")
    if usage_tokens is None and not whole_requests and not final_usage:
        result.validity.not_applied.append("upper bound on the counter: the server sent no usage counts, so "
                                           "truthput cannot count its own tokens (another client would go unseen)")
    if usage_tokens is None and not whole_requests and final_usage:
        # without running usage, final usage spread over each request's text chunks places
        # truthput's own tokens in time: the counter's upper bound (another client's tokens), and
        # for an engine whose chunks carry an unknown number of tokens its lower bound too; the
        # last interval is the whole window
        spread_pc = final_usage_per_chunk(counts.table, records)
        t = counts.table.t
        placed = [float(spread_pc[(t > a) & (t <= b)].sum()) for a, b, _r, _n in intervals]
        n_chunks = int(counts.chunks_pc.sum())
        known = np.asarray([math.ceil(spread_pc.sum() / n_chunks)]) if n_chunks else known
        rate = placed[-1] / seconds if placed and seconds else 0.0
        spans = [(r.t_first, r.t_end, r.completion_tokens) for r in records
                 if r.status == "ok" and r.t_first is not None and r.t_end and r.completion_tokens is not None]
    finished = _finished_in(records, -math.inf, math.inf) if whole_requests else None
    validity.check_counter(result, engine, concurrency, counts.table.t, counts.chunks_pc, intervals,
                           d_win.resets, d_win.went_backwards_without_reset, d_trial.resets,
                           usage_tokens=usage_tokens, max_tokens_per_chunk=int(known.max()) if known.size else 1,
                           window_rise=d_win.value if counts.win_from_scrapes else None, finished=finished,
                           moment_tokens=rate * moments, placed=placed, spans=spans, window_s=seconds)
    _own_tokens_when_counter_wrong(result, records, counts)
    if not open_loop:
        validity.check_load(result, concurrency)
    validity.check_timestamps(result, records, concurrency)


def _own_tokens_when_counter_wrong(result: TrialResults, records: Sequence[RequestRecord], counts: _Counts) -> None:
    """A counter known to be wrong (another client's tokens, a stale or restarted /metrics) gives
    way to truthput's own tokens: where no running usage placed them in time, each request's final
    usage spread over its text chunks does (`TrialResults.headline` then picks it, saying so)."""
    tp = result.throughput
    wrong = [f.code for f in tp.counter_window.flags if f.code in COUNT_WRONG_FLAGS]
    if not wrong or tp.usage_window.value is not None:
        return
    spread = _final_usage_window(records, counts)
    if spread is not None:
        spread.note = (f"truthput's own tokens, since the counter is {', '.join(wrong)}: {spread.note}")
        tp.usage_window = spread


def _server_timings_row(records: Sequence[RequestRecord], win: tuple[float, float] | None, concurrency: int,
                        ref: float | None) -> MethodRow | None:
    """The engine's own per-request decode rate (llama.cpp's `timings.predicted_per_second`, the
    figure its users quote), as an aggregate: the mean over the requests that ended in the window,
    times the streams."""
    rates = [r.server_decode_tps for r in records if r.status == "ok" and r.server_decode_tps is not None
             and (win is None or win[0] < r.t_end <= win[1])]
    if not rates:
        return None
    mean = sum(rates) / len(rates)
    return _row("server timings per request x streams", mean * max(concurrency, 1), ref, "definition", "timings",
                f"timings.predicted_per_second, mean {mean:.1f} tok/s over {len(rates)} requests, x {concurrency} "
                "streams: one request's decode rate (tokens / decode time) leaves out prompt processing, queueing "
                "and the gaps between requests, so times the streams it is a ceiling, not the throughput")


def _methods(result: TrialResults, emitted: str | None, d_win: CounterDelta, counter_tps: float | None,
             k: int | None, d_dt_w: float | None, d_acc_w: float | None,
             timings: tuple[Sequence[RequestRecord], tuple[float, float] | None, int] | None = None) -> list[MethodRow]:
    """Every way of counting over the window, against the trial's headline figure (the counter;
    usage placed in time where the counter is missing or flagged and usage is clean)."""
    tp, whole, lb = result.throughput, result.whole_trial, result.log_line
    usage_w = tp.usage_window.number()
    head = result.headline()
    ref = head.number()
    ref_name = "counter (window)" if head is tp.counter_window else "usage (window; no counter)"
    counter_flags = "; ".join(f"{f.code}: {f.reason}" for f in tp.counter_window.flags)
    per_request = result.counter_moves == "per_request"
    if head is tp.usage_window and tp.counter_window.value is not None:
        ref_name = ("usage (window; the counter counts whole requests)" if per_request and not counter_flags
                    else "usage (window; the counter is flagged)")
    if counter_tps is None:
        counter_row = MethodRow(method="counter (window)", tokps=None, error_pct_vs_counter=None, cause="missing data",
                                source="server_counter", note=d_win.note or "no counter")
    elif head is tp.counter_window:
        counter_row = MethodRow(method="counter (window)", tokps=counter_tps, error_pct_vs_counter=0.0,
                                cause="reference", source="server_counter",
                                note=f"{emitted} delta window_start->window_end / scrape interval"
                                + (f" (flagged: {counter_flags})" if counter_flags else ""))
    elif per_request and not counter_flags:
        counter_row = MethodRow(method="counter (window)", tokps=counter_tps, error_pct_vs_counter=_pct(counter_tps, ref),
                                cause="window", source="server_counter",
                                note=f"{emitted} adds a request's tokens when it ends: whole requests timed by their "
                                     "completions, not the tokens made in the window")
    else:
        counter_row = MethodRow(method="counter (window)", tokps=counter_tps, error_pct_vs_counter=_pct(counter_tps, ref),
                                cause="flagged", source="server_counter",
                                note=f"not the reference: {counter_flags}")
    counter_row.flags = list(tp.counter_window.flags)
    usage_row = _row("usage placed in time (window)", usage_w, ref, "window", "usage", tp.usage_window.note)
    usage_row.flags = list(tp.usage_window.flags)
    rows = [
        counter_row,
        usage_row,
        _row("tokenizer (window)", tp.tokenizer_window.number(), ref, "unit", "tokenizer", tp.tokenizer_window.note or
             "client tokenizer re-tokenizes the text: merges can differ from the model's ids"),
        _row("chunks as tokens (window)", tp.chunks_window.number(), ref, "unit", "chunks",
             "a chunk can carry several tokens (spec decode, stream intervals) or none"),
        _row("whitespace words (window)", tp.words_window.number(), ref, "unit", "words",
             "words are not tokens (~0.75 words/token in English)"),
    ]
    if tp.slots_window is not None:
        rows.insert(2, _row("slots placed in time (window)", tp.slots_window.number(), ref, "window", "server_slots",
                            tp.slots_window.note))
    probe_first = whole.word_probe_per_request.number()
    words_w = tp.words_window.number()
    probe_break: dict[str, float | None] | None = None
    if probe_first is not None and words_w and ref:
        probe_break = {"unit": _pct(words_w, ref), "window": _pct(probe_first, words_w)}
    probe_cause = "unit"
    if probe_break:
        unit_err, window_err = probe_break["unit"], probe_break["window"]
        if window_err is not None and unit_err is not None and abs(window_err) > abs(unit_err):
            probe_cause = "window"
    rows.append(_row("word probe per request", probe_first, ref, probe_cause, "words",
                     "words per request / that request's active time, x concurrency: words undercount tokens (unit) "
                     "while per-request active time excludes TTFT and gaps (window)", probe_break))
    rows.append(_row("usage whole trial", whole.usage_trial.number(), ref, "window", "usage",
                     "includes ramp-up and drain"))
    # the server's own counts hold another client's tokens where the window's counter was caught with them
    server_side = "another client" if any(f.code == "foreign_traffic" for f in tp.counter_window.flags) else "window"
    rows.append(_row("counter pre->post", whole.counter_trial.number(), ref, server_side, "server_counter",
                     "includes ramp-up, drain and idle time around the load"
                     + ("; and another client's tokens (foreign_traffic)" if server_side != "window" else "")))
    rows.append(_row("log line mean (window)", lb.generation_mean_window.number(), ref, server_side, "log_line",
                     lb.generation_mean_window.note or "engine interval != timed window"))
    rows.append(_row("log line peak (window)", lb.generation_peak_window.number(), ref, server_side, "log_line",
                     "peak of intervals, not the mean"))
    if lb.generation_peak_trial is not None:
        rows.append(_row("log line peak (trial)", lb.generation_peak_trial.number(), ref, "window", "log_line",
                         "highest interval during the trial: peak vs mean"))
    if timings is not None:
        row = _server_timings_row(*timings, ref)
        if row is not None:
            rows.append(row)
    if d_dt_w and d_acc_w is not None and d_win.seconds:  # only where drafts were made
        rows.append(_row("drafted + accepted (counters)", (d_dt_w + d_acc_w) / d_win.seconds, ref, "definition",
                         "server_counter", "draft proposals are not output: " +
                         drafted_plus_accepted_explanation(k, d_win.value or 0.0, d_dt_w, d_acc_w)))
    if ref_name != "counter (window)":
        for r in rows:
            r.reference = ref_name
    return rows


def measure_trial(
    records: Sequence[RequestRecord],
    scrapes: Sequence[Scrape],
    log_lines: Sequence[tuple[float, str]] | None,
    window: tuple[float, float] | None,
    concurrency: int,
    engine: str = "vllm",
    speculative: dict[str, Any] | None = None,
    tokenizer: Any = None,
    names: EngineMetricNames | None = None,
    open_loop: bool = False,
    model: str | None = None,
    slots: Sequence[SlotsRead] = (),
    simulated: bool = False,
) -> TrialResults:
    """All figures of one trial, built once, section by section (see the module docstring).

    `concurrency` is the streams a closed loop held, or the most requests an open loop had in
    flight; an open loop sets `open_loop`, since its level is a rate and requests waiting in the
    server's queue are what it measures, not a load that was never reached. `model`: the model
    truthput asked for; a server that labels its series by `model_name` is read for that one."""
    names = names or metric_names(engine)
    sc = _Scrapes(scrapes, names.candidates("emitted_tokens"), model=model)
    table = build_chunk_table(records)
    tok_pc = tok_req = None
    if tokenizer is not None:
        tok_pc, tok_req = tokenizer_tokens_per_chunk(table, tokenizer)

    emitted = sc.first_name(names.candidates("emitted_tokens"))
    ws_s, we_s = sc.phase("window_start"), sc.phase("window_end", last=True)
    ws_s, we_s, edge_note = _good_edges(sc, emitted, ws_s, we_s)
    win: tuple[float, float] | None
    if ws_s is not None and we_s is not None and we_s.t_mono > ws_s.t_mono:
        win, win_source = (ws_s.t_mono, we_s.t_mono), "window_start/window_end scrape times" + edge_note
    else:
        win, win_source = window, "given window (no window scrapes)"
    t_starts = [r.t_start for r in records]
    t_ends = [r.t_end for r in records if r.t_end]
    counts = _Counts(table=table, usage_pc=usage_tokens_per_chunk(table), words_pc=words_per_chunk(table),
                     chunks_pc=text_chunks(table), tok_pc=tok_pc, tok_req=tok_req, win=win,
                     win_from_scrapes=win_source.startswith("window_start"),
                     trial_span=(min(t_starts), max(t_ends)) if t_starts and t_ends else None)

    result = TrialResults(
        engine=engine, counter_moves=names.counter_moves, concurrency=concurrency, speculative=speculative, emitted_metric=emitted,
        window=Window.model_validate({"start": win[0] if win else None, "end": win[1] if win else None,
                                      "seconds": counts.seconds, "from": win_source}),
        scrapes=[ScrapeRef(phase=p.phase, t_mono=p.t_mono, error=p.error) for p in sc.all],
        requests=_requests(records, int(table.continuous.sum())),
    )
    result.integrity = _integrity(records, sc, emitted)
    result.scrape_intervals = _scrape_intervals(sc, emitted, table, counts.usage_pc, records,
                                                 win if counts.win_from_scrapes else None)
    warnings: list[str] = []
    if result.scrape_intervals.stale_suspected:
        warnings.append(result.scrape_intervals.note)

    d_win = sc.delta(emitted, ws_s, we_s)
    result.throughput = _throughput(sc, emitted, d_win, counts, tokenizer is not None)
    if names.counts_whole_requests and win is not None and counts.win_from_scrapes:
        result.throughput.counter_window = _whole_requests_window(records, d_win, win, emitted, engine)
        if result.throughput.usage_window.value is None:
            spread = _final_usage_window(records, counts)
            if spread is not None:
                result.throughput.usage_window = spread
    if any(r.error is None for r in slots):
        result.throughput.slots_window = slots_window(slots, records)
    counter_tps = result.throughput.counter_window.number() if counts.win_from_scrapes else None
    d_trial = sc.delta(emitted, sc.phase("pre"), sc.phase("post", last=True))
    result.whole_trial, _words_req = _whole_trial(records, sc, emitted, counts, concurrency, d_trial)
    spec_block, d_dt_w, d_acc_w = _spec_decode(records, sc, names, emitted, speculative, win, d_win, ws_s, we_s)
    result.spec_decode = spec_block
    k = spec_block.k if spec_block is not None else None
    result.log_line = _log_block(log_lines, win, counts.trial_span, k, d_win.value, d_dt_w, d_acc_w)
    result.per_stream = _per_stream(records, counter_tps)
    result.latency = _latency(records, sc, names, counts, ws_s, we_s)
    result.server_samples = _server_samples(sc, names, win)
    samples = result.server_samples
    samples.prefix_cache_hit_rate = _prefix_cache(sc, names, ws_s, we_s)
    samples.prefix_cache_per_request = _prefix_cache_per_request(records, win)
    if samples.prefix_cache_hit_rate.value is None and samples.prefix_cache_per_request is not None:
        samples.prefix_cache_hit_rate = samples.prefix_cache_per_request  # no counters: the answers' own
    energy = _simulated_energy(sc, ws_s, we_s, d_win)
    if energy is not None:
        result.telemetry = {"energy_per_token_j": energy}
    _check(result, sc, emitted, counts, engine, concurrency, records, d_win, d_trial, ws_s, we_s, open_loop,
           whole_requests=names.counts_whole_requests)

    rows = _methods(result, emitted, d_win, counter_tps, k, d_dt_w, d_acc_w,
                    timings=(records, win, concurrency) if not open_loop else None)
    if d_win.resets:
        warnings.append(f"counter restarted inside the window: {d_win.note}")
    if d_win.went_backwards_without_reset:
        warnings.append(f"counter went backwards inside the window: {d_win.note}")
    if warnings:
        rows[0].note = "SUSPECT: " + " | ".join(warnings) + " -- " + rows[0].note
        setattr(result.throughput.counter_window, "suspect", True)
    result.methods = rows
    result.warnings = warnings + _other_models(sc, emitted, ws_s, we_s, model)
    return result


def _good_edges(sc: _Scrapes, emitted: str | None, ws: ParsedScrape | None, we: ParsedScrape | None,
                ) -> tuple[ParsedScrape | None, ParsedScrape | None, str]:
    """The window's edge scrapes; an edge whose read failed (after its retries) gives way to the
    nearest good scrape inside the window that has the counter, and the window's source says so."""
    if ws is None or we is None or (ws.ok and we.ok) or emitted is None:
        return ws, we, ""
    inside = [p for p in sc.all if p.ok and p.has(emitted) and ws.t_mono <= p.t_mono <= we.t_mono]
    said = []
    if not ws.ok and inside:
        new = inside[0]
        said.append(f"window_start read failed ({ws.error}): the window starts at the next good scrape, "
                    f"{new.t_mono - ws.t_mono:.2f} s later")
        ws = new
    if not we.ok and inside:
        new = inside[-1]
        said.append(f"window_end read failed ({we.error}): the window ends at the last good scrape, "
                    f"{we.t_mono - new.t_mono:.2f} s earlier")
        we = new
    return ws, we, ("; " + "; ".join(said)) if said else ""


def _other_models(sc: _Scrapes, emitted: str | None, ws_s: ParsedScrape | None, we_s: ParsedScrape | None,
                  model: str | None) -> list[str]:
    """What the trial says of the other models a server serves (their series are not truthput's)."""
    if sc.unmatched_models:
        return [f"the server's series are labelled by model ({', '.join(sc.unmatched_models)}), none of them "
                f"{model!r}, the model truthput asked for: its counters are summed over all of them"]
    if not sc.other_models:
        return []
    moved = sc.other_delta(emitted, ws_s, we_s)
    span = (we_s.t_mono - ws_s.t_mono) if ws_s is not None and we_s is not None else 0.0
    rate = f"{moved / span:.1f} tok/s" if moved is not None and span > 0 else "an unknown rate"
    return [f"other traffic: the server also serves {', '.join(sc.other_models)}, whose token counter moved at "
            f"{rate} over the window; every counter figure here is read from model {sc.model!r}'s series only"]
