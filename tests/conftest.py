"""How the suite spreads over worker processes (pytest-xdist, `-n auto` in pyproject).

Most tests wait on simulated servers in real time, so on a 2-core host six workers finish the
suite in a fraction of the serial time (4 workers: 5 min 32 s, 5: about 5 min, 6: 4 min 33 s on a
fresh clone, all with the longest tests first). The longest tests mostly wait: with five workers
they alone held the first minute and a quarter, on about one core; a sixth worker keeps the other
core busy with short tests meanwhile. Seven were faster still but broke a timing premise (a
simulated run's decode window held a prefill on a host saturated from the first second). Tests of
one module run on one worker (its module-scoped fixtures are built once), except the modules listed
in SPREAD, whose tests are independent, slow, and better spread. The tests that time real servers (vLLM on the CPU, llama-server, a Ray
cluster on loopback: ALONE) run last, one after another on one worker, once every other worker has
finished: they must not share the cores with the rest of the suite. Where none is installed they
skip at once. TRUTHPUT_TEST_WORKERS=N sets the number of workers.

The longest tests go first: `@pytest.mark.slow(seconds)` says about how long a test takes on a
2-core host, and the work queue starts with the longest (a module with a long test moves as one
piece), so no worker is left at the end with a two-minute test while the others idle.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SPREAD = {"test_run_e2e.py", "test_tune.py", "test_stopping.py", "test_stats.py", "test_store_open.py",
          "test_validity_matrix.py", "test_interference.py", "test_sim_requests.py", "test_malformed_runs.py"}
WORKERS = 6
ALONE = ("tests/realengine/", "tests/llamacpp/", "tests/test_ray_cluster.py")
"""Where the tests that time real servers live: they run last, alone (see the module docstring)."""
ALONE_SCOPE = "real servers, alone"


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: ALONE_SCOPE, the test itself (SPREAD) or its module."""
    if nodeid.startswith(ALONE):
        return ALONE_SCOPE
    module = nodeid.split("::", 1)[0]
    return nodeid if Path(module).name in SPREAD else module


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    named = os.environ.get("TRUTHPUT_TEST_WORKERS", "")
    return int(named) if named.isdigit() else WORKERS


def expected_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("slow")
    if marker is None:
        return 0.0
    return float(marker.args[0]) if marker.args else 10.0


def pytest_configure(config: pytest.Config) -> None:
    """The work queue in collection order (longest first, below), not xdist's tests-per-module order."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest scope first (a module's longest test stands for the module, except in SPREAD, where
    each test is its own scope), the real servers' tests last; ties keep their collected order, so
    modules stay whole."""
    longest: dict[str, float] = {}
    for item in items:
        key = scope_of(item.nodeid)
        longest[key] = max(longest.get(key, 0.0), expected_seconds(item))
    items.sort(key=lambda item: (scope_of(item.nodeid) == ALONE_SCOPE, -longest[scope_of(item.nodeid)]))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Units of work by `scope_of`. The real servers' unit waits for the rest: the first worker left
    idle keeps it, the others are let go as they become idle, and it is sent once they have all
    exited (a worker let go still runs the test it held back)."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):
        keeper: Any = None

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _reschedule(self, node: Any) -> None:
            if node.shutting_down or not self.workqueue or next(iter(self.workqueue)) != ALONE_SCOPE:
                super()._reschedule(node)
                return
            # a worker holds back its last test until it is sent more work or let go (pytest
            # needs the next test to run it): one pending test is an idle worker
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            if self.keeper is None:
                self.keeper = node
            elif node is not self.keeper:
                node.shutdown()
            self._send_alone_when_others_left()

        def remove_node(self, node: Any) -> str | None:
            crashed = super().remove_node(node)
            if node is self.keeper:
                self.keeper = None
            elif self.keeper is not None:
                self._send_alone_when_others_left()
            return crashed

        def _send_alone_when_others_left(self) -> None:
            if self.keeper is not None and self.workqueue and list(self.assigned_work) == [self.keeper]:
                self._assign_work_unit(self.keeper)

    return Scheduler(config, log)
