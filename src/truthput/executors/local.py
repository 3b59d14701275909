"""The default executor: every server start on this machine, one after another."""

from __future__ import annotations

from typing import Any

from truthput.experiment.file import Experiment
from truthput.plan import Plan
from truthput.start import RunContext, run_start, skipped
from truthput.store.db import TrialKey


class LocalExecutor:
    name = "local"

    def prepare(self, exp: Experiment, plan: Plan) -> list[str]:
        return []

    async def run_order(self, ctx: RunContext, order: list[tuple[str, int]], done: set[TrialKey],
                        tokenizer: Any) -> None:
        for name, start_index in order:
            if not skipped(ctx, name, start_index):
                await run_start(ctx, ctx.plan.variant(name), start_index, done, tokenizer)

    def describe(self) -> str:
        return "this machine"
