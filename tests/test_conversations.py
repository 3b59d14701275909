"""A conversation goes one turn at a time: the multi-turn workload's turn t reaches the server only
after turn t-1 has been answered, as a user's chat client sends it -- in the closed loop, the open
loop and across load worker processes -- while the conversations themselves run side by side.

Why it matters: a later turn sent while the one before it is still being prefilled finds nothing
cached yet, so its hit rate (and so its speed) is set by the client's timing rather than the
workload: the simulator and real vLLM differed by 15 to 25 points run to run that way.

Known truth: the stub server's own journal (when each request arrived and when its answer ended,
and the body it got), read apart from truthput's records. A conversation is named by its first
user message; its turn by how many user messages the request carries.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from simhelpers import free_port, wait_listening
from stubserver import StubConfig, StubServer

from truthput.load.client import ClientConfig, StreamClient
from truthput.load.schedule import ClosedLoop, LoadResult, OpenLoop
from truthput.load.workers import StridedWorkload, share, TrialLoad
from truthput.load.workload import Workload, WorkloadSpec

REPO = Path(__file__).resolve().parents[1]
TURNS, REQUESTS = 4, 24


def _workload() -> Workload:
    return Workload(WorkloadSpec(input_tokens=12, output_tokens=8, prompt_source="multi-turn", endpoint="chat",
                                 turns=TURNS), seed=5)


def _conversations(journal: list[Any]) -> dict[str, dict[int, tuple[float, float]]]:
    """{first user message: {turn: (received, answered)}} from the server's journal."""
    convs: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for received, answered, body in journal:
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        turn = len(users) - 1
        assert turn not in convs[users[0]], "a turn reached the server twice"
        convs[users[0]][turn] = (received, answered)
    return convs


def _check_one_turn_at_a_time(journal: list[Any], requests: int = REQUESTS) -> None:
    convs = _conversations(journal)
    assert sum(len(c) for c in convs.values()) == requests
    assert len(convs) == requests // TURNS and all(sorted(c) == list(range(TURNS)) for c in convs.values())
    for turns in convs.values():
        for t in range(1, TURNS):
            assert turns[t][0] >= turns[t - 1][1], (t, turns)  # received only after the turn before ended


def _run(loop_of: Any, cfg: StubConfig) -> tuple[LoadResult, StubServer]:
    async def go() -> tuple[LoadResult, StubServer]:
        server = await StubServer(cfg).start()
        try:
            async with StreamClient(ClientConfig(server.url, endpoint="chat", model="stub-model")) as client:
                return await loop_of(client).run(), server
        finally:
            await server.stop()

    return asyncio.run(go())


def test_the_closed_loop_sends_a_conversations_turns_one_after_another() -> None:
    res, server = _run(lambda c: ClosedLoop(c, _workload(), 4, max_requests=REQUESTS),
                       StubConfig(token_delay_s=0.004))
    _check_one_turn_at_a_time(server.journal)
    assert server.stats.max_active == 4  # four conversations at once: the streams are kept
    assert sorted(r.idx for r in res.records) == list(range(REQUESTS))


def test_the_open_loop_holds_a_later_turn_until_the_one_before_is_answered() -> None:
    # 400 req/s offered, each answer ~40 ms: most later turns arrive before the turn before them ends
    res, server = _run(lambda c: OpenLoop(c, _workload(), 400.0, "constant", max_requests=REQUESTS),
                       StubConfig(token_delay_s=0.005))
    _check_one_turn_at_a_time(server.journal)
    assert server.stats.max_active >= 4  # first turns keep their arrival times: conversations overlap
    assert any("later turns arrived before the turn before them was answered" in n for n in res.notes), res.notes
    assert sorted(r.idx for r in res.records) == list(range(REQUESTS))
    assert max(res.lateness) < 0.5  # a held turn is late against its answer, not against its schedule


@pytest.mark.parametrize("workers", [2, 3])
def test_worker_shares_keep_each_conversation_whole_and_in_order(workers: int) -> None:
    wl = _workload()
    parts = share(TrialLoad(concurrency=4, max_requests=REQUESTS - 2), workers, wl.chain)  # a cut last conversation
    sent: list[int] = []
    for k, part in enumerate(parts):
        strided = StridedWorkload(wl, k, len(parts))
        mine = [strided.global_index(j) for j in range(part.max_requests or 0)]
        assert [strided.body(j) for j in range(len(mine))] == [wl.body(g) for g in mine]
        for j in range(1, len(mine)):  # one worker's turns of a conversation follow one another
            if mine[j] % TURNS:
                assert mine[j] == mine[j - 1] + 1, mine
        sent += mine
    assert sorted(sent) == list(range(REQUESTS - 2))


def test_load_workers_through_the_command_line_send_each_conversation_one_turn_at_a_time(tmp_path: Path) -> None:
    port = free_port()
    stub = subprocess.Popen([sys.executable, str(REPO / "tests" / "stubserver.py"), "--port", str(port),
                             "--token-delay-s", "0.004"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.run([sys.executable, "-m", "truthput", "load", url, "-c", "4", "-n", str(REQUESTS),
                               "--workload", "multi-turn", "--endpoint", "chat", "--turns", str(TURNS),
                               "--input-tokens", "12", "--output-tokens", "8", "--workers", "2",
                               "--store", str(tmp_path / "w.db")],
                              capture_output=True, text=True, timeout=120, cwd=str(REPO))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        with urllib.request.urlopen(url + "/journal", timeout=10) as r:
            journal = json.load(r)
    finally:
        stub.terminate()
        stub.wait(10)
    _check_one_turn_at_a_time(journal)
