"""Server starts placed on a Ray cluster: the same plan and trial pipeline, many nodes, one store.

Why Ray and not a scheduler of our own: vLLM itself serves across nodes on Ray, so a GPU cluster
that runs vLLM usually has one, and Ray already accounts GPUs per node, places actors, and tells
the owner when an actor or its node dies.

How a start runs:
- each server start is one Ray actor (`StartActor`) pinned to one node (node affinity, not soft)
  that reserves the GPUs its argv implies (tensor x pipeline parallel); the actor starts the
  server, drives the load against loopback and runs the trial pipeline there
  (`executors.node.run_start_on_node`); a server never spans nodes;
- its store writes come back to the driver (`recording.StoreOp`), which commits each trial to the
  SQLite store as it arrives: a trial that finished on a node but never arrived is not committed,
  and a resume runs it again (never twice);
- the driver keeps no more starts in flight than the chosen nodes' GPUs hold, so nothing queues
  silently; `check` names, before anything starts, what the cluster cannot place at all.

Fair comparisons: every start of a run goes to nodes of ONE hardware class (GPU type and driver),
the class of the experiment's [cluster] accelerator_type, else the one with the most nodes that can
place every variant; the others are said and left unused. Starts are dealt in the plan's
interleaved order to the least-used free node, so each node sees the variants interleaved.

Faults: a server crash or OOM is a result, as on one machine (the actor is never restarted for it).
A lost actor or node marks its start "lost: node died" and runs the start's unfinished trials again
on another node of the class, up to [cluster] max_reruns times. A server dies with its actor: it
is started with a parent-death signal (engines.process.die_with_parent), in its own process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from truthput.cluster import Node, actor_class, cluster_nodes, connect, lost_errors, nodes_from_ray
from truthput.errors import InputError

if TYPE_CHECKING:
    from truthput.run.start import RunState
    from truthput.store.db import Store, TrialKey

POLL_S = 0.2
"""How often the driver collects a node's writes and events."""
STOP_WAIT_S = 60.0


# ---- what each variant needs, and whether the cluster has it ------------------------------------
SPANNING_FLAGS = ("--distributed-executor-backend", "--nnodes", "--data-parallel-address")


@dataclass(frozen=True)
class Need:
    variant: str
    gpus: int
    accelerator: str | None
    labels: dict[str, str]

    def fits(self, node: Node) -> bool:
        if self.accelerator and self.accelerator not in (node.accelerator, node.gpu_type):
            return False
        if any(node.labels.get(k) != v for k, v in self.labels.items()):
            return False
        return node.gpus >= self.gpus

    def describe(self) -> str:
        where = [f"accelerator_type={self.accelerator}"] if self.accelerator else []
        where += [f"{k}={v}" for k, v in self.labels.items()]
        return f"{self.gpus} GPU(s) on one node" + (f" with {', '.join(where)}" if where else "")


def needs(exp: Any, plan: Any) -> list[Need]:
    """Per variant: the GPUs its argv implies (tensor x pipeline parallel, on one node)."""
    from truthput.experiment.argv import int_flag

    if plan.engine == "external":
        raise InputError("--executor ray: an external server is not started by truthput, so there is nothing "
                        "to place; use `truthput load URL --executor ray` to load it from several nodes")
    out = []
    for v in plan.variants:
        where = f"[[variant]] {v.name!r}"
        for flag in SPANNING_FLAGS:
            if v.argv.has(flag) and not (flag == "--distributed-executor-backend" and v.argv.get(flag) == "mp"):
                raise InputError(f"{where}: {flag} {v.argv.get(flag)}: a server spanning nodes (through the "
                                "engine's own Ray placement) is out of scope for --executor ray: each start "
                                "runs on one node")
        tp = int_flag(v.argv, ("--tensor-parallel-size", "-tp"), where)
        pp = int_flag(v.argv, ("--pipeline-parallel-size", "-pp"), where)
        out.append(Need(v.name, tp * pp, exp.cluster.accelerator_type, dict(exp.cluster.labels)))
    return out


def check(nodes: list[Node], wants: list[Need]) -> list[str]:
    """What cannot be placed at all, one line each (empty: every variant fits somewhere)."""
    problems = []
    if not nodes:
        return ["the cluster has no live node"]
    for need in wants:
        if any(need.fits(n) for n in nodes):
            continue
        matching = [n for n in nodes if Need(need.variant, 0, need.accelerator, need.labels).fits(n)]
        if not matching:
            have = sorted({n.accelerator or n.gpu_type for n in nodes})
            labels = sorted({f"{k}={v}" for n in nodes for k, v in n.labels.items()})
            problems.append(f"variant {need.variant!r} needs {need.describe()}: no node matches (the cluster's "
                            f"GPU types: {', '.join(have)}; labels: {', '.join(labels) or 'none'})")
        else:
            most = max(matching, key=lambda n: n.gpus)
            problems.append(f"variant {need.variant!r} needs {need.describe()}: the largest matching node has "
                            f"{most.gpus:g} ({most.describe()}); the cluster has {sum(n.gpus for n in nodes):g} "
                            "GPUs in all, but a server does not span nodes")
    return problems


