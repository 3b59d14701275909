"""A server start handed to a cluster node, and what it brings back: the node runs the same
`truthput.run.start.run_start` with a store that records its writes and sends them, with its events,
to the driver, which commits them to the one results store and folds the outcome into its run state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from truthput.experiment.file import Experiment
from truthput.run.plan import Plan
from truthput.run.start import CRASHES_TO_FAIL, RunState, StartContext, experiment_tokenizer, run_start
from truthput.store.db import TrialKey


@dataclass
class StartJob:
    """One server start as an executor hands it to a node: what it needs of the driver's state."""

    exp: Experiment
    plan: Plan
    run_id: str
    variant: str
    start_index: int
    done: set[TrialKey]
    guard_texts: dict[str, list[str]]
    failed: dict[str, str]
    crashes: dict[str, int]
    simulated: bool
    placement: dict[str, Any] | None = None
    rows_reached: dict[int, int] = field(default_factory=dict)


@dataclass
class NodeOutcome:
    """What a start done on a node changed in the driver's run state (besides the store)."""

    failed: dict[str, str]
    crash_added: bool
    guard_texts: dict[str, list[str]]
    simulated: bool
    rows_reached: dict[int, int] = field(default_factory=dict)


async def run_start_on_node(job: StartJob, send: Callable[[tuple[str, Any]], None]) -> NodeOutcome:
    """One server start where the store is not (a cluster node): the same `run_start`, its store
    writes recorded and sent to the driver (`("op", StoreOp)`), its events too (`("event", ev)`)."""
    from truthput.engines.cpus import pin_client, unpin_client
    from truthput.run.executors.recording import RecordingStore

    run = RunState(exp=job.exp, plan=job.plan, run_id=job.run_id, emit=lambda ev: send(("event", ev)),
                   guard_texts=dict(job.guard_texts), failed=dict(job.failed), crashes=dict(job.crashes),
                   simulated=job.simulated, rows_reached=dict(job.rows_reached))
    ctx = StartContext(run, RecordingStore(lambda op: send(("op", op))), placement=job.placement)
    pinned = pin_client(job.exp.workload.client_cpus)
    try:
        await run_start(ctx, job.plan.variant(job.variant), job.start_index, job.done, experiment_tokenizer(job.exp))
    finally:
        if pinned:
            unpin_client()
    return NodeOutcome(failed={k: v for k, v in run.failed.items() if k not in job.failed},
                       crash_added=run.crashes.get(job.variant, 0) > job.crashes.get(job.variant, 0),
                       guard_texts={k: v for k, v in run.guard_texts.items() if k not in job.guard_texts},
                       simulated=run.simulated, rows_reached=run.rows_reached)


def apply_outcome(ctx: RunState, variant: str, out: NodeOutcome) -> None:
    """Fold a node's start outcome into the driver's run state."""
    if out.crash_added:
        ctx.crashes[variant] = ctx.crashes.get(variant, 0) + 1
        if ctx.crashes[variant] >= CRASHES_TO_FAIL and variant not in out.failed:
            ctx.failed[variant] = f"crash_under_load in {ctx.crashes[variant]} starts"
    ctx.failed.update(out.failed)
    ctx.guard_texts.update(out.guard_texts)
    for start, reach in out.rows_reached.items():
        ctx.rows_reached[start] = max(ctx.rows_reached.get(start, 0), reach)
    if out.simulated and not ctx.simulated:
        ctx.simulated = True
