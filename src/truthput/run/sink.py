"""Where one server start writes: the results store on this machine, or a recording of its writes
on a cluster node (`executors.recording.RecordingStore`), applied to the one store by the driver.

The start and trial code write only through this Protocol, so both implement it and mypy checks
that they do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from truthput.measure.model import TrialResults
from truthput.store.db import TrialKey

TelemetryRow = tuple[float, int, float | None, float | None, float | None, float | None]


class TrialSink(Protocol):
    """The writes a server start makes: its row, its logs, its trials, the run's events."""

    def begin_start(self, run_id: str, variant: str, start_index: int, argv: Sequence[str],
                    port: int | None) -> int: ...

    def update_start(self, start_id: int, **fields: Any) -> None: ...

    def merge_start_info(self, start_id: int, info: dict[str, Any]) -> None: ...

    def add_logs(self, start_id: int, first_seq: int, lines: Iterable[tuple[float, str, str]]) -> int: ...

    def event(self, run_id: str, kind: str, message: str) -> None: ...

    def mark_simulated(self, run_id: str) -> None: ...

    def commit_trial(self, run_id: str, variant: str, start_id: int | None, key: TrialKey, status: str,
                     t0_wall: float, t0_mono: float, window: tuple[float | None, float | None], t_end: float,
                     results: TrialResults, records: Sequence[Any], scrapes: Sequence[Any],
                     telemetry: Sequence[TelemetryRow] = (), error: str | None = None) -> int: ...
