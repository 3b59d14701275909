"""One server start, wherever it runs (this machine, or a cluster node): launch and health-check
the server, then per load level a warm-up and the timed trials (`truthput.run.trial`), each
committed before the next; a failed start or a crash under load is a recorded outcome.

Why apart from the runner: an executor runs starts, the runner decides which starts to run; a
cluster node runs exactly this code with a recording store.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from truthput.engines.base import Engine, LogSink, stop_whatever_happens
from truthput.engines.factory import make_engine
from truthput.events import Event, Note, StartFailed, StartLaunching, StartReady, TrialDone, TrialStarting
from truthput.experiment.engines import SIMULATED_KINDS, metric_family
from truthput.experiment.file import Experiment
from truthput.experiment.levels import Level, is_rate
from truthput.load.client import StreamClient
from truthput.load.goodput import SLO
from truthput.load.rows import RowLedger
from truthput.run.plan import Plan, VariantPlan, metric_names_for
from truthput.run.sink import TrialSink
from truthput.store.db import TrialKey

CRASHES_TO_FAIL = 2
"""Server crashes under load after which a variant is failed instead of started again."""


# ---- the run's state, and one start's ------------------------------------------------------
@dataclass
class RunState:
    """What a run knows across its starts: the experiment and plan, and what the starts so far
    decided (failed variants, crashes, the output guard's texts, whether the server is simulated).
    The driver holds it; a cluster node gets a copy and sends back what changed (`executors.node`)."""

    exp: Experiment
    plan: Plan
    run_id: str
    emit: Callable[[Event], None]
    guard_texts: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    crashes: dict[str, int] = field(default_factory=dict)
    """Starts per variant whose server crashed under load."""
    simulated: bool = False
    rows_reached: dict[int, int] = field(default_factory=dict)
    """Per start index, the furthest place in the run's order of the user's rows that any of its
    arms reached: the next round's arms begin after it (`rows_from`), so each row is sent once."""

    def rows_from(self, start_index: int) -> int:
        """Where the arms of this round begin in the run's order of rows: after every earlier round's."""
        return max((reach for s, reach in self.rows_reached.items() if s < start_index), default=0)


@dataclass
class StartContext:
    """One server start: where its writes go, where it runs, and what it has logged and spawned so
    far. Made new for every start, so nothing of one start leaks into the next."""

    run: RunState
    sink: TrialSink
    placement: dict[str, Any] | None = None
    """Where this start's server runs, when an executor placed it on a cluster node."""
    start_id: int | None = None
    log_buffer: list[tuple[float, str, str]] = field(default_factory=list)
    log_seq: int = 0
    descendants: dict[str, str] = field(default_factory=dict)
    """The server's processes recorded so far (pid -> identity)."""
    last_trial: Any = None
    """The trial just before, when nothing of truthput's ran since (for `traffic_between`)."""
    rows: RowLedger = field(default_factory=RowLedger)
    """The user's rows this start's server has been sent (a row source)."""

    @property
    def exp(self) -> Experiment:
        return self.run.exp

    @property
    def plan(self) -> Plan:
        return self.run.plan

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def emit(self, event: Event) -> None:
        self.run.emit(event)


def _log_sink(ctx: StartContext) -> LogSink:
    def sink(t_mono: float, stream: str, line: str) -> None:
        ctx.log_buffer.append((t_mono, stream, line))
    return sink


def _flush_logs(ctx: StartContext) -> None:
    if ctx.start_id is not None and ctx.log_buffer:
        lines, ctx.log_buffer = ctx.log_buffer, []
        ctx.log_seq = ctx.sink.add_logs(ctx.start_id, ctx.log_seq, lines)


def _workload(exp: Experiment, seed: int, tokenizer: Any = None, **rows: Any) -> Any:
    from truthput.run.plan import workload_of

    return workload_of(exp, seed, tokenizer, **rows)


def experiment_tokenizer(exp: Experiment) -> Any:
    """The served model directory's tokenizer.json, when there is one (counting method 3)."""
    from truthput.experiment.argv import ServerArgv
    from truthput.load.tokenizer import load_tokenizer

    ref = exp.model.path if exp.model else None
    if not ref and exp.server.command:
        model = ServerArgv.parse(exp.server.command).model()
        ref = model if isinstance(model, str) else None
    return load_tokenizer(ref, where="[model]", optional=True)


def _level_seed(level: Level, index: int) -> int:
    """A seed part per level: the streams, or the level's place in the rate list."""
    return index + 1_000 if is_rate(level) else int(level)


def _loop(ctx: StartContext, client: StreamClient, level: Level, workload: Any, *, duration_s: float | None,
          max_requests: int | None, seed: int, lead_s: float = 0.0, drain: bool = True) -> Any:
    """The load of one level: a closed loop of N streams, or an open loop at a rate."""
    from truthput.load.schedule import ClosedLoop, OpenLoop

    wl = ctx.exp.workload
    if is_rate(level):
        return OpenLoop(client, workload, float(level), wl.arrival, wl.max_in_flight, duration_s=duration_s,
                        max_requests=max_requests, seed=seed, lead_s=lead_s, offsets=workload.trace_offsets())
    return ClosedLoop(client, workload, int(level), duration_s=duration_s, max_requests=max_requests,
                      lead_s=lead_s, drain=drain)


async def _run_trial(ctx: StartContext, engine: Engine, client: StreamClient, vp: VariantPlan, start_index: int,
                     level: Level, trial_index: int, tokenizer: Any, lead_s: float = 0.0,
                     cache: str | None = None) -> Any:
    from truthput.measure.model import LoadLevel
    from truthput.run.trial import TrialSetup, commit, run_trial, traffic_between

    exp = ctx.exp
    wl = exp.workload
    seed = (exp.experiment.seed * 1_000_003 + start_index * 10_007
            + _level_seed(level, ctx.plan.levels.index(level)) * 101 + trial_index)
    # the user's rows: this round's stretch of the run's order, this trial's own lane of it
    plan = ctx.plan
    workload = _workload(exp, seed, tokenizer, rows_from=ctx.run.rows_from(start_index),
                         lane=plan.levels.index(level) * plan.repeats + trial_index,
                         lanes=len(plan.levels) * plan.repeats)
    if wl.cache == "warm":
        cache = await _prime(ctx, engine, workload)
    loop = _loop(ctx, client, level, workload, duration_s=wl.duration_s,
                 max_requests=wl.requests, seed=seed, lead_s=lead_s)

    def in_flight(result: Any) -> int:
        # an open loop's streams are what the server made of the offered rate
        return int(level) if not is_rate(level) else max(1, wl.max_in_flight or result.max_in_flight)

    def logs(t_from: float, t_to: float) -> list[tuple[float, str]]:
        return [(t, line) for (t, _s, line) in ctx.log_buffer if t_from <= t <= t_to]

    setup = TrialSetup(
        base_url=engine.base_url, names=metric_names_for(exp, ctx.plan.engine),
        engine=metric_family(ctx.plan.engine), speculative=vp.speculative, tokenizer=tokenizer,
        simulated=ctx.run.simulated, sample_gpu=not ctx.run.simulated, error_threshold=exp.measure.request_error_threshold,
        log_lines=logs, crashed=engine.crashed, server_pgids={engine.pid} if engine.pid else set(),
        open_loop=is_rate(level), workload=workload, rows=ctx.rows)
    trial = await run_trial(setup, lambda ws, we: loop.run(on_window_start=ws, on_window_end=we), in_flight)
    trial.results.cache = cache
    ctx.run.rows_reached[start_index] = max(ctx.run.rows_reached.get(start_index, 0), ctx.rows.reach)
    if is_rate(level):
        trial.results.load = LoadLevel(mode="open", level=float(level), unit="req/s", arrival=wl.arrival,
                                       max_in_flight_seen=trial.load.max_in_flight)
    slo = SLO.of(exp.slo)
    if slo is not None:
        from truthput.load.goodput import goodput
        from truthput.measure.model import Goodput

        start, end = trial.window
        trial.results.goodput = Goodput.model_validate(goodput(
            trial.load.records, slo, (start, end) if start is not None and end is not None else None))
    _flush_logs(ctx)
    other = traffic_between(ctx.last_trial, trial, setup.names)
    if other is not None:
        trial.results.warnings.append(other)
    ctx.last_trial = trial
    commit(ctx.sink, ctx.run_id, vp.name, ctx.start_id, TrialKey(vp.name, start_index, level, trial_index), trial)
    return trial


async def _warmup(ctx: StartContext, client: StreamClient, level: Level, tokenizer: Any) -> None:
    wl = ctx.exp.workload
    if wl.warmup_s <= 0:
        return
    # the user's rows from the end of the run's order, which no window reaches before the file runs out
    workload = _workload(ctx.exp, 999_999 + _level_seed(level, ctx.plan.levels.index(level)), tokenizer,
                         backward=True)
    result = await _loop(ctx, client, level, workload, duration_s=wl.warmup_s, max_requests=None, seed=999_999,
                         drain=False).run()
    ctx.rows.record(workload, (r.idx for r in result.records))


async def _reset(ctx: StartContext, engine: Engine) -> str:
    """`cache = "reset"`: the server's prefix cache emptied before the window, and checked."""
    from truthput.engines.cache import reset_cache

    ctx.last_trial = None  # the check's probes are truthput's traffic between two trials
    return await reset_cache(engine.base_url, metric_family(ctx.plan.engine), ctx.exp.workload.model,
                             metric_names_for(ctx.exp, ctx.plan.engine).candidates("prefix_cache_hits"))


async def _prime(ctx: StartContext, engine: Engine, workload: Any) -> str:
    """`cache = "warm"`: the trial's shared text sent once before its window."""
    from truthput.engines.cache import prime_cache

    texts = workload.shared_texts()
    if not texts:
        return "cache = \"warm\": nothing to prime (this workload shares no text by design)"
    ctx.last_trial = None
    return await prime_cache(engine.base_url, texts, ctx.exp.workload.model)


async def _engine_version(kind: str, launched: list[str]) -> str | None:
    """The engine's own version string (recorded per start, principle 1)."""
    if kind == "sim":
        import truthput

        return f"truthput-sim {truthput.__version__} (simulator, not vLLM)"
    if kind in ("vllm", "sglang", "llamacpp", "systemd") and launched:
        if kind == "systemd":
            kind = "vllm"
        from truthput.engines.versions import engine_version

        return await asyncio.get_running_loop().run_in_executor(None, engine_version, launched, kind)
    return None


def _record_spawns(store: TrialSink, start_id: int) -> Callable[[int], None]:
    """Records a server's pid and identity as soon as it is spawned: a later resume or run can stop
    exactly that process, never a stranger reusing the pid."""
    def record(pid: int) -> None:
        from truthput.engines.process import process_identity

        store.update_start(start_id, pid=pid)
        store.merge_start_info(start_id, {"process": process_identity(pid)})
    return record


def _record_descendants(ctx: StartContext, engine: Engine) -> None:
    """The server's whole process tree (children in their own session included) with identities, as
    of now: a later truthput can stop them all if this one is killed -9 (they get no parent-death
    signal of ours)."""
    if not engine.pid or ctx.start_id is None or ctx.placement:
        return
    from truthput.engines.process import server_descendants

    found = server_descendants(engine.pid)
    if not set(found) <= set(ctx.descendants):  # written only when the tree grew
        ctx.descendants.update(found)
        ctx.sink.merge_start_info(ctx.start_id, {"descendants": dict(ctx.descendants)})


async def run_start(ctx: StartContext, vp: VariantPlan, start_index: int, done: set[TrialKey], tokenizer: Any) -> None:
    """One server start of a variant: launch, health-check, its unfinished trials, the output guard,
    and the server stopped whatever happens."""
    exp, store = ctx.exp, ctx.sink
    todo = [(c, t) for c in ctx.plan.levels for t in range(ctx.plan.repeats)
            if TrialKey(vp.name, start_index, c, t) not in done]
    need_guard = exp.measure.output_guard and vp.name not in ctx.run.guard_texts
    if not todo and not need_guard:
        return
    ctx.rows = RowLedger(reach=ctx.run.rows_from(start_index))
    seed = exp.experiment.seed * 7919 + start_index * 131 + vp.position
    env = vp.env
    if exp.workload.cache == "reset" and metric_family(ctx.plan.engine) == "vllm":
        from truthput.engines.cache import DEV_MODE_ENV

        env = {**DEV_MODE_ENV, **env}  # vLLM serves /reset_prefix_cache only in dev mode
    engine, launched = make_engine(exp, ctx.plan.engine, vp.argv, env, seed, log_sink=_log_sink(ctx),
                                   run_id=ctx.run_id, variant=vp.name, start_index=start_index)
    ctx.start_id = start_id = store.begin_start(ctx.run_id, vp.name, start_index, launched, engine.port)
    if ctx.placement:
        store.merge_start_info(start_id, {"placement": ctx.placement})
    engine.on_spawn = _record_spawns(store, start_id)
    ctx.emit(StartLaunching(vp.name, start_index, ctx.plan.engine))
    start_failed = False
    try:
        if not await _launch(ctx, engine, vp, start_index, launched):
            return
        start_failed = await _trials(ctx, engine, vp, start_index, todo, tokenizer, need_guard)
    finally:
        await stop_whatever_happens(engine)
        if engine.pid and ctx.plan.engine not in SIMULATED_KINDS:
            from truthput.engines.telemetry import gpu_memory_released

            released = await asyncio.get_running_loop().run_in_executor(None, gpu_memory_released, [engine.pid], 60.0)
            if released is False:
                ctx.emit(Note(f"{vp.name}: GPU memory of pid {engine.pid} not released after 60 s", "warning"))
        _flush_logs(ctx)
        row_status = "failed" if start_failed or vp.name in ctx.run.failed else "stopped"
        store.update_start(start_id, stopped_at=time.time(), status=row_status)


async def _launch(ctx: StartContext, engine: Engine, vp: VariantPlan, start_index: int, launched: list[str]) -> bool:
    """Start the server and record how it went; False when it failed (a recorded outcome)."""
    from truthput.run.trial import serves_simulator

    exp, store, start_id = ctx.exp, ctx.sink, ctx.start_id
    assert start_id is not None
    outcome = await engine.start()
    _flush_logs(ctx)
    if not outcome.ok:
        store.update_start(start_id, status="failed", failure_class=outcome.failure_kind,
                           failure_reason=outcome.reason, failure_line=outcome.root_cause_line,
                           log_excerpt=outcome.excerpt or "\n".join(engine.recent_log(30)), pid=outcome.pid,
                           stopped_at=time.time())
        ctx.run.failed[vp.name] = f"{outcome.failure_kind}: {outcome.reason}"
        ctx.emit(StartFailed(vp.name, start_index, outcome.failure_kind or "unknown", outcome.reason or "no reason given"))
        store.event(ctx.run_id, "start_failed", f"{vp.name} start {start_index}: {outcome.failure_kind}: {outcome.reason}")
        return False
    if not ctx.run.simulated and await serves_simulator(engine.base_url):
        # a simulator behind `command`/`external`/`systemd` is still a simulator (principle 1)
        ctx.run.simulated = True
        store.mark_simulated(ctx.run_id)
        ctx.emit(Note("the server reports itself as the truthput SIMULATOR: figures are simulated", "warning"))
    info = dict(outcome.info or {})
    if ctx.placement:
        info["placement"] = ctx.placement
    if exp.server.cpus or exp.workload.client_cpus:
        info["cpus"] = {"server": engine.cpus, "client": exp.workload.client_cpus}
    store.update_start(start_id, status="ready", ready_s=outcome.ready_s, pid=outcome.pid,
                       engine_version=await _engine_version(ctx.plan.engine, launched))
    store.merge_start_info(start_id, info)
    _record_descendants(ctx, engine)
    ctx.emit(StartReady(vp.name, start_index, outcome.ready_s or 0.0))
    if ctx.plan.engine in SHARED_KINDS:
        await _say_other_traffic(ctx, engine.base_url, f"{vp.name} start {start_index + 1}")
    return True


SHARED_KINDS = frozenset({"external", "systemd"})
"""Servers truthput does not own (someone else's endpoint, a system service): others may use them."""


async def _say_other_traffic(ctx: StartContext, base_url: str, where: str) -> None:
    """Watch the server for QUIET_CHECK_S before any load of truthput's: a counter that
    moves is other traffic, said (a warning and an event) before the trials measure anything."""
    from truthput.measure.scrape import other_traffic

    names = metric_names_for(ctx.exp, ctx.plan.engine)
    said, note = await other_traffic(base_url, names.candidates("emitted_tokens"), names.candidates("running"),
                                     ctx.exp.workload.model)
    if said:
        said = f"{where}: {said}"
        ctx.emit(Note(said, "warning"))
        ctx.sink.event(ctx.run_id, "other_traffic", said)
    if note:
        ctx.emit(Note(f"{where}: {note}", "info"))


async def _trials(ctx: StartContext, engine: Engine, vp: VariantPlan, start_index: int,
                  todo: list[tuple[Level, int]], tokenizer: Any, need_guard: bool) -> bool:
    """Every unfinished trial of this start, level by level; True when the server crashed under load
    (the start ends there, its finished trials kept)."""
    from truthput.analyze.cells import headline, source_label
    from truthput.load.client import ClientConfig
    from truthput.load.guard import guard_texts

    exp = ctx.exp
    wl = exp.workload
    cfg = ClientConfig(base_url=engine.base_url, endpoint=wl.endpoint, model=wl.model, api_key_env=wl.api_key_env)
    async with StreamClient(cfg) as client:
        await client.resolve_model()
        for c in ctx.plan.levels:
            trials = [t for (cc, t) in todo if cc == c]
            if not trials:
                continue
            # the level's warm-up: inside the first trial's own load (all N streams generating
            # for warmup_s before its window opens), or a load of its own when trials count requests
            lead = wl.warmup_s if wl.requests is None else 0.0
            if not lead:
                ctx.last_trial = None  # a warm-up of its own: truthput's traffic before the next trial
                await _warmup(ctx, client, c, tokenizer)
            for i, t in enumerate(trials):
                ctx.emit(TrialStarting(vp.name, start_index, c, t, wl.duration_s))
                cache = await _reset(ctx, engine) if wl.cache == "reset" else None
                trial = await _run_trial(ctx, engine, client, vp, start_index, c, t, tokenizer,
                                         lead_s=lead if i == 0 else 0.0, cache=cache)
                _record_descendants(ctx, engine)
                h = headline(trial.results)
                ctx.emit(TrialDone(vp.name, start_index, c, t, h.number(), source_label(h.source),
                                   trial.results.simulated, trial.status))
                if trial.crashed:
                    _crashed(ctx, engine, vp, start_index, trial.error)
                    return True
        if need_guard:
            m = exp.measure
            ctx.run.guard_texts[vp.name] = await guard_texts(client, wl.endpoint, m.guard_max_tokens, m.guard_prompts)
    return False


def _crashed(ctx: StartContext, engine: Engine, vp: VariantPlan, start_index: int, error: str | None) -> None:
    """A crash under load ends this start; a variant whose server crashes in CRASHES_TO_FAIL starts
    is failed, not started again."""
    assert ctx.start_id is not None
    crashes = ctx.run.crashes.get(vp.name, 0) + 1
    ctx.run.crashes[vp.name] = crashes
    ctx.sink.update_start(ctx.start_id, status="failed", failure_class="crash_under_load", failure_reason=error,
                           log_excerpt="\n".join(engine.recent_log(30)))
    if crashes >= CRASHES_TO_FAIL:
        ctx.run.failed[vp.name] = f"crash_under_load in {crashes} starts: {error or 'crashed'}"
    ctx.emit(Note(f"{vp.name} start {start_index + 1}: the server crashed under load ({error}); "
                  "this start ends here", "warning"))


def skipped(ctx: RunState, name: str, start_index: int) -> bool:
    """A start of a failed variant is not made; the run says so (every executor asks here)."""
    if name not in ctx.failed:
        return False
    ctx.emit(Note(f"{name} start {start_index + 1}: skipped (variant failed: {ctx.failed[name]})"))
    return True
