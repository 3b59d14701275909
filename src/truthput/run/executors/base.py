"""What the run loop needs of an executor: whether it runs starts here, a check of the plan against
where it will run, and the starts of an order run there (each through `truthput.run.start.run_start`)."""

from __future__ import annotations

from typing import Any, Protocol

from truthput.experiment.file import Experiment
from truthput.run.plan import Plan
from truthput.run.start import RunState
from truthput.store.db import Store, TrialKey


class Executor(Protocol):
    remote: bool
    """Whether starts run on other machines: each places its own load generator (the run loop pins
    the client here only when this is False) and the run records where they ran."""

    def prepare(self, exp: Experiment, plan: Plan) -> list[str]:
        """Check the plan can be placed (raise InputError naming what cannot); lines to show."""
        ...

    def describe(self) -> str: ...

    async def run_order(self, run: RunState, store: Store, order: list[tuple[str, int]], done: set[TrialKey],
                        tokenizer: Any) -> None:
        """Run these (variant, start index) starts, skipping the trials in `done`; each start's
        writes are committed to `store` as they happen."""
        ...
