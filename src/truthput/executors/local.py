"""The default executor: every server start on this machine, one after another."""

from __future__ import annotations

from typing import Any


class LocalExecutor:
    name = "local"

    async def run_order(self, ctx: Any, order: list[tuple[str, int]], done: set, tokenizer: Any) -> None:
        from truthput.runner import run_starts_here

        await run_starts_here(ctx, order, done, tokenizer)

    def describe(self) -> str:
        return "this machine"
