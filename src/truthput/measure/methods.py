"""Client-side ways of counting output, computed per SSE chunk so any window can be applied.

All requests' chunks are flattened once into numpy arrays (measurement must handle 10,000
requests in well under a second). Per chunk we know: its arrival time, its text, and where the
server sent `continuous_usage_stats`, the running completion-token count. From that:
- usage tokens per chunk: differences of the running count (exact, placed in time);
- tokenizer tokens per chunk: the request's whole text tokenized once, each token assigned to the
  chunk in which its last character arrived (tokenizing deltas separately would over-count);
- chunks: one per chunk with text (what GuideLLM-style fallbacks call a token);
- words: whitespace-separated words, each assigned to the chunk where it starts (the seed's probe).

`figure()` builds the one shape every figure has (`truthput.measure.model.Figure`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from itertools import chain
from typing import Any, Sequence

import numpy as np

from truthput.load.records import RequestRecord

from truthput.measure.model import Figure


def figure(value: float | int | None, unit: str, source: str, note: str | None = None, **extra: Any) -> Figure:
    """A figure; NaN/inf become None and `note` says why when there is no value."""
    return Figure(value=value, unit=unit, source=source, note=note or None, **extra)


# Code points Python's str.split() treats as whitespace.
_WHITESPACE = np.array(
    [9, 10, 11, 12, 13, 28, 29, 30, 31, 32, 133, 160, 5760, *range(8192, 8203), 8232, 8233, 8239, 8287, 12288],
    dtype=np.uint32,
)
_ASCII_SPACE = np.isin(np.arange(256, dtype=np.uint32), _WHITESPACE) & (np.arange(256) < 128)


@dataclass(slots=True)
class ChunkTable:
    """Every chunk of every request as parallel arrays (index = global chunk number)."""

    rec: np.ndarray  # int: position of the request in the records list
    t: np.ndarray  # float: arrival time (monotonic)
    running: np.ndarray  # int: running completion_tokens after the chunk, -1 unknown
    n_chars: np.ndarray  # int: characters in the chunk's text
    first_chunk: np.ndarray  # int per request: index of its first chunk
    n_chunks: np.ndarray  # int per request
    continuous: np.ndarray  # bool per request: every chunk carries a running count
    texts: list[str]  # per chunk

    @property
    def size(self) -> int:
        return int(self.t.shape[0])


def _column(seqs: list[Any], typecode: str, dtype: Any, total: int) -> np.ndarray:
    """One array of all requests' values: their buffers joined when they are packed arrays (the
    client's records), else read value by value (records built from lists, e.g. in tests)."""
    if seqs and all(type(s) is array and s.typecode == typecode for s in seqs):
        return np.concatenate([np.frombuffer(s, dtype=dtype) for s in seqs])
    return np.fromiter(chain.from_iterable(seqs), dtype=dtype, count=total)


def build_chunk_table(records: Sequence[RequestRecord]) -> ChunkTable:
    # This runs after every trial over every chunk (164k for the reference load): times and counts
    # are joined as buffers (`_column`), texts flattened by itertools.chain (in C, ~2x faster than a
    # generator expression).
    n_chunks = np.fromiter(map(len, (r.chunk_times for r in records)), dtype=np.int64, count=len(records))
    total = int(n_chunks.sum())
    t = _column([r.chunk_times for r in records], "d", np.float64, total)
    if all(len(r.chunk_texts) == len(r.chunk_times) for r in records):
        texts: list[str] = list(chain.from_iterable(r.chunk_texts for r in records))
    else:
        texts = []
        for r in records:
            pad = len(r.chunk_times) - len(r.chunk_texts)
            texts.extend(list(r.chunk_texts[: len(r.chunk_times)]) + [""] * max(pad, 0))
    if all(len(r.chunk_tokens) == len(r.chunk_times) for r in records):
        running = _column([r.chunk_tokens for r in records], "q", np.int64, total)
    else:
        running = np.full(total, -1, dtype=np.int64)
        pos = 0
        for r in records:
            n = len(r.chunk_times)
            if r.chunk_tokens:
                k = min(n, len(r.chunk_tokens))
                running[pos : pos + k] = r.chunk_tokens[:k]
            pos += n
    rec = np.repeat(np.arange(len(records), dtype=np.int64), n_chunks)
    first = np.zeros(len(records), dtype=np.int64)
    if len(records):
        first[1:] = np.cumsum(n_chunks)[:-1]
    n_chars = np.fromiter(map(len, texts), dtype=np.int64, count=total)
    has_unknown = np.zeros(len(records), dtype=bool)
    if total:
        unknown = running < 0
        if unknown.any():
            np.logical_or.at(has_unknown, rec, unknown)
    continuous = (~has_unknown) & (n_chunks > 0)
    return ChunkTable(rec, t, running, n_chars, first, n_chunks, continuous, texts)


