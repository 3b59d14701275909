"""The kinds of engine an experiment can run on, in one place.

`sim` is the embedded simulator (every figure simulated); `vllm`, `sglang` and `llamacpp` are
launched as processes; `command` runs any command line; `external` is a server someone else
runs; `systemd` drives a unit. Each kind reads its figures with one engine's metric names and
parses argv with one engine's flags: the simulator, external servers and systemd units are taken
to be vLLM-compatible.
"""

from __future__ import annotations

from typing import Literal, get_args

EngineKind = Literal["sim", "vllm", "sglang", "llamacpp", "command", "external", "systemd"]
ENGINE_KINDS: tuple[str, ...] = get_args(EngineKind)
SIMULATED_KINDS = frozenset({"sim"})
_VLLM_COMPATIBLE = frozenset({"sim", "vllm", "external", "systemd"})


def metric_family(kind: str) -> str:
    """The engine whose metric names and flags a kind reads (vllm, sglang, llamacpp or command)."""
    return "vllm" if kind in _VLLM_COMPATIBLE else kind
