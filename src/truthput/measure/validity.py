"""Validity checks: a figure that may be wrong gets a named flag with its reason.

Each check bounds a figure by something else that was observed in the same trial, using only
signals a real server gives: text chunks that arrived, usage counts, the server's own
running-requests gauge, the client's timestamps and self-check. A clean trial raises no flag.

- `stale_counter`: the emitted-token counter rose less than the text chunks that arrived (for
  engines that stream per-token deltas every text chunk carries at least one token), or trailed
  the usage counts placed in time, or went backwards: /metrics served an older state.
- `counter_reset`: the counter restarted inside the interval; the increments before the restart
  are lost, so the figure is a lower bound.
- `foreign_traffic`: the counter rose more than truthput's own requests can have produced in the
  interval (their tokens received, placed in time by running usage or by each request's final
  usage spread over its chunks, plus those in flight at the edges): another client, another
  model, or a /metrics out of step with what this client received. The reason names the excess
  in tok/s and as a share of truthput's own.
- `burst_delivery`: responses arrived faster than client timestamps can resolve decoding
  (whole responses in one read): per-stream rates and inter-token latencies are not measurable.
- `per_stream_exceeds_aggregate`: per-stream decode rate x the requests running exceeds the
  aggregate by more than PER_STREAM_SLACK: the two cannot both be right.
- `load_not_reached`: the server's own gauge never showed the intended concurrency in the
  window, or the client reported itself the bottleneck: the figure is not the one asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from truthput.load.records import RequestRecord
from truthput.load.rows import RowUse
from truthput.measure.model import Figure, Flag, TrialResults

PER_TOKEN_ENGINES = frozenset({"vllm", "sglang", "llamacpp"})
"""Engines whose streams carry one delta per decode step (a text chunk is at least one token)."""

EDGE_CHUNKS_PER_STREAM = 2
"""Chunks per stream that may arrive inside an interval though their tokens were counted before
it opened (in flight on the wire or in the server's output queue at a scrape)."""

SCRAPE_MOMENT_S = 0.005
"""The least uncertainty of a scrape's moment on the server: the client times it at the midpoint of
request and response, and the server renders it somewhere in between (a few ms on loopback)."""

BURST_TOKEN_INTERVAL_S = 1e-4
"""Below 0.1 ms per token (over 10,000 tokens/s in one stream) client timestamps measure the
network and the event loop, not decoding."""

BURST_SHARE = 0.1
"""A trial is flagged when at least this share of its multi-token requests arrived that fast."""

PER_STREAM_SLACK = 3.0
"""Per-stream rates leave out TTFT and the gaps between requests, so rate x running requests
can exceed the aggregate; by more than 3x the decode would fill under a third of each stream's time."""

LOAD_REACHED_SHARE = 0.75
"""The server's running gauge must reach this share of the intended concurrency at least once."""


def add_flag(fig: Figure | None, code: str, reason: str) -> None:
    if fig is not None and all(f.code != code for f in fig.flags):
        fig.flags.append(Flag(code=code, reason=reason))


def flag_foreign(counter: Figure, rise: float, own: float, seconds: float | None, said: str,
                 window: tuple[float, float, float] | None = None) -> None:
    """`foreign_traffic` on a counter that rose by `rise` where truthput's own requests explain
    `own` tokens: the excess in tok/s (over `seconds`) and as a share of truthput's own. `window`:
    (rise, own, seconds) over the whole window, which sizes the excess where one interval between
    two scrapes caught it (another client's burst in 0.7 s is not its rate)."""
    if window is not None and window[2] > 0:
        rise, own, seconds = window
        said += f"; over the window's {seconds:.1f} s the counter rose {rise:.0f} against {own:.0f} of truthput's"
    excess = rise - own
    rate = f"{excess / seconds:.1f} tok/s" if seconds else f"{excess:g} tokens"
    share = f", {excess / own:+.0%} of truthput's own" if own > 0 else ""
    add_flag(counter, "foreign_traffic",
             f"{said}: {rate} more than truthput's own requests can have produced{share} -- another client or "
             "model on this server, or a /metrics out of step with what this client received")


def edge_slack(concurrency: int, tokens_per_chunk: int = 1) -> int:
    """Tokens two counts of the same interval may differ by through its edges alone: chunks whose
    tokens a scrape counted before the client read them (or after), EDGE_CHUNKS_PER_STREAM per
    stream plus a few, each carrying up to `tokens_per_chunk` tokens."""
    return (EDGE_CHUNKS_PER_STREAM * max(concurrency, 1) + 4) * max(tokens_per_chunk, 1)


def _flag_restarts(results: TrialResults, window_resets: int, window_backwards: bool, trial_resets: int) -> None:
    """A counter that restarted (a lower bound) or went backwards without a restart (stale)."""
    counter = results.throughput.counter_window
    if window_resets:
        add_flag(counter, "counter_reset",
                 f"the counter restarted {window_resets}x inside the window: tokens before each restart are "
                 "lost, so this is a lower bound")
    if trial_resets:
        reason = (f"the counter restarted {trial_resets}x during the trial: tokens before each restart are lost, "
                  "so this is a lower bound")
        add_flag(results.whole_trial.counter_trial, "counter_reset", reason)
        add_flag(results.integrity.counter_delta, "counter_reset", reason)
    if window_backwards:
        add_flag(counter, "stale_counter", "the window's last scrape was stale (below an earlier one, no restart: "
                                           "a lagging replica or cache): its end is read at the highest earlier "
                                           "value, an under-count")


def check_counter(results: TrialResults, engine: str, concurrency: int, chunk_t: np.ndarray,
                  text_chunk: np.ndarray, intervals: Sequence[tuple[float, float, float | None, int]],
                  window_resets: int, window_backwards: bool, trial_resets: int,
                  usage_tokens: float | None = None, max_tokens_per_chunk: int = 1,
                  window_rise: float | None = None,
                  finished: Sequence[tuple[float, int]] | None = None, moment_tokens: float = 0.0,
                  spans: Sequence[tuple[float, float, int]] | None = None,
                  placed: Sequence[float] | None = None, window_s: float | None = None) -> None:
    """Flag the counter figures. `intervals`: (t_from, t_to, counter increase or None, resets)
    between consecutive readable scrapes inside the window; `usage_tokens`: the usage counts of
    the chunks that arrived in the window (None without continuous usage on every request);
    `finished`: (end time, usage.completion_tokens) of every ok request, given for an engine whose
    counter adds a request's tokens when it ends (then the bound is whole requests, not chunks);
    `moment_tokens`: tokens produced while the two edge scrapes were being served (their moment on
    the server is known only to within half their round trip); `spans`: (first chunk, end,
    usage.completion_tokens) of every ok request and `placed` (final usage spread over chunks, per
    interval), for the bounds that need no tokens per chunk; `window_s`: the window's length (the
    excess of a foreign-traffic flag in tok/s)."""
    counter = results.throughput.counter_window
    if finished is not None:
        _check_whole_requests(results, intervals, finished, window_resets, window_backwards, trial_resets)
        return
    if usage_tokens is None and spans is not None and placed is not None and _moves_at_request_end(
            intervals, spans, placed, edge_slack(concurrency, max_tokens_per_chunk) + moment_tokens):
        # what a per-token bound would call stale is a counter that counts whole requests: its true
        # cause said, and whole-request bounds left to see another client's tokens above them
        _check_whole_requests(results, intervals, [(b, n) for _a, b, n in spans], window_resets, window_backwards,
                              trial_resets)
        add_flag(counter, "stale_counter",
                 "the counter moves when a request ends, not per token: between scrapes it rose by the usage of "
                 "the requests that ended between them, not by the tokens made meanwhile, so a window over it is "
                 "off by the requests running at its edges")
        return
    if usage_tokens is not None and window_rise is not None and not window_resets:
        # Both count the same tokens; they differ only by the tokens in flight at the two edges,
        # which cancel in steady state but not when the client reads late (a busy host).
        slack = int(edge_slack(concurrency, max_tokens_per_chunk) + moment_tokens)
        if window_rise < usage_tokens - slack:
            add_flag(counter, "stale_counter",
                     f"the counter rose {window_rise:g} in the window while the usage counts of the chunks that "
                     f"arrived in it add up to {usage_tokens:g} (more than {slack} apart): /metrics is behind")
        elif window_rise > usage_tokens + slack:
            flag_foreign(counter, window_rise, usage_tokens, window_s,
                         f"the counter rose {window_rise:g} in the window while the usage counts of the chunks that "
                         f"arrived in it add up to {usage_tokens:g} (more than {slack} apart)")
    _flag_restarts(results, window_resets, window_backwards, trial_resets)
    if results.scrape_intervals.stale_suspected:
        add_flag(counter, "stale_counter", results.scrape_intervals.note)
    if engine not in PER_TOKEN_ENGINES:
        results.validity.not_applied.append(
            f"chunk bound on the counter: engine {engine!r} is not known to stream one delta per token")
        if usage_tokens is None and spans is not None and placed is not None:
            _check_request_spans(results, intervals, spans, placed,
                                 edge_slack(concurrency, max_tokens_per_chunk) + moment_tokens)
        return
    results.validity.applied.append("chunk bound on the counter (tokens in an interval >= text chunks that "
                                    f"arrived in it - {EDGE_CHUNKS_PER_STREAM} per stream)")
    total_chunks = int(text_chunk.sum())
    tokens = results.integrity.usage_sum_ok.number()
    if usage_tokens is None and tokens and total_chunks and tokens > 1.05 * total_chunks:
        results.validity.not_applied.append(
            f"tight chunk bound: chunks carried {tokens / total_chunks:.2f} tokens on average, so without running "
            "usage a counter is caught only when it lags by more than that share of the tokens")
    if usage_tokens is None and spans is not None and placed is not None:
        # without running usage the chunks bound the counter from below only: truthput's own
        # requests' final usage, placed on their chunks, bounds it from above (another client)
        _check_request_spans(results, intervals, spans, placed,
                             edge_slack(concurrency, max_tokens_per_chunk) + moment_tokens)
    slack = edge_slack(concurrency)
    for t_from, t_to, rise, resets in intervals:
        if rise is None or resets:
            continue
        arrived = int(text_chunk[(chunk_t > t_from) & (chunk_t <= t_to)].sum())
        if arrived - slack > rise:
            add_flag(counter, "stale_counter",
                     f"between scrapes {t_to - t_from:.2f} s apart the counter rose {rise:g} while {arrived} text "
                     f"chunks arrived (each is at least one token): /metrics is behind what was served")
            break


def _window_of(intervals: Sequence[tuple[float, float, float | None, int]], owns: Sequence[float],
               ) -> tuple[float, float, float]:
    """(the counter's rise, truthput's own tokens, seconds) summed over the readable intervals."""
    kept = [(t_to - t_from, rise, own) for (t_from, t_to, rise, resets), own in zip(intervals, owns)
            if rise is not None and not resets]
    return sum(r for _s, r, _o in kept), sum(o for _s, _r, o in kept), sum(s for s, _r, _o in kept)


def _out_of_bounds(counter: Figure, rise: float, seconds: float, bounds: tuple[float, float], own: float,
                   said: tuple[str, str], window: tuple[float, float, float] | None = None) -> bool:
    """Flag a counter that rose by less than the lower bound (stale) or more than the upper bound
    (foreign traffic) of what truthput's own requests explain between two scrapes; `said` tells
    each bound's basis."""
    where = f"between scrapes {seconds:.2f} s apart the counter rose {rise:g} while"
    if rise < bounds[0]:
        add_flag(counter, "stale_counter", f"{where} {said[0]}: /metrics is behind what was served")
        return True
    if rise > bounds[1]:
        flag_foreign(counter, rise, own, seconds, f"{where} {said[1]}", window)
        return True
    return False


FINISH_EDGE_S = 0.25
"""A request that ended this close to a scrape may fall on either side of it (the server adds its
tokens as it releases the request; the scrape itself takes a few milliseconds)."""


def _check_whole_requests(results: TrialResults, intervals: Sequence[tuple[float, float, float | None, int]],
                          finished: Sequence[tuple[float, int]], window_resets: int, window_backwards: bool,
                          trial_resets: int) -> None:
    """Bounds for a counter that moves when a request ends: between two scrapes it must have risen
    by at least the tokens of every request that surely ended between them, and by at most those
    of every request that may have."""
    counter = results.throughput.counter_window
    _flag_restarts(results, window_resets, window_backwards, trial_resets)
    results.validity.applied.append(
        "whole-request bound on the counter (it adds a request's tokens when the request ends: between two scrapes "
        "it rose by the usage of the requests that ended between them)")
    results.validity.not_applied.append(
        "chunk bound on the counter: this engine's counter moves when a request ends, not per token")
    ends = np.asarray([t for t, _n in finished], dtype=float)
    tokens = np.asarray([n for _t, n in finished], dtype=float)
    e = FINISH_EDGE_S
    window = _window_of(intervals, [float(tokens[(ends > a) & (ends <= b)].sum()) for a, b, _r, _n in intervals])
    for t_from, t_to, rise, resets in intervals:
        if rise is None or resets:
            continue
        sure = float(tokens[(ends > t_from + e) & (ends <= t_to - e)].sum())
        may = float(tokens[(ends > t_from - e) & (ends <= t_to + e)].sum())
        if _out_of_bounds(counter, rise, t_to - t_from, (sure, may), may,
                          (f"requests that ended between them carried {sure:g} tokens (usage)",
                           f"every request that may have ended between them carried {may:g} tokens"), window):
            break


SPAN_EDGE_S = 0.05
"""How much earlier than the client read it a chunk may have been counted (the wire, a client that
reads late, a scrape's moment): a request is "wholly between" two scrapes only this far inside."""

PLACED_SHARE = 0.02
"""Final usage spread evenly over a request's text chunks places its tokens in time to within the
unevenness of its chunks at the interval's edges; beyond the edge chunks, this share is allowed."""


def _moves_at_request_end(intervals: Sequence[tuple[float, float, float | None, int]],
                          spans: Sequence[tuple[float, float, int]], placed: Sequence[float],
                          edge_tokens: float) -> bool:
    """Whether the counter behaved as one that adds a request's tokens when it ends: below the
    per-token lower bound in some interval (`_check_request_spans`: what would be called stale), yet
    never below the usage of the requests that surely ended in an interval. Another client's tokens
    only add, so they cannot make this true or false."""
    first = np.asarray([a for a, _b, _n in spans], dtype=float)
    ends = np.asarray([b for _a, b, _n in spans], dtype=float)
    tokens = np.asarray([n for _a, _b, n in spans], dtype=float)
    below_per_token = False
    for (t_from, t_to, rise, resets), est in zip(intervals, placed):
        if rise is None or resets:
            continue
        ended = float(tokens[(ends > t_from + FINISH_EDGE_S) & (ends <= t_to - FINISH_EDGE_S)].sum())
        if rise < ended:
            return False
        low = max(float(tokens[(first > t_from + SPAN_EDGE_S) & (ends <= t_to - SPAN_EDGE_S)].sum()),
                  est - edge_tokens - PLACED_SHARE * est)
        below_per_token = below_per_token or rise < low
    return below_per_token


def _check_request_spans(results: TrialResults, intervals: Sequence[tuple[float, float, float | None, int]],
                         spans: Sequence[tuple[float, float, int]], placed: Sequence[float],
                         edge_tokens: float) -> None:
    """Bounds for a counter that moves per token when chunks carry an unknown number of tokens and
    usage comes only at the end. Sure: between two scrapes the counter rose by at least the usage of
    the requests made wholly between them, by at most that of the requests running between them.
    Estimated: by about the final usage spread over each request's text chunks (`placed`, one per
    interval), give or take the edge chunks (`edge_tokens`) and PLACED_SHARE."""
    counter = results.throughput.counter_window
    results.validity.applied.append(
        "request-span bound on the counter (final usage spread over each request's chunks, and the usage of the "
        "requests made wholly between two scrapes / running between them)")
    first = np.asarray([a for a, _b, _n in spans], dtype=float)
    ends = np.asarray([b for _a, b, _n in spans], dtype=float)
    tokens = np.asarray([n for _a, _b, n in spans], dtype=float)
    e = SPAN_EDGE_S
    window = _window_of(intervals, placed)
    for (t_from, t_to, rise, resets), est in zip(intervals, placed):
        if rise is None or resets:
            continue
        slack = edge_tokens + PLACED_SHARE * est
        low = max(float(tokens[(first > t_from + e) & (ends <= t_to - e)].sum()), est - slack)
        high = min(float(tokens[(ends > t_from - e) & (first <= t_to + e)].sum()), est + slack)
        placed_text = f"the requests' final usage placed on their chunks puts {est:.0f} tokens between them"
        if _out_of_bounds(counter, rise, t_to - t_from, (low, high), est,
                          (f"{placed_text} (at least {low:.0f})", f"{placed_text} (at most {high:.0f})"), window):
            break


def check_timestamps(results: TrialResults, records: Sequence[RequestRecord], concurrency: int) -> None:
    """Flag per-stream and latency figures the client's timestamps cannot resolve."""
    multi = [r for r in records if r.status == "ok" and (r.completion_tokens or 0) >= 4 and r.t_first is not None
             and len(r.chunk_times)]
    fast = [r for r in multi
            if (r.chunk_times[-1] - r.chunk_times[0]) / max((r.completion_tokens or 2) - 1, 1) < BURST_TOKEN_INTERVAL_S]
    ps, lat = results.per_stream, results.latency
    if multi and len(fast) >= BURST_SHARE * len(multi):
        reason = (f"{len(fast)} of {len(multi)} responses arrived faster than {BURST_TOKEN_INTERVAL_S * 1e3:g} ms "
                  "per token (whole responses in one read): client timestamps cannot resolve decoding")
        for fig in (ps.decode_tps_mean, ps.decode_tps_median):
            add_flag(fig, "burst_delivery", reason)
        for dist in (lat.itl, lat.tpot):
            for q in (dist.mean, dist.p50, dist.p90, dist.p99):
                add_flag(q, "burst_delivery", reason)
    rate = ps.decode_tps_mean.number()
    aggregate = results.headline().number()
    samples = results.server_samples.running_mean
    running = samples.number() if samples is not None and samples.value is not None else float(concurrency)
    if rate is not None and aggregate and running and rate * running > PER_STREAM_SLACK * aggregate:
        reason = (f"per-stream {rate:.1f} tok/s x {running:.1f} running requests = {rate * running:.1f} is over "
                  f"{PER_STREAM_SLACK:g}x the aggregate {aggregate:.1f} tok/s: the per-stream timestamps or the "
                  "aggregate are wrong")
        for fig in (ps.decode_tps_mean, ps.decode_tps_median):
            add_flag(fig, "per_stream_exceeds_aggregate", reason)


def check_load(results: TrialResults, concurrency: int) -> None:
    """Flag the window's throughput figures when the server never saw the intended load."""
    s = results.server_samples
    if s.n >= 2 and s.running_max is not None and s.running_max.value is not None and concurrency >= 1:
        need = math.ceil(LOAD_REACHED_SHARE * concurrency)
        if s.running_max.value < need:
            mean = s.running_mean.number() if s.running_mean is not None else None
            reason = (f"the server's running-requests gauge reached at most {s.running_max.value:g} "
                      f"(mean {mean:.1f}) in {s.n} samples of the window; the load meant {concurrency}"
                      if mean is not None else f"the server never ran {need} requests at once in the window")
            for fig in (results.throughput.counter_window, results.throughput.usage_window):
                add_flag(fig, "load_not_reached", reason)


HOST_OTHER_CORES = 0.5
"""Other processes using more than half a core on average during the window is interference."""


def _cores_used(used: float, cores: int | None) -> str:
    """'1.40 of 2 CPU cores'; a figure at or over the host's cores (tick rounding) reads 'all'."""
    if cores and used >= cores - 0.005:
        return f"all {cores} CPU cores"
    return f"{used:.2f} of {cores} CPU cores"


def check_interference(results: TrialResults) -> None:
    """Flag the window's throughput figures when something else used the host's CPU or the GPU."""
    i = results.interference
    other = i.host_other_cores.number() if i.host_other_cores is not None else None
    if other is not None and other > HOST_OTHER_CORES:
        flag_window(results, "host_interference",
                    f"other processes used {_cores_used(other, i.host_cores)} on this host during the window "
                    "(besides truthput and the server)")
    if i.gpu_foreign_pids:
        flag_window(results, "gpu_interference", "other processes computed on the GPU during the trial "
                                                 f"(pids {', '.join(map(str, i.gpu_foreign_pids))})")
    if i.gpu_throttle_samples:
        seen = ", ".join(f"{k} in {v} sample(s)" for k, v in i.gpu_throttle_samples.items())
        flag_window(results, "gpu_throttled", f"the GPU's clocks were held down during the trial: {seen}")


WINDOW_METHOD_ROWS = {"counter (window)": "counter_window", "usage placed in time (window)": "usage_window"}


def flag_window(results: TrialResults, code: str, reason: str) -> None:
    """Flag both window figures for a condition of the whole window (found after measuring, by
    the pipeline's host checks), and the audit's rows of the same figures."""
    for fig in (results.throughput.counter_window, results.throughput.usage_window):
        add_flag(fig, code, reason)
    for row in results.methods:
        if row.method in WINDOW_METHOD_ROWS and all(f.code != code for f in row.flags):
            row.flags.append(Flag(code=code, reason=reason))


def check_client(results: TrialResults) -> None:
    """Flag the window's throughput figures when the client says it was the bottleneck, or that
    its streams never all generated at once (the server queued some of them)."""
    if results.client.never_settled:
        flag_window(results, "load_not_reached",
                    next((n for n in results.client.notes if n.startswith("never settled")),
                         "the streams never all generated at once: the server did not run the intended concurrency"))
    check = results.client.selfcheck
    if check is not None and check.client_bound:
        flag_window(results, "load_not_reached",
                    f"the load generator was the bottleneck ({check.reason}): the server may not have seen the load")


WORK_TOLERANCE = 0.05
"""Requests whose usage differs from what they asked by more than this share are said to."""


def check_work(results: TrialResults, records: Sequence[RequestRecord],
               asked: Callable[[int], tuple[int | None, int | None]], ignore_eos: bool, exact_prompts: bool,
               chat: bool) -> None:
    """Compare the work the ok requests did (usage) with what they asked for, and say where it
    differs: outputs cut short under `ignore_eos` (a context limit or a stop), prompts of another
    length than asked (words are not tokens; a chat template adds tokens). The figures go into
    `results.requests`; the sentences into `results.warnings`, which every view shows."""
    ok = [r for r in records if r.status == "ok"]
    pairs = [(asked(r.idx), r) for r in ok]
    want_p = [a[0] for a, _r in pairs if a[0] is not None]
    want_c = [a[1] for a, _r in pairs if a[1] is not None]
    req = results.requests
    req.prompt_tokens_asked_mean = sum(want_p) / len(want_p) if want_p else None
    req.completion_tokens_asked_mean = sum(want_c) / len(want_c) if want_c else None
    got_c = [(r.completion_tokens, a[1]) for a, r in pairs if r.completion_tokens is not None and a[1]]
    short = [(g, w) for g, w in got_c if g < (1 - WORK_TOLERANCE) * w]
    if ignore_eos and short:
        ends = ", ".join(f"{k} {n}" for k, n in sorted(req.finish_reasons.items(), key=lambda kv: -kv[1]))
        got = sorted(g for g, _w in short)
        req.work_notes.append(
            f"{len(short)} of {len(got_c)} requests got fewer completion tokens than asked under ignore_eos "
            f"({_span(got)} against {_span(sorted(w for _g, w in short))}; finish_reason: {ends or 'unknown'}): "
            "a context limit or a stop cut them (e.g. llama.cpp's -c shared by -np slots, vLLM's --max-model-len), "
            "so this tok/s is over less work than the workload asks")
    got_p = [(r.prompt_tokens, a[0]) for a, r in pairs if r.prompt_tokens is not None and a[0]]
    if got_p:
        mean_got = sum(g for g, _w in got_p) / len(got_p)
        mean_want = sum(w for _g, w in got_p) / len(got_p)
        if abs(mean_got - mean_want) > WORK_TOLERANCE * mean_want:
            why = ("the chat template adds its own tokens" if chat else
                   "the tokenizer given counts otherwise than the server's" if exact_prompts else
                   "prompts are built from words at about 0.75 words a token; give the model's tokenizer.json "
                   "for exact lengths (`load --tokenizer`; in an experiment, [model] path to the model's folder)")
            req.work_notes.append(
                f"prompts arrived as {_span(sorted(g for g, _w in got_p))} tokens as the server counted them "
                f"(asked {_span(sorted(w for _g, w in got_p))}): {why}")
    results.warnings.extend(req.work_notes)


def _span(values: Sequence[int]) -> str:
    """`97-100`, or `128` where all are equal (values sorted)."""
    return f"{values[0]}" if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def check_rows(results: TrialResults, use: RowUse | None) -> None:
    """A trial that sent one of the user's rows again to the same server (the file ran out) is
    measured partly on the server's prefix cache: `workload_repeats` on its throughput figures
    (uncertain: the figure is the server's, the traffic is not the user's), with the window's
    prefix-cache hit rate where the server counts it."""
    results.rows = use
    if use is None or not use.repeats:
        return
    rate = results.server_samples.prefix_cache_hit_rate
    hits = rate.number() if rate is not None else None
    said = use.said() + (f"; the window's prefix-cache hit rate was {hits:.0%}" if hits is not None else "")
    for fig in (results.throughput.counter_window, results.throughput.usage_window):
        add_flag(fig, "workload_repeats", said)


REPLAY_LATE_S = 0.05
"""A replay whose sends' p99 lateness is beyond this (or that left requests unsent) did not offer
the trace's load: `replay_behind`, and its rate-dependent figures are not compared."""


def check_replay(results: TrialResults, lateness: Sequence[float], scheduled: int,
                 offsets: Sequence[float], send_times: Sequence[float]) -> None:
    """The replay's fidelity (`results.replay`), and `replay_behind` on its throughput where it fell
    behind its schedule, with the cause where the client knows it."""
    from truthput.load.trace import lateness_figures
    from truthput.measure.model import Replay

    p50, p99, worst = lateness_figures(lateness)
    span = offsets[-1] - offsets[0] if len(offsets) > 1 else 0.0
    sent_span = max(send_times) - min(send_times) if len(send_times) > 1 else 0.0
    replay = Replay(scheduled=scheduled, sent=len(lateness), lateness_p50_ms=1000 * p50, lateness_p99_ms=1000 * p99,
                    lateness_max_ms=1000 * worst, requested_rate=(len(offsets) - 1) / span if span > 0 else None,
                    achieved_rate=(len(send_times) - 1) / sent_span if sent_span > 0 else None)
    results.replay = replay
    unsent = scheduled - len(lateness)
    if p99 <= REPLAY_LATE_S and not unsent:
        return
    lag = results.client.selfcheck.loop_lag_p99_ms if results.client.selfcheck is not None else None
    cause = (f"the client's event loop lagged {lag:.0f} ms at p99 (its CPU)" if lag is not None and lag > 20 else
             "the cause is not known to the client (a cap on requests in flight, or the host)")
    said = (f"the replay fell behind its schedule: sends {1000 * p99:.0f} ms late at p99 (worst {1000 * worst:.0f} ms)"
            + (f", {unsent} of {scheduled} requests not sent" if unsent else "")
            + f"; {cause}: the server was not offered the trace's load, so figures that depend on it are not compared")
    for fig in (results.throughput.counter_window, results.throughput.usage_window):
        add_flag(fig, "replay_behind", said)
