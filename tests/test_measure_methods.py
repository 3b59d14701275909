"""The vectorised counting methods agree with the obvious per-chunk Python on awkward streams:
words split across chunks, non-ASCII whitespace, empty chunks, request boundaries, missing counts."""

from __future__ import annotations

import random

import numpy as np

from truthput.load.records import RequestRecord
from truthput.measure.methods import build_chunk_table, usage_tokens_per_chunk, words_per_chunk

_PIECES = ["a", "bc", " ", "  ", "d ", " e", "\n", "\u00a0", "x\u3000y", "é", "", "\t", "word", "\u2028"]


def _reference_words(records: list[RequestRecord]) -> list[int]:
    """A word is counted in the chunk holding its first character (str.split's whitespace)."""
    out: list[int] = []
    for r in records:
        prev_space = True  # a request starts a new word
        for text in r.chunk_texts:
            n = 0
            for ch in text:
                space = not ch.strip()  # str.strip and str.split share one whitespace definition
                if not space and prev_space:
                    n += 1
                prev_space = space
            out.append(n)
    return out


def _reference_usage(records: list[RequestRecord]) -> list[int]:
    out: list[int] = []
    for r in records:
        continuous = bool(r.chunk_tokens) and all(c >= 0 for c in r.chunk_tokens)
        before = 0
        for c in r.chunk_tokens:
            out.append(c - before if continuous else -1)
            before = c
    return out


def _records(rng: random.Random, ascii_only: bool) -> list[RequestRecord]:
    pieces = [p for p in _PIECES if p.isascii()] if ascii_only else _PIECES
    records = []
    t = 0.0
    for i in range(rng.randint(1, 12)):
        n = rng.randint(0, 9)
        texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 3))) for _ in range(n)]
        running, total = [], 0
        for _ in range(n):
            total += rng.randint(0, 3)
            running.append(total)
        if n and rng.random() < 0.2:
            running[rng.randrange(n)] = -1  # a chunk without a running count
        times = []
        for _ in range(n):
            t += rng.random()
            times.append(t)
        records.append(RequestRecord(idx=i, t_start=0.0, chunk_times=times, chunk_tokens=running, chunk_texts=texts))
    return records


def test_words_and_usage_match_the_per_chunk_reference() -> None:
    rng = random.Random(7)
    for trial in range(400):
        records = _records(rng, ascii_only=trial % 2 == 0)
        table = build_chunk_table(records)
        assert words_per_chunk(table).tolist() == _reference_words(records), [r.chunk_texts for r in records]
        assert usage_tokens_per_chunk(table).tolist() == _reference_usage(records)
        assert table.t.tolist() == [x for r in records for x in r.chunk_times]


def test_a_word_split_across_chunks_counts_once_and_requests_do_not_join() -> None:
    recs = [RequestRecord(idx=0, t_start=0.0, chunk_times=[1.0, 2.0, 3.0], chunk_tokens=[1, 2, 3],
                          chunk_texts=["hel", "lo wor", "ld"]),
            RequestRecord(idx=1, t_start=0.0, chunk_times=[1.5, 2.5], chunk_tokens=[1, 2], chunk_texts=["again", "!"])]
    words = words_per_chunk(build_chunk_table(recs))
    assert words.tolist() == [1, 1, 0, 1, 0]
    assert isinstance(words, np.ndarray) and int(words.sum()) == 3


def test_stored_chunks_round_trip_in_both_layouts() -> None:
    import orjson

    from truthput.store.db import decode_chunks, encode_chunks

    times, running, texts = [1.5, 2.25], [2, -1], ["ab", " c"]
    assert decode_chunks(encode_chunks(times, running, texts)) == (times, running, texts)
    rows = orjson.dumps([[1.5, 2, "ab"], [2.25, -1, " c"]]).decode()  # the layout of earlier stores
    assert decode_chunks(rows) == (times, running, texts)
    assert decode_chunks("") == ([], [], [])
