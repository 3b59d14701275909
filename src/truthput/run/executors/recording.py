"""The results store's writes, recorded where the store is not, applied where it is.

On a cluster node the trial pipeline runs exactly as it does locally, but the SQLite store lives
with the driver. `RecordingStore` stands in for it on the node: each write is kept, in order, as a
`StoreOp`, and the ids it hands out are `LocalId`s. The driver's `StoreApplier` applies the ops to
the real store as they arrive, mapping local ids to real ones. A trial is one op (one transaction),
so a trial either arrived and is committed, or it did not and a resume runs it again: never both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from truthput.measure.model import TrialResults
from truthput.run.sink import TelemetryRow
from truthput.store.db import TrialKey


class LocalId(int):
    """A start or trial id handed out on a node, before the driver's store has given the real one:
    a negative int (real row ids are > 0), so it passes where the store's ids do."""

    @classmethod
    def nth(cls, n: int) -> LocalId:
        return cls(-n)


@dataclass
class StoreOp:
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    gives: LocalId | None = None
    """The local id this op's return value stands for (begin_start, commit_trial)."""


class RecordingStore:
    """The writes of `truthput.run.sink.TrialSink`, recorded; nothing else (a node cannot read the
    driver's store, and code that tried would be wrong there)."""

    WRITES = ("begin_start", "update_start", "merge_start_info", "add_logs", "event", "mark_simulated", "commit_trial")

    def __init__(self, sink: Callable[[StoreOp], None]) -> None:
        self._sink = sink
        self._next = 0

    def _record(self, method: str, *args: Any, gives: bool = False, **kwargs: Any) -> LocalId | None:
        local = None
        if gives:
            self._next += 1
            local = LocalId.nth(self._next)
        self._sink(StoreOp(method, args, kwargs, gives=local))
        return local

    def begin_start(self, run_id: str, variant: str, start_index: int, argv: Sequence[str], port: int | None) -> int:
        local = self._record("begin_start", run_id, variant, start_index, list(argv), port, gives=True)
        assert local is not None
        return local

    def commit_trial(self, run_id: str, variant: str, start_id: int | None, key: TrialKey, status: str,
                     t0_wall: float, t0_mono: float, window: tuple[float | None, float | None], t_end: float,
                     results: TrialResults, records: Sequence[Any], scrapes: Sequence[Any],
                     telemetry: Sequence[TelemetryRow] = (), error: str | None = None) -> int:
        local = self._record("commit_trial", run_id, variant, start_id, key, status, t0_wall, t0_mono, window, t_end,
                             results, records, scrapes, telemetry=telemetry, error=error, gives=True)
        assert local is not None
        return local

    def add_logs(self, start_id: int, first_seq: int, lines: Iterable[tuple[float, str, str]]) -> int:
        rows = list(lines)
        self._record("add_logs", start_id, first_seq, rows)
        return first_seq + len(rows)

    def update_start(self, start_id: int, **fields: Any) -> None:
        self._record("update_start", start_id, **fields)

    def merge_start_info(self, start_id: int, info: dict[str, Any]) -> None:
        self._record("merge_start_info", start_id, info)

    def event(self, run_id: str, kind: str, message: str) -> None:
        self._record("event", run_id, kind, message)

    def mark_simulated(self, run_id: str) -> None:
        self._record("mark_simulated", run_id)


class StoreApplier:
    """Applies one node's ops to the real store, in arrival order."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ids: dict[LocalId, Any] = {}

    def real(self, value: Any) -> Any:
        return self.ids.get(value, value) if isinstance(value, LocalId) else value

    def apply(self, op: StoreOp) -> Any:
        if op.method not in RecordingStore.WRITES:
            raise ValueError(f"not a store write: {op.method}")
        args = tuple(self.real(a) for a in op.args)
        kwargs = {k: self.real(v) for k, v in op.kwargs.items()}
        out = getattr(self.store, op.method)(*args, **kwargs)
        if op.gives is not None:
            self.ids[op.gives] = out
        return out
