"""The suite's markers, and one ordering rule; fixtures live with the tests that use them.

Three kinds of test, by marker (pyproject.toml declares them):
- unmarked: fast, CPU-bound;
- `slow`: waits on simulated servers in real time (a run, a tune, the README's commands);
- `realengine`: times real servers (vLLM on the CPU, llama-server, a Ray cluster on loopback).

The README's test command runs the first two together on stock pytest-xdist workers (`-n 6
--dist load` in pyproject.toml: the slow tests mostly wait, so more workers than cores keep both
cores busy); `.ci/run` then runs the real-engine tests apart, in one process, so that the servers
have the cores to themselves (`-m realengine -n 0`). `-m "not slow and not realengine"` is the quick pass.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

import pytest

import truthput


def pytest_configure(config: pytest.Config) -> None:
    """Once, before the workers start: compile the package to bytecode where it is a checkout
    (an editable install). The suite starts about 500 Python processes (`truthput` commands,
    simulated servers); where PYTHONDONTWRITEBYTECODE is set none of them keeps what it compiled,
    so each would compile the modules it imports again (0.05-0.15 s of CPU each)."""
    package = Path(truthput.__file__).parent
    if "PYTEST_XDIST_WORKER" not in os.environ and os.access(package, os.W_OK):  # xdist's documented marker
        compileall.compile_dir(package, quiet=1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first (stable: file order within each kind), so that none of them starts last
    while the other workers have run out of work."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
