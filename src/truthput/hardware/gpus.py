"""Hardware catalog: peak memory bandwidth, dense FLOP/s and interconnect per GPU (and per CPU
host, where vLLM-CPU runs), each with its source.

The figures live in catalog.toml next to this file so a reviewer can check every number against
the datasheet it names. Lookup is forgiving ("RTX 3090", "rtx3090", "3090", "h100-sxm") because
users type GPU names from memory. A path to a TOML file with one such entry (what `truthput
hardware probe` writes for the machine it ran on) is accepted wherever a catalog name is.
"""

from __future__ import annotations

from typing import Any

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from truthput.errors import InputError

_CATALOG_PATH = Path(__file__).with_name("catalog.toml")


@dataclass(frozen=True)
class Interconnect:
    """The link tensor-parallel all-reduces travel over.

    bandwidth_Bps is per GPU in one direction; latency_s is the fixed cost (alpha) of one small
    collective, which dominates at decode batch sizes.
    """

    kind: str  # "nvlink" | "pcie" | "xgmi" | "none"
    bandwidth_Bps: float
    latency_s: float
    source: str


@dataclass(frozen=True)
class GPU:
    """Peak figures of one accelerator, or of a CPU host (`kind = "cpu"`: its DRAM bandwidth and
    matmul FLOP/s, usually measured). FLOP/s are dense (no 2:4 sparsity)."""

    name: str
    memory_bytes: float
    mem_bw_Bps: float
    bf16_flops: float
    fp8_flops: float | None
    int8_ops: float | None
    interconnect: Interconnect
    sources: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    kind: str = "gpu"  # "gpu" | "cpu"
    cores: int | None = None  # a CPU host's cores
    board_power_w: float | None = None
    """The datasheet's board power limit (TDP / TGP); None where unknown (a probed CPU host)."""
    decode_flops: float | None = None
    """A CPU host's FLOP/s for the rows a decode step adds to a weight matmul (one more sequence,
    one more verified draft token), measured at decode shapes: what a row costs there, which a
    large square matmul's rate does not say. None: bf16_flops."""

    @property
    def measured(self) -> bool:
        """Whether the figures are rates this host achieved (`truthput hardware probe`), not
        datasheet peaks: then the simulator's efficiency fractions start at 1, not a discount."""
        return any(s.startswith("measured by") for s in self.sources)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "mem_bw_Bps": self.mem_bw_Bps,
            "bf16_flops": self.bf16_flops,
            "fp8_flops": self.fp8_flops,
            "int8_ops": self.int8_ops,
            "interconnect": {
                "kind": self.interconnect.kind,
                "bandwidth_Bps": self.interconnect.bandwidth_Bps,
                "latency_s": self.interconnect.latency_s,
                "source": self.interconnect.source,
            },
            "sources": list(self.sources),
            "board_power_w": self.board_power_w,
            "decode_flops": self.decode_flops,
        }


def _normalise(name: str) -> str:
    """Lower-case and drop separators and vendor prefixes so "NVIDIA H100-SXM" == "h100sxm"."""
    key = re.sub(r"[\s_\-]+", "", name.strip().lower())
    for prefix in ("nvidia", "amd", "geforce", "instinct"):
        if key.startswith(prefix) and len(key) > len(prefix):
            key = key[len(prefix):]
    return key


@lru_cache(maxsize=1)
def _load_catalog() -> tuple[GPU, ...]:
    with _CATALOG_PATH.open("rb") as fh:
        raw = tomllib.load(fh)
    return tuple(_entry(e) for e in raw["gpu"])


def _entry(entry: dict[str, Any]) -> GPU:
    ic = entry["interconnect"]
    return GPU(
        name=entry["name"],
        memory_bytes=float(entry["memory_gib"]) * 2**30 if "memory_gib" in entry else float(entry["memory_bytes"]),
        mem_bw_Bps=float(entry["mem_bw_Bps"]),
        bf16_flops=float(entry["bf16_flops"]),
        fp8_flops=float(entry["fp8_flops"]) if "fp8_flops" in entry else None,
        int8_ops=float(entry["int8_ops"]) if "int8_ops" in entry else None,
        interconnect=Interconnect(
            kind=ic["kind"],
            bandwidth_Bps=float(ic["bandwidth_Bps"]),
            latency_s=float(ic["latency_s"]),
            source=ic["source"],
        ),
        sources=tuple(entry["sources"]),
        aliases=tuple(entry.get("aliases", ())),
        kind=str(entry.get("kind", "gpu")),
        cores=int(entry["cores"]) if "cores" in entry else None,
        board_power_w=float(entry["board_power_w"]) if "board_power_w" in entry else None,
        decode_flops=float(entry["decode_flops"]) if "decode_flops" in entry else None,
    )


def load_profile(path: str | Path) -> GPU:
    """One hardware entry from a TOML file (a `[[gpu]]` table, as in the catalog)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = tomllib.load(fh)
        entries = raw["gpu"]
        if len(entries) != 1:
            raise InputError(f"{p}: a hardware profile holds one [[gpu]] entry, found {len(entries)}")
        return _entry(entries[0])
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{p}: not a hardware profile ({type(exc).__name__}: {exc})") from None


@lru_cache(maxsize=1)
def _alias_index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in _load_catalog():
        for alias in (gpu.name, *gpu.aliases):
            index[_normalise(alias)] = gpu
    return index


def list_gpus() -> list[GPU]:
    """Every GPU in the catalog, in catalog order."""
    return list(_load_catalog())


def get_gpu(name: str) -> GPU:
    """Look a GPU up by name or alias; unknown names raise InputError listing the known ones."""
    gpu = _alias_index().get(_normalise(name))
    if gpu is None and name.endswith(".toml") and Path(name).is_file():
        return load_profile(name)
    if gpu is None:
        known = ", ".join(g.name for g in _load_catalog())
        raise InputError(f"unknown GPU {name!r} (hardware catalog): known GPUs are {known}")
    return gpu
