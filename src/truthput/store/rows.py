"""The store's rows as typed records: every read method of `Store` returns these, with the JSON
columns read once, here (a damaged JSON column reads as empty, never as an exception in a view)."""

from __future__ import annotations

import dataclasses
import sqlite3
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import orjson

R = TypeVar("R")


def _json(text: str | bytes | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return default


def from_row(cls: type[R], row: sqlite3.Row) -> R:
    """A record of `cls` from a row (columns the record does not name are left out: an older or
    newer store's extra columns never break a read)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: row[k] for k in row.keys() if k in names})


@dataclass(frozen=True)
class RunRow:
    id: str
    name: str
    created_at: str
    status: str
    engine: str
    experiment_toml: str
    machine_json: str
    finished_at: str | None = None
    simulated: int = 0
    experiment_path: str | None = None
    seed: int | None = None
    summary_json: str | None = None

    @property
    def machine(self) -> dict[str, Any]:
        """Host, CPU, Python, truthput version and git commit, GPUs."""
        return cast("dict[str, Any]", _json(self.machine_json, {}))

    @property
    def summary(self) -> dict[str, Any] | None:
        """The stored verdict and stopping record (None until the run ended)."""
        return cast("dict[str, Any] | None", _json(self.summary_json, None))

    @property
    def is_load(self) -> bool:
        """A `truthput load` run (one running server measured, nothing compared): its stored
        options are a [load] table, not an experiment."""
        return (self.experiment_toml or "").startswith("[load]")


@dataclass(frozen=True)
class VariantRow:
    run_id: str
    name: str
    position: int
    is_baseline: int
    argv_json: str
    diff_json: str
    env_json: str

    @property
    def argv(self) -> list[str]:
        """The exact argv launched."""
        return cast("list[str]", _json(self.argv_json, []))

    @property
    def diff(self) -> dict[str, Any]:
        """Flags added / changed / removed vs the baseline, and its lines."""
        return cast("dict[str, Any]", _json(self.diff_json, {}))

    @property
    def env(self) -> dict[str, str]:
        return cast("dict[str, str]", _json(self.env_json, {}))


@dataclass(frozen=True)
class StartRow:
    id: int
    run_id: str
    variant: str
    start_index: int
    status: str
    argv_json: str | None = None
    port: int | None = None
    pid: int | None = None
    started_at: float | None = None
    ready_s: float | None = None
    stopped_at: float | None = None
    failure_class: str | None = None
    failure_reason: str | None = None
    failure_line: str | None = None
    log_excerpt: str | None = None
    engine_version: str | None = None
    info_json: str | None = None

    @property
    def argv(self) -> list[str]:
        return cast("list[str]", _json(self.argv_json, []))

    @property
    def info(self) -> dict[str, Any]:
        """Placement, process identity, CPU pinning, anything engine-specific."""
        return cast("dict[str, Any]", _json(self.info_json, {}))


@dataclass(frozen=True)
class LogLine:
    start_id: int
    seq: int
    t_mono: float
    stream: str
    line: str


@dataclass(frozen=True)
class RequestRow:
    trial_id: int
    idx: int
    t_start: float
    status: str
    n_chunks: int
    chunks_json: str
    t_first: float | None = None
    t_end: float | None = None
    http_status: int | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class ScrapeRow:
    trial_id: int
    phase: str
    t_mono: float
    text: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class EventRow:
    run_id: str
    t_wall: float
    kind: str
    message: str


@dataclass(frozen=True)
class TelemetryRow:
    trial_id: int
    t_mono: float
    gpu: int
    util_pct: float | None = None
    mem_used_bytes: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
