"""The experiment loop: plan -> server starts -> trials -> store, reporting typed events.

Per server start (the unit of replication) and per load level: a warm-up, then `repeats` timed
trials (`truthput.run.start`), each committed before the next starts. Which starts run, and where, is
the executor's (`truthput.run.executors`); after the planned rounds the stopping rule adds rounds
until the verdict is decided. A server that fails to start or dies under load is a recorded
result and the run goes on. Ctrl-C stops every server this run started, keeps what was committed,
and marks the run interrupted (resumable).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from truthput.analyze.summary import RunSummary
from truthput.events import Event, EventSink, Note, RoundAdded, RunStarted, emitter
from truthput.run.executors.base import Executor
from truthput.experiment.engines import SIMULATED_KINDS
from truthput.experiment.file import Experiment
from truthput.run.plan import build_plan
from truthput.run.start import RunState, experiment_tokenizer
from truthput.store.db import Store
from truthput.analyze.summary import summary_of
from truthput.store.summary import stored_guard_texts, summary_inputs

def _stop_leftovers(store: Store, run_id: str, emit: Callable[[Event], None]) -> None:
    """Starts a dead truthput left `starting` or `ready`: stop their servers if they still run (only
    the very process recorded, never a stranger reusing the pid) and mark the starts lost; their
    finished trials stay theirs, and the resume starts new servers."""
    from truthput.engines.process import stop_leftover_server

    for s in store.starts(run_id):
        if s.status not in ("starting", "ready"):
            continue
        what = "no server was recorded"
        info = s.info
        placement = info.get("placement")
        if placement and placement.get("node"):
            # placed on a cluster node: its pid is that node's, and the server died with its actor
            # (parent-death signal)
            what = f"its server ran on node {placement.get('node')}, and died with its actor"
        elif s.pid:
            argv = s.argv
            what = {"stopped": f"its server (pid {s.pid}) was still running and was stopped",
                    "gone": "its server had already exited",
                    "not ours": f"pid {s.pid} is now another process, left alone"}[
                stop_leftover_server(int(s.pid), float(s.started_at or 0.0), argv,
                                     identity=info.get("process"), descendants=info.get("descendants"))]
        store.update_start(s.id, status="lost", stopped_at=time.time(),
                           failure_reason=f"the truthput running this start stopped before it ended; {what}")
        emit(Note(f"{s.variant} start {s.start_index + 1}: left by a stopped truthput; {what}", "warning"))


def _stop_abandoned_runs(store: Store, emit: Callable[[Event], None]) -> None:
    """Earlier runs a killed truthput left `running` (no live truthput holds their lock): stop the
    servers they left (by recorded identity, never a stranger) and mark them interrupted, so a
    fresh run on the same store starts on a quiet host and the old run can still be resumed."""
    from truthput.errors import StoreError

    for row in store.runs():
        if row.status != "running":
            continue
        try:
            held = store.lock_run(row.id)
        except StoreError:
            continue  # another truthput is running it right now
        try:
            _stop_leftovers(store, row.id, emit)
            store.set_run_status(row.id, "interrupted")
            store.event(row.id, "interrupted", "its truthput was gone; found by a later run on this store")
        finally:
            held.close()


@dataclass
class Ran:
    """How a run ended: its id, its stored status, and its summary, computed once as it ended (None
    when even that failed: the run's status is kept, and the views recompute it from the trials)."""

    run_id: str
    status: str
    summary: RunSummary | None


async def execute(exp: Experiment, exp_text: str, exp_path: str | None, store: Store, engine: str | None = None,
                  resume: str | None = None, progress: Callable[[str], None] | EventSink | None = None,
                  sim_target: dict[str, Any] | None = None, executor: Executor | None = None) -> Ran:
    """Run (or resume) the experiment; `progress` receives the run's events (`truthput.events`):
    through its `handle(event)` when it has one, else as plain text lines (None: nobody is told;
    the command line hands it `report.progress`'s display). `executor` places the
    server starts (default: this machine). The summary is computed once per look of the stopping
    rule and once at the end (the last look's, when it was the last thing the run did)."""
    from truthput.engines.cpus import cpu_string, pin_client, unpin_client
    from truthput.engines.versions import machine_metadata
    from truthput.run.executors.local import LocalExecutor

    executor = executor or LocalExecutor()
    emit = emitter(progress)
    if resume:
        run_id = store.resolve_run(resume)
        run_lock = store.lock_run(run_id)
        engine = store.run(run_id).engine
        store.set_run_status(run_id, "running")
        store.event(run_id, "resumed", "run resumed")
    plan = build_plan(exp, engine)
    placed = executor.prepare(exp, plan)
    # on a cluster each node's actor pins its own load generator
    pinned = pin_client(exp.workload.client_cpus) if not executor.remote else None
    if resume:
        _stop_leftovers(store, run_id, emit)
    else:
        _stop_abandoned_runs(store, emit)
        run_id = store.create_run(exp.experiment.name, plan.engine, plan.engine in SIMULATED_KINDS, exp_path,
                                  exp_text, exp.experiment.seed, machine_metadata())
        run_lock = store.lock_run(run_id)
        if sim_target:
            # kept so that a resume models the same GPU and profile
            store.event(run_id, "sim_target", json.dumps(sim_target))
            emit(Note("simulating " + "; ".join(sim_target.get("said") or []) + " (from --sim-gpu/--sim-model)"))
    for vp in plan.variants:
        store.put_variant(run_id, vp.name, vp.position, vp.is_baseline, vp.argv.to_argv(),
                          {"diff": vp.diff, "lines": vp.diff_text, "speculative": vp.speculative}, vp.env)
    ctx = RunState(exp=exp, plan=plan, run_id=run_id, emit=emit,
                   simulated=plan.engine in SIMULATED_KINDS or bool(store.run(run_id).simulated))
    if resume:
        ctx.guard_texts = stored_guard_texts(store, run_id)
        for kept in store.trial_results(run_id):  # the next rounds go on through the user's rows
            if kept.results.rows is not None:
                ctx.rows_reached[kept.start_index] = max(ctx.rows_reached.get(kept.start_index, 0),
                                                         kept.results.rows.reach)
    if pinned or exp.server.cpus:
        where = (f"client on core(s) {cpu_string(pinned) if pinned else 'any'}, servers on "
                 f"{cpu_string(exp.server.cpus) if exp.server.cpus else 'all of the host'}")
        store.event(run_id, "pinning", where)
        emit(Note(f"CPU pinning: {where}"))
    if executor.remote:
        store.event(run_id, "executor", executor.describe())
        for line in placed:
            emit(Note(line))
    done = store.done_trials(run_id)
    emit(RunStarted(run_id, len(plan.variants), len(plan.levels), plan.engine,
                    plan.engine in SIMULATED_KINDS, resumed=bool(resume), kept_trials=len(done),
                    estimate_s=plan.estimate_s, max_estimate_s=plan.max_estimate_s,
                    total_trials=len(plan.order) * len(plan.levels) * plan.repeats))
    tokenizer = experiment_tokenizer(exp)
    status = "failed"
    summary: RunSummary | None = None
    try:
        await executor.run_order(ctx, store, list(plan.order), done, tokenizer)
        summary = await _more_starts(ctx, store, executor, tokenizer)
        # a run that measured nothing (no server came up, every trial failed) is a failed run:
        # kept with its failures, but never what `latest` names
        status = "done" if any(t.status == "ok" for t in store.trial_results(run_id)) else "failed"
    except (asyncio.CancelledError, KeyboardInterrupt):
        status = "interrupted"
        raise
    finally:
        stored: str | dict[str, Any] = {"guard_texts": ctx.guard_texts}
        try:
            if summary is None:
                summary = summary_of(summary_inputs(store, run_id, ctx.guard_texts), fresh=True)
            stored = summary.stored().to_json()
        except Exception as exc:  # a summary failure must not lose the run's status
            store.event(run_id, "summary_error", repr(exc))
            summary = None
        try:
            store.set_run_status(run_id, status, stored)
        finally:
            run_lock.close()
            if pinned:
                unpin_client()
    return Ran(run_id, status, summary)


async def _more_starts(ctx: RunState, store: Store, executor: Executor, tokenizer: Any) -> RunSummary | None:
    """The stopping rule: add interleaved rounds of starts until every comparison is decided (or
    precise enough, with a target), or max_starts per variant (`truthput.analyze.summary`). The
    summary of the last look (the run's, since nothing ran after it); None without a rule."""
    from truthput.analyze.design import block_order
    from truthput.analyze.values import stopping_rule

    m = ctx.exp.measure
    rule = stopping_rule(m)
    if rule is None:
        return None
    t_start = time.monotonic()
    n = m.starts
    total = len(ctx.plan.order) * len(ctx.plan.levels) * ctx.plan.repeats
    while True:
        summary = summary_of(summary_inputs(store, ctx.run_id, ctx.guard_texts), fresh=True)
        comps = summary.verdict.comparisons()
        reason = rule.reason(n, [c.decided for c in comps], [c.estimate.rel_halfwidth for c in comps],
                             elapsed_s=time.monotonic() - t_start, budget_s=m.time_budget_s,
                             futile=[c.futile for c in comps])
        alive = [vp.name for vp in ctx.plan.variants if vp.name not in ctx.failed]
        if reason == "continue" and len(alive) < 2:
            reason = "nothing left to compare"
        if reason == "continue" and not comps:
            reason = "no comparison can be made (fewer than two variants measured anything)"
        if reason != "continue":
            detail = f"{sum(1 for c in comps if c.decided)} of {len(comps)} comparisons decided"
            store.event(ctx.run_id, "stopping_rule", f"stopped after {n} starts per variant: {reason}; {detail}")
            ctx.emit(Note(f"stopping rule: {n} starts per variant: {reason} ({detail})"))
            return summary
        undecided = sum(1 for c in comps if not c.decided)
        total += len(alive) * len(ctx.plan.levels) * ctx.plan.repeats
        ctx.emit(RoundAdded(f"stopping rule: {undecided} of {len(comps)} comparisons not decided after {n} starts "
                            f"per variant; adding start round {n + 1} (at most {rule.max_starts})", total))
        order = [(name, n) for name in block_order(alive, n)]
        await executor.run_order(ctx, store, order, store.done_trials(ctx.run_id), tokenizer)
        n += 1