def usage_tokens_per_chunk(table: ChunkTable) -> np.ndarray:
    """Tokens each chunk added by the running usage count; -1 where the request has no continuous count."""
    out = np.full(table.size, -1, dtype=np.int64)
    if table.size == 0:
        return out
    prev = np.empty_like(table.running)
    prev[1:] = table.running[:-1]
    prev[table.first_chunk[table.n_chunks > 0]] = 0
    diff = table.running - prev
    ok = table.continuous[table.rec]
    out[ok] = diff[ok]
    return out


def final_usage_per_chunk(table: ChunkTable, records: Sequence[RequestRecord]) -> np.ndarray:
    """Each request's final usage.completion_tokens spread evenly over its text chunks (float
    tokens per chunk; 0 for requests without usage). Only for engines that stream one delta per
    decode step, whose text chunks mark when the tokens were made (llama.cpp sends one token per
    chunk, two where a UTF-8 character's bytes were held back)."""
    out = np.zeros(table.size, dtype=float)
    has_text = table.n_chars > 0
    for i, rec in enumerate(records):
        n = int(table.n_chunks[i])
        if n == 0 or rec.status != "ok" or rec.completion_tokens is None:
            continue
        a = int(table.first_chunk[i])
        texted = has_text[a:a + n]
        k = int(texted.sum())
        if k:
            out[a:a + n][texted] = rec.completion_tokens / k
    return out


def words_per_chunk(table: ChunkTable) -> np.ndarray:
    """Whitespace words starting in each chunk (a word split across chunks counts once)."""
    if table.size == 0:
        return np.zeros(0, dtype=np.int64)
    big = "".join(table.texts)
    if not big:
        return np.zeros(table.size, dtype=np.int64)
    if big.isascii():  # the usual case: one byte per character, a 256-entry lookup
        space = np.take(_ASCII_SPACE, np.frombuffer(big.encode("ascii"), dtype=np.uint8))
    else:
        codes = np.frombuffer(big.encode("utf-32-le"), dtype=np.uint32)
        space = np.isin(codes, _WHITESPACE)
    chunk_end = np.cumsum(table.n_chars)  # exclusive end character of each chunk in `big`
    chunk_start = chunk_end - table.n_chars
    prev_space = np.empty_like(space)
    prev_space[0] = True
    prev_space[1:] = space[:-1]
    req_start = chunk_start[table.first_chunk[table.n_chunks > 0]]
    prev_space[req_start[req_start < space.shape[0]]] = True  # a new request starts a new word
    # int32: half the pages of int64 (fresh pages cost page faults on a VM); 2**31 words is far off.
    starts_before = np.zeros(space.shape[0] + 1, dtype=np.int32)  # word starts before each character
    np.cumsum(np.greater(prev_space, space, out=prev_space), out=starts_before[1:])
    words: np.ndarray = (starts_before[chunk_end] - starts_before[chunk_start]).astype(np.int64)
    return words


def text_chunks(table: ChunkTable) -> np.ndarray:
    """1 for each chunk that carried text (the 'chunk = token' method)."""
    return (table.n_chars > 0).astype(np.int64)


def tokenizer_tokens_per_chunk(table: ChunkTable, tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """(tokens per chunk, tokens per request) with a `tokenizers.Tokenizer`: each request's text is
    encoded once without special tokens; a token belongs to the chunk holding its last character."""
    per_chunk = np.zeros(table.size, dtype=np.int64)
    n_req = table.n_chunks.shape[0]
    per_req = np.zeros(n_req, dtype=np.int64)
    docs = []
    for i in range(n_req):
        a = int(table.first_chunk[i])
        docs.append("".join(table.texts[a : a + int(table.n_chunks[i])]))
    encodings = tokenizer.encode_batch(docs, add_special_tokens=False)
    cum_all = np.cumsum(table.n_chars)
    for i, enc in enumerate(encodings):
        n = int(table.n_chunks[i])
        if n == 0 or not enc.ids:
            continue
        a = int(table.first_chunk[i])
        base = int(cum_all[a - 1]) if a > 0 else 0
        bounds = cum_all[a : a + n] - base  # end char (exclusive) of each chunk
        ends = np.fromiter((o[1] for o in enc.offsets), dtype=np.int64, count=len(enc.offsets))
        chunk_of = np.searchsorted(bounds, np.maximum(ends, 1), side="left")
        chunk_of = np.minimum(chunk_of, n - 1)
        per_chunk[a : a + n] += np.bincount(chunk_of, minlength=n)
        per_req[i] = len(enc.ids)
    return per_chunk, per_req


def in_window(table: ChunkTable, window: tuple[float, float]) -> np.ndarray:
    """Chunks that arrived in (start, end]."""
    ws, we = window
    return (table.t > ws) & (table.t <= we)


def per_request_sum(table: ChunkTable, per_chunk: np.ndarray) -> np.ndarray:
    n_req = table.n_chunks.shape[0]
    if table.size == 0:
        return np.zeros(n_req, dtype=np.int64)
    return np.bincount(table.rec, weights=per_chunk, minlength=n_req)
