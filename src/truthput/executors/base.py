"""What the runner needs of an executor: a name, a check of the plan against where it will run,
and the starts of an order run there (each start through `truthput.start.run_start`)."""

from __future__ import annotations

from typing import Any, Protocol

from truthput.experiment.file import Experiment
from truthput.plan import Plan
from truthput.start import RunContext
from truthput.store.db import TrialKey


class Executor(Protocol):
    name: str
    """"local" runs starts on this machine (and pins the client here); anything else places them."""

    def prepare(self, exp: Experiment, plan: Plan) -> list[str]:
        """Check the plan can be placed (raise InputError naming what cannot); lines to show."""
        ...

    def describe(self) -> str: ...

    async def run_order(self, ctx: RunContext, order: list[tuple[str, int]], done: set[TrialKey],
                        tokenizer: Any) -> None:
        """Run these (variant, start index) starts, skipping the trials in `done`."""
        ...
