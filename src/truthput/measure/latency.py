"""Latency from client timestamps, never treating a chunk as a token, with the server's histograms.

ITL spreading rule (stated in the output): within a request, a chunk that brings n >= 1 tokens
(running usage count difference, else tokenizer count) after a gap g since the previous
token-bearing chunk counts as n inter-token intervals of g/n. Tokens that arrive with the first
token (in the first chunk) belong to TTFT and add no interval. TPOT per request =
(last chunk - first token) / (completion_tokens - 1), vLLM's definition.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from truthput.load.records import RequestRecord
from truthput.measure.methods import ChunkTable, figure
from truthput.measure.model import Distribution, Latency
from truthput.measure.prom import Histogram

ITL_RULE = (
    "a chunk bringing n tokens (running usage count, else tokenizer) after a gap g since the previous "
    "token-bearing chunk of the same request counts as n intervals of g/n; tokens in the first chunk add none"
)
QUANTILES = (50, 90, 99)


def distribution(values: np.ndarray, unit: str, source: str, note: str | None = None, **extra: Any) -> Distribution:
    """mean and p50/p90/p99 of `values` as figures."""
    if values.size == 0:
        return Distribution(n=0, mean=figure(None, unit, source, note or "no samples"), **extra)
    qs = np.percentile(values, QUANTILES)
    quantiles = {f"p{q}": figure(float(v), unit, source) for q, v in zip(QUANTILES, qs)}
    return Distribution(n=int(values.size), mean=figure(float(values.mean()), unit, source, note), **quantiles,
                        **extra)


def itl_values(table: ChunkTable, tokens_per_chunk: np.ndarray) -> np.ndarray:
    """Inter-token intervals by the spreading rule; chunks with unknown counts (-1) are skipped
    (their requests should be excluded by the caller)."""
    bearing = tokens_per_chunk > 0
    idx = np.nonzero(bearing)[0]
    if idx.size < 2:
        return np.zeros(0)
    t = table.t[idx]
    rec = table.rec[idx]
    n = tokens_per_chunk[idx]
    same = rec[1:] == rec[:-1]
    gaps = (t[1:] - t[:-1])[same]
    counts = n[1:][same]
    return np.repeat(gaps / counts, counts)


def client_latency(
    records: Sequence[RequestRecord], table: ChunkTable, usage_per_chunk: np.ndarray, tok_per_chunk: np.ndarray | None
) -> Latency:
    ok = [r for r in records if r.status == "ok"]
    ttft = np.array([r.t_first - r.t_start for r in ok if r.t_first is not None])
    e2e = np.array([r.t_end - r.t_start for r in ok])
    tpot = np.array(
        [
            (r.chunk_times[-1] - r.t_first) / (r.completion_tokens - 1)
            for r in ok
            if r.t_first is not None and r.completion_tokens and r.completion_tokens > 1 and r.chunk_times
        ]
    )
    out = Latency(
        ttft=distribution(ttft, "s", "client_clock", "first chunk with text - request sent"),
        e2e=distribution(e2e, "s", "client_clock"),
        tpot=distribution(tpot, "s", "client_clock", "(last chunk - first token) / (completion_tokens - 1)",
                          tokens_source="usage"),
    )
    ok_mask = np.zeros(table.n_chunks.shape[0], dtype=bool)
    ok_mask[[i for i, r in enumerate(records) if r.status == "ok"]] = True
    per_chunk = np.where(usage_per_chunk >= 0, usage_per_chunk, -1)
    source = "usage"
    if tok_per_chunk is not None:
        use_tok = ~table.continuous[table.rec]
        if use_tok.any():
            per_chunk = np.where(use_tok, tok_per_chunk, per_chunk)
            source = "usage+tokenizer" if (~use_tok).any() else "tokenizer"
    one_each = _one_token_per_text_chunk(records, table, ok_mask) if tok_per_chunk is None else \
        np.zeros(len(records), dtype=bool)
    if one_each.any():
        take = one_each[table.rec]
        per_chunk = np.where(take, (table.n_chars > 0).astype(per_chunk.dtype), per_chunk)
        source = "usage+text chunks" if table.continuous.any() else "text chunks"
    known = per_chunk >= 0
    per_chunk = np.where(known & ok_mask[table.rec], per_chunk, 0)
    unknown_reqs = int(((~table.continuous) & ~one_each & ok_mask & (table.n_chunks > 0)).sum()) \
        if tok_per_chunk is None else 0
    itl = itl_values(table, per_chunk)
    note = ITL_RULE
    if one_each.any():
        note += (f"; {int(one_each.sum())} request(s) without running counts had as many text chunks as completion "
                 "tokens, so each text chunk is one token (a server streaming a token per chunk, as llama.cpp does)")
    if unknown_reqs:
        note += f"; {unknown_reqs} request(s) without per-chunk token counts (no continuous usage, no tokenizer) left out"
    out.itl = distribution(itl, "s", "client_clock", note, tokens_source=source, rule=ITL_RULE)
    if itl.size == 0 and unknown_reqs and out.itl.mean is not None:
        out.itl.mean.note = (
            "missing data: no per-chunk token counts (enable continuous_usage_stats or give a tokenizer); "
            "chunk gaps are not token intervals"
        )
    # Chunk gaps, labelled as such, for comparison with tools that report them as ITL.
    bearing = table.n_chars > 0
    idx = np.nonzero(bearing & ok_mask[table.rec])[0]
    if idx.size > 1:
        same = table.rec[idx][1:] == table.rec[idx][:-1]
        gaps = np.diff(table.t[idx])[same]
    else:
        gaps = np.zeros(0)
    out.chunk_gap = distribution(gaps, "s", "chunks", "time between text chunks: NOT an inter-token latency")
    return out


def _one_token_per_text_chunk(records: Sequence[RequestRecord], table: ChunkTable, ok_mask: np.ndarray) -> np.ndarray:
    """Per request: True where it has no running count but its text chunks are exactly as many as
    its final usage's completion tokens. Every text chunk brings at least one token, so then each
    brings exactly one: the chunk times are the token times (llama.cpp streams a token per chunk,
    two where it held back a UTF-8 character's first bytes; such a request does not qualify)."""
    out = np.zeros(len(records), dtype=bool)
    if table.size == 0:
        return out
    text_chunks = np.bincount(table.rec[table.n_chars > 0], minlength=len(records))
    for i, r in enumerate(records):
        if ok_mask[i] and not table.continuous[i] and r.completion_tokens and text_chunks[i] == r.completion_tokens:
            out[i] = True
    return out


def server_histograms(window_hists: dict[str, Histogram | None],
                      notes: dict[str, str] | None = None) -> dict[str, Distribution]:
    """Mean and bucket-interpolated quantiles of each histogram's observations in the window."""
    out: dict[str, Distribution] = {}
    for key, h in window_hists.items():
        if h is None:
            why = (notes or {}).get(key, "histogram not exposed (or a window scrape is missing)")
            out[key] = Distribution(mean=figure(None, "s", "server_counter", why))
            continue
        quantiles = {f"p{q}": figure(h.histogram_quantile(q / 100), "s", "server_counter", "interpolated inside histogram buckets")
                     for q in QUANTILES}
        out[key] = Distribution(n=h.count, mean=figure(h.mean, "s", "server_counter",
                                                       None if h.count else "no observations in window"), **quantiles)
    return out
