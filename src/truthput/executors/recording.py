"""The results store's writes, recorded where the store is not, applied where it is.

On a cluster node the trial pipeline runs exactly as it does locally, but the SQLite store lives
with the driver. `RecordingStore` stands in for it on the node: each write is kept, in order, as a
`StoreOp`, and the ids it hands out are `LocalId`s. The driver's `StoreApplier` applies the ops to
the real store as they arrive, mapping local ids to real ones. A trial is one op (one transaction),
so a trial either arrived and is committed, or it did not and a resume runs it again: never both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LocalId:
    """A start or trial id handed out on a node, before the driver's store has given the real one."""

    n: int

    def __int__(self) -> int:
        return -self.n  # never a real row id (those are > 0)


@dataclass
class StoreOp:
    method: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    gives: LocalId | None = None
    """The local id this op's return value stands for (begin_start, commit_trial)."""


class RecordingStore:
    """The store's write methods the trial pipeline uses, recorded; anything else is refused (a
    node cannot read the driver's store, and code that tried would be wrong there)."""

    WRITES = ("begin_start", "update_start", "merge_start_info", "add_logs", "event", "mark_simulated", "commit_trial")

    def __init__(self, sink: Callable[[StoreOp], None]) -> None:
        self._sink = sink
        self._next = 0

    def _local(self) -> LocalId:
        self._next += 1
        return LocalId(self._next)

    def begin_start(self, *args: Any, **kwargs: Any) -> LocalId:
        sid = self._local()
        self._sink(StoreOp("begin_start", args, kwargs, gives=sid))
        return sid

    def commit_trial(self, *args: Any, **kwargs: Any) -> LocalId:
        tid = self._local()
        self._sink(StoreOp("commit_trial", args, kwargs, gives=tid))
        return tid

    def add_logs(self, start_id: Any, first_seq: int, lines: Iterable[tuple[float, str, str]]) -> int:
        rows = list(lines)
        self._sink(StoreOp("add_logs", (start_id, first_seq, rows)))
        return first_seq + len(rows)

    def update_start(self, *args: Any, **kwargs: Any) -> None:
        self._sink(StoreOp("update_start", args, kwargs))

    def merge_start_info(self, *args: Any, **kwargs: Any) -> None:
        self._sink(StoreOp("merge_start_info", args, kwargs))

    def event(self, *args: Any, **kwargs: Any) -> None:
        self._sink(StoreOp("event", args, kwargs))

    def mark_simulated(self, *args: Any, **kwargs: Any) -> None:
        self._sink(StoreOp("mark_simulated", args, kwargs))


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
