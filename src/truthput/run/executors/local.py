"""The default executor: every server start on this machine, one after another."""

from __future__ import annotations

from typing import Any

from truthput.experiment.file import Experiment
from truthput.run.plan import Plan
from truthput.run.start import RunState, StartContext, run_start, skipped
from truthput.store.db import Store, TrialKey


class LocalExecutor:
    remote = False

    def prepare(self, exp: Experiment, plan: Plan) -> list[str]:
        return []

    async def run_order(self, run: RunState, store: Store, order: list[tuple[str, int]], done: set[TrialKey],
                        tokenizer: Any) -> None:
        for name, start_index in order:
            if not skipped(run, name, start_index):
                await run_start(StartContext(run, store), run.plan.variant(name), start_index, done, tokenizer)

    def describe(self) -> str:
        return "this machine"