def choose_class(nodes: list[Node], wants: list[Need]) -> tuple[str, list[Node], list[str]]:
    """The one hardware class the run's starts go to, its nodes, and notes on the classes left out."""
    classes: dict[str, list[Node]] = {}
    for n in nodes:
        classes.setdefault(n.hardware_class, []).append(n)
    usable = {c: ns for c, ns in classes.items() if all(any(w.fits(n) for n in ns) for w in wants)}
    if not usable:
        raise InputError("--executor ray: no single hardware class (GPU type and driver) can place every variant; "
                        "variants are compared only within one class. Classes: "
                        + "; ".join(f"{c}: {len(ns)} node(s)" for c, ns in classes.items()))
    best = max(usable, key=lambda c: (len(usable[c]), sum(n.gpus for n in usable[c])))
    notes = [f"hardware class {c!r} ({len(ns)} node(s)) left unused: variants are compared within one class"
             for c, ns in classes.items() if c != best]
    return best, [n for n in usable[best] if any(w.fits(n) for w in wants)], notes


def slots(node: Node, gpus: int) -> int:
    """Starts of this size the node can hold at once: its GPUs' worth, or one GPU-less server."""
    return int(node.gpus // gpus) if gpus > 0 else 1


def pick_node(need: Need, nodes: list[Node], busy: dict[str, int], used: dict[str, int],
              dead: AbstractSet[str] = frozenset()) -> Node | None:
    """Where the next start goes: a live node of the class that fits it and has a free slot, the
    one that has served the fewest starts so far (so each node sees the variants interleaved),
    the head last among equals (it also runs the driver). None: wait for a start to end."""
    free = [n for n in nodes if n.node_id not in dead and need.fits(n) and busy[n.node_id] < slots(n, need.gpus)]
    return min(free, key=lambda n: (used[n.node_id], busy[n.node_id], n.head)) if free else None


# ---- the actor ----------------------------------------------------------------------------------
class StartActorImpl:
    """One server start on one node (made a Ray actor class by `cluster.actor_class`)."""

    def __init__(self) -> None:
        self.msgs: list[tuple[str, Any]] = []
        self.task: asyncio.Task[Any] | None = None
        self.outcome: Any = None
        self.error: str | None = None

    async def begin(self, job: Any, cwd: str | None) -> int:
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        self.task = asyncio.get_running_loop().create_task(self._run(job))
        return os.getpid()

    async def _run(self, job: Any) -> None:
        import traceback

        from truthput.run.executors.node import run_start_on_node

        try:
            # through the attribute each time: poll() swaps the list
            self.outcome = await run_start_on_node(job, lambda msg: self.msgs.append(msg))
        except asyncio.CancelledError:
            self.error = "stopped by the driver"
        except BaseException:  # the driver shows it: a bug on a node must not pass silently
            self.error = traceback.format_exc()

    async def poll(self) -> tuple[list[tuple[str, Any]], Any, str | None]:
        msgs, self.msgs = self.msgs, []
        return msgs, self.outcome, self.error

    async def stop(self) -> list[tuple[str, Any]]:
        """Stop the start as Ctrl-C does locally (its finally stops the server), and hand back what
        it wrote meanwhile."""
        if self.task and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        msgs, self.msgs = self.msgs, []
        return msgs


# ---- the executor -------------------------------------------------------------------------------
@dataclass
class _Job:
    variant: str
    start_index: int
    attempt: int = 0
    avoid: frozenset[str] = frozenset()
    """Nodes this start was lost on: its rerun goes elsewhere while another node can take it
    (Ray may not have declared the node dead yet when the actor's loss is known)."""


@dataclass
class RayExecutor:
    """Places each server start of a run on a node of one hardware class of a Ray cluster."""

    address: str | None = None
    remote: bool = True
    ray: Any = None
    nodes: list[Node] = field(default_factory=list)
    hardware_class: str = ""
    wants: dict[str, Need] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    max_reruns: int = 2

    def prepare(self, exp: Any, plan: Any) -> list[str]:
        """Connect, look at the cluster, refuse what cannot be placed (naming it), choose the class."""
        wants = needs(exp, plan)
        self.ray = connect(self.address)
        nodes = cluster_nodes(self.ray)
        problems = check(nodes, wants)
        if problems:
            raise InputError("--executor ray: the cluster cannot place this plan:\n  " + "\n  ".join(problems))
        self.hardware_class, self.nodes, self.notes = choose_class(nodes, wants)
        self.wants = {w.variant: w for w in wants}
        self.max_reruns = exp.cluster.max_reruns
        return [f"Ray cluster: {len(self.nodes)} node(s) of class {self.hardware_class!r}: "
                + "; ".join(n.describe() for n in self.nodes), *self.notes,
                *(f"  {w.variant}: {w.describe()}, {sum(1 for n in self.nodes if w.fits(n))} node(s) can hold it"
                  for w in wants)]

    def describe(self) -> str:
        return f"Ray, {len(self.nodes)} node(s) of class {self.hardware_class!r}"

    def _alive(self) -> set[str]:
        return {n.node_id for n in nodes_from_ray(self.ray)}

    async def run_order(self, ctx: RunState, store: Store, order: list[tuple[str, int]], done: set[TrialKey],
                        tokenizer: Any) -> None:
        from truthput.run.start import skipped

        queue = deque(_Job(name, i) for name, i in order)
        used = {n.node_id: 0 for n in self.nodes}  # starts placed per node: the least used goes first
        busy = {n.node_id: 0 for n in self.nodes}
        dead: set[str] = set()
        running: dict[asyncio.Task[Any], tuple[_Job, Node]] = {}
        try:
            while queue or running:
                while queue:
                    job = queue[0]
                    if skipped(ctx, job.variant, job.start_index):
                        queue.popleft()
                        continue
                    need = self.wants[job.variant]
                    elsewhere = dead | job.avoid
                    if not any(need.fits(n) for n in self.nodes if n.node_id not in elsewhere):
                        elsewhere = dead
                    node = pick_node(need, self.nodes, busy, used, elsewhere)
                    if node is None:
                        break
                    queue.popleft()
                    used[node.node_id] += 1
                    busy[node.node_id] += 1
                    task = asyncio.get_running_loop().create_task(self._run_job(ctx, store, job, node))
                    running[task] = (job, node)
                if not running:
                    left = ", ".join(f"{j.variant} start {j.start_index + 1}" for j in queue)
                    raise InputError(f"--executor ray: no live node of class {self.hardware_class!r} can place "
                                    f"{left}; finished trials are kept: resume when the nodes are back")
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    job, node = running.pop(task)
                    busy[node.node_id] -= 1
                    if task.result() == "ok":
                        continue
                    dead |= {n.node_id for n in self.nodes} - self._alive()
                    if job.attempt < self.max_reruns:
                        queue.appendleft(_Job(job.variant, job.start_index, job.attempt + 1,
                                              job.avoid | {node.node_id}))
                    else:
                        ctx.failed.setdefault(job.variant, f"lost: its node died in {job.attempt + 1} starts")
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _run_job(self, ctx: RunState, store: Store, job: _Job, node: Node) -> str:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from truthput.events import Note
        from truthput.run.executors.recording import LocalId, StoreApplier
        from truthput.run.executors.node import StartJob, apply_outcome

        ray = self.ray
        gpus = self.wants[job.variant].gpus
        actor = actor_class(ray, StartActorImpl, max_restarts=0, max_task_retries=0).options(
            num_cpus=0, num_gpus=gpus,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote()
        applier = StoreApplier(store)
        placement = {"executor": "ray", "node": node.address, "node_id": node.node_id, "hostname": node.hostname,
                     "gpu_type": node.gpu_type, "driver": node.driver, "hardware_class": node.hardware_class,
                     "gpus": gpus, "attempt": job.attempt}
        done = {k for k in store.done_trials(ctx.run_id) if k.variant == job.variant}
        payload = StartJob(exp=ctx.exp, plan=ctx.plan, run_id=ctx.run_id, variant=job.variant,
                           start_index=job.start_index, done=done, guard_texts=dict(ctx.guard_texts),
                           failed=dict(ctx.failed), crashes=dict(ctx.crashes), simulated=ctx.simulated,
                           placement=placement, rows_reached=dict(ctx.rows_reached))

        def take(msgs: list[tuple[str, Any]]) -> None:
            for kind, item in msgs:
                if kind == "op":
                    applier.apply(item)
                elif kind == "event":
                    ctx.emit(item)

        try:
            await actor.begin.remote(payload, os.getcwd())
            while True:
                msgs, outcome, error = await actor.poll.remote()
                take(msgs)
                if error:
                    raise RuntimeError(f"{job.variant} start {job.start_index + 1} on node {node.address}: {error}")
                if outcome is not None:
                    apply_outcome(ctx, job.variant, outcome)
                    return "ok"
                await asyncio.sleep(POLL_S)
        except lost_errors(ray) as exc:
            sid = next((v for k, v in applier.ids.items() if k == LocalId.nth(1)), None)
            why = f"lost: node died ({node.address}: {type(exc).__name__})"
            if sid is not None:
                store.update_start(sid, status="lost", stopped_at=time.time(), failure_reason=why)
            store.event(ctx.run_id, "start_lost", f"{job.variant} start {job.start_index}: {why}")
            again = "its unfinished trials run again on another node" if job.attempt < self.max_reruns else \
                f"not run again ({self.max_reruns} reruns spent)"
            ctx.emit(Note(f"{job.variant} start {job.start_index + 1}: {why}; its committed trials are kept, "
                          f"{again}", "warning"))
            return "lost"
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                take(await asyncio.wait_for(actor.stop.remote(), STOP_WAIT_S))
            raise
        finally:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
