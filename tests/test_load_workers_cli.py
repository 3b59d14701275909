"""`truthput load --workers N` through the real command line (a subprocess, as users run it).

Why a subprocess: the worker processes are forked by the command before its event loop starts;
only the real entry point exercises that order. Known truth: benchmarks/leanstub.py (a fake engine)
emits exactly max_tokens tokens per request and counts them in an exact /metrics counter, so the
stored token total must equal the counter delta to the token, and every request must be stored once.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from leanstub import LeanStubProcess  # noqa: E402
from truthput.store.db import decode_chunks  # noqa: E402

REQUESTS, TOKENS, STREAMS, WORKERS = 60, 48, 6, 3


@pytest.fixture(scope="module")
def stub():
    with LeanStubProcess(tokens_per_chunk=2, token_delay_ms=0.2) as s:
        yield s


def _load(stub: LeanStubProcess, db: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "truthput", "load", stub.url, "-c", str(STREAMS), "-n", str(REQUESTS),
           "--output-tokens", str(TOKENS), "--input-tokens", "16", "--workers", str(WORKERS), "--store", str(db), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(REPO))


def test_cli_workers_token_total_equals_server_counter(stub, tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    before = stub.stats()["generation_tokens"]
    res = _load(stub, db)
    assert res.returncode == 0, res.stdout + res.stderr
    counter = stub.stats()["generation_tokens"] - before
    assert counter == REQUESTS * TOKENS  # the fake engine's truth
    con = sqlite3.connect(db)
    try:
        (results_json,) = con.execute("SELECT results_json FROM trials").fetchone()
        reqs = con.execute("SELECT r.idx, r.status, r.completion_tokens, r.n_chunks, r.chunks_json "
                           "FROM requests r").fetchall()
    finally:
        con.close()
    results = json.loads(results_json)
    assert results["load"]["workers"] == WORKERS
    assert results["client"]["token_total"] == counter  # exact, not approximately
    assert results["integrity"]["holds"] is True
    assert results["integrity"]["counter_delta"]["value"] == counter
    # every request once (the workers' shares merged without loss or duplicates), each complete
    assert sorted(r[0] for r in reqs) == list(range(REQUESTS))
    assert all(r[1] == "ok" and r[2] == TOKENS for r in reqs)
    assert sum(r[2] for r in reqs) == counter
    for _idx, _status, _ct, n_chunks, chunks_json in reqs:
        times, running, texts = decode_chunks(chunks_json)
        assert len(times) == len(running) == len(texts) == n_chunks == TOKENS // 2  # 2 tokens per chunk
        assert running == list(range(2, TOKENS + 1, 2))  # running usage count per chunk
        assert "".join(texts).count(" t") == TOKENS  # the stub's " t<k>" tokens, all kept
        assert times == sorted(times)
    assert f"{counter} / {counter}" in res.stdout and "equal" in res.stdout
