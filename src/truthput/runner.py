"""The experiment loop: plan -> server starts -> trials -> store.

Per server start (the unit of replication) and per concurrency level: a discarded warm-up, then
`repeats` timed trials. A trial scrapes /metrics before the first request, when all N streams are
in flight, at the end of the timed window and after the drain; the figures are computed by
`truthput.measure` and the whole trial is committed before the next one starts. A server that fails
to start, or dies under load, is a recorded result, and the run goes on. Ctrl-C stops every server
this run started, keeps what was committed, and marks the run interrupted (resumable).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from truthput.engines.factory import make_engine, sim_requirements
from truthput.errors import InputError
from truthput.events import (
    Event,
    Note,
    RunStarted,
    StartFailed,
    StartLaunching,
    StartReady,
    TrialDone,
    emitter,
)
from truthput.experiment.argv import ServerArgv, argv_diff, speculative_settings, variant_argv
from truthput.experiment.engines import SIMULATED_KINDS, metric_family
from truthput.experiment.file import Experiment
from truthput.experiment.levels import Level, is_rate
from truthput.store.db import Store, TrialKey

SIMULATED_ENGINES = SIMULATED_KINDS


@dataclass
class VariantPlan:
    name: str
    position: int
    is_baseline: bool
    argv: ServerArgv
    env: dict[str, str]
    diff: Any
    diff_text: list[str]
    speculative: dict | None


@dataclass
class Plan:
    engine: str
    variants: list[VariantPlan]
    order: list[tuple[str, int]]
    levels: list[Level]
    """Streams per closed-loop level, or a `Rate` per open-loop level."""
    repeats: int
    estimate_s: float
    max_estimate_s: float

    def variant(self, name: str) -> VariantPlan:
        return next(v for v in self.variants if v.name == name)


_SUFFIX = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}


def _whole_number(text: str) -> int | None:
    """An integer as vLLM reads it, with its human-readable suffixes ("32k" = 32000, "32K" = 32768)."""
    t = text.strip()
    mult = 1
    if t and t[-1] in _SUFFIX:
        t, mult = t[:-1], _SUFFIX[t[-1]]
    try:
        return int(t) * mult
    except ValueError:
        try:
            f = float(t) * mult
        except ValueError:
            return None
        return int(f) if f.is_integer() else None


def _int_flag(argv: ServerArgv, names: Sequence[str], where: str) -> int:
    for name in names:
        if argv.has(name):
            value = argv.get(name)
            text = value[-1] if isinstance(value, list) else value
            n = _whole_number(str(text))
            if n is None:
                raise InputError(f"{where}: {name} {text!r} is not a whole number") from None
            if n < 1:
                raise InputError(f"{where}: {name} {n} must be >= 1")
            return n
    return 1


def _check_names(exp: Experiment, kind: str) -> None:
    """Names every start would trip over, checked before any starts: the GPU and model the
    roofline and simulator read, and the host the servers listen on."""
    import socket

    from truthput.hardware.gpus import get_gpu
    from truthput.hardware.models import get_model

    if exp.hardware is not None:
        try:
            get_gpu(exp.hardware.gpu)
        except InputError as exc:
            raise InputError(f"[hardware].gpu: {exc}") from None
    if exp.model is not None and (kind == "sim" or exp.model.profile):
        try:
            get_model(exp.model.ref)
        except InputError as exc:
            raise InputError(f"[model]: {exc}") from None
    host = exp.server.host
    if host and kind != "external":
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError) as exc:
            raise InputError(f"[server].host {host!r}: cannot be resolved ({exc})") from None


INT_FLAGS = ("--max-num-seqs", "--max-model-len", "--max-num-batched-tokens", "--block-size",
             "--tensor-parallel-size", "--pipeline-parallel-size")
"""vLLM flags that take a whole number >= 1: a typo there ("lots") fails every start otherwise."""


def max_num_seqs_warnings(exp: Experiment, plan: Plan) -> list[str]:
    """Concurrency levels above a variant's --max-num-seqs: the extra streams queue in the server
    (TTFT grows, tok/s does not), a legitimate experiment but one a user should see coming."""
    out: list[str] = []
    if exp.workload.mode == "open":
        return out
    top = max(exp.workload.concurrency)
    for v in plan.variants:
        if v.argv.has("--max-num-seqs"):
            raw = v.argv.get("--max-num-seqs")
            cap = _whole_number(str(raw[-1] if isinstance(raw, list) else raw))
            if cap is not None and top > cap:
                out.append(f"{v.name}: concurrency {top} is above its --max-num-seqs {cap}: {top - cap} streams "
                           "will wait in the server's queue")
    return out


def _check_variant_argv(exp: Experiment, name: str, argv: ServerArgv) -> None:
    """What no server start can survive, refused before any starts: a NUL byte in an argument (the
    exec'd argv would be cut there) and more GPUs (tensor x pipeline parallel) than [hardware] has."""
    where = f"[[variant]] {name!r}"
    for i, word in enumerate(argv.to_argv()):
        if "\x00" in word:
            raise InputError(f"{where}: argument {i} ({word.split(chr(0))[0]!r}...) contains a NUL byte")
    if argv.engine == "vllm":
        for flag in INT_FLAGS:
            _int_flag(argv, (flag,), where)
        if argv.has("--gpu-memory-utilization"):
            raw = argv.get("--gpu-memory-utilization")
            try:
                util = float(str(raw[-1] if isinstance(raw, list) else raw))
            except ValueError:
                util = float("nan")
            if not 0.0 < util <= 1.0:
                raise InputError(f"{where}: --gpu-memory-utilization {raw!r}: expected a fraction in (0, 1]")
    if exp.hardware is None:
        return
    tp = _int_flag(argv, ("--tensor-parallel-size",), where)
    pp = _int_flag(argv, ("--pipeline-parallel-size",), where)
    if tp * pp > exp.hardware.count:
        raise InputError(f"{where}: --tensor-parallel-size {tp} x --pipeline-parallel-size {pp} = {tp * pp} GPUs, "
                        f"but [hardware].count = {exp.hardware.count}")


def build_plan(exp: Experiment, engine: str | None = None) -> Plan:
    """Resolve every variant's argv (parsed, never string-replaced) and the order of server starts."""
    from truthput.analyze.design import estimate_plan_time, interleaved_order

    kind = engine or exp.server.engine
    if kind == "sim":
        sim_requirements(exp)
    _check_names(exp, kind)
    from truthput.engines.cpus import check_cores

    check_cores(exp.server.cpus, "[server].cpus")
    check_cores(exp.workload.client_cpus, "[workload].client_cpus")
    if exp.server.cpus and exp.workload.client_cpus and set(exp.server.cpus) & set(exp.workload.client_cpus):
        raise InputError("[server].cpus and [workload].client_cpus share core(s) "
                        f"{sorted(set(exp.server.cpus) & set(exp.workload.client_cpus))}: pinning is for keeping "
                        "them apart")
    base = ServerArgv.parse(exp.server.command, engine=metric_family(kind))
    variants: list[VariantPlan] = []
    for pos, v in enumerate(exp.variant):
        argv = variant_argv(base, set=v.set, remove=v.remove, where=f"[[variant]] {v.name!r}")
        try:
            spec = speculative_settings(argv)
        except InputError as exc:
            raise InputError(f"[[variant]] {v.name!r}: {exc}") from None
        _check_variant_argv(exp, v.name, argv)
        diff = argv_diff(base, argv)
        variants.append(VariantPlan(
            name=v.name, position=pos, is_baseline=(v.name == exp.experiment.baseline), argv=argv,
            env={**exp.server.env, **v.env}, diff=diff.to_dict(), diff_text=str(diff).splitlines() or ["(no change)"],
            speculative=spec))
    order = interleaved_order([v.name for v in variants], exp.measure.starts, exp.experiment.seed,
                              randomized=exp.measure.randomize_order)
    wl = exp.workload
    # a trial is its window plus ramp-up, drain and scrapes (~3 s); a start is load + readiness
    restart_s = {"sim": 1.5 + exp.sim.startup_s, "external": 0.0}.get(kind, 60.0)
    cost = estimate_plan_time(len(variants), len(wl.levels), exp.measure.starts, exp.measure.repeats,
                              restart_s=restart_s, trial_s=(wl.duration_s or 30.0) + 3.0, warmup_s=wl.warmup_s,
                              max_starts=exp.measure.planned_max_starts)
    return Plan(engine=kind, variants=variants, order=order, levels=wl.levels,
                repeats=exp.measure.repeats, estimate_s=cost.total_s, max_estimate_s=cost.max_total_s)


CRASHES_TO_FAIL = 2
"""Server crashes under load after which a variant is failed instead of started again."""


# ---- progress --------------------------------------------------------------------------------
class Progress:
    """Plain timestamped progress lines (text from servers and experiment files is never markup)."""

    def __init__(self, console=None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True, highlight=False)
        self.t0 = time.monotonic()

    def handle(self, event: Event) -> None:
        from truthput.events import style_of

        self._print(event.text(), style_of(event))

    def __call__(self, msg: str) -> None:
        self._print(msg, None)

    def _print(self, text: str, style: str | None) -> None:
        from rich.text import Text

        line = Text(f"{time.monotonic() - self.t0:7.1f}s ", style="dim")
        line.append(text, style=style or "")
        self.console.print(line)


# ---- the run ---------------------------------------------------------------------------------
@dataclass
class RunContext:
    exp: Experiment
    store: Store
    run_id: str
    plan: Plan
    emit: Callable[[Event], None]
    log_buffer: list[tuple[float, str, str]] = field(default_factory=list)
    log_seq: int = 0
    start_id: int | None = None
    guard_texts: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    crashes: dict[str, int] = field(default_factory=dict)
    """Starts per variant whose server crashed under load."""
    stopping: dict | None = None
    simulated: bool = False
    placement: dict | None = None
    """Where this start's server runs, when an executor placed it on a cluster node."""
    executor: Any = None
    """Runs the starts of an order (truthput.executors): here, or on a cluster."""


def _log_sink(ctx: RunContext):
    def sink(t: float, stream: str, line: str) -> None:
        ctx.log_buffer.append((t, stream, line))
    return sink


def _flush_logs(ctx: RunContext) -> None:
    if ctx.start_id is not None and ctx.log_buffer:
        lines, ctx.log_buffer = ctx.log_buffer, []
        ctx.log_seq = ctx.store.add_logs(ctx.start_id, ctx.log_seq, lines)


def _workload(exp: Experiment, seed: int, tokenizer=None):
    from truthput.load.workload import Workload, WorkloadSpec

    wl = exp.workload
    spec = WorkloadSpec(input_tokens=wl.input_tokens, output_tokens=wl.output_tokens, ignore_eos=wl.ignore_eos,
                        temperature=wl.temperature, top_p=wl.top_p, seed=wl.seed, prompt_source=wl.prompt_source,
                        endpoint=wl.endpoint, extra_body=dict(wl.extra_body))
    return Workload(spec, seed=seed, tokenizer=tokenizer)


def load_tokenizer(exp: Experiment):
    """The model directory's tokenizer.json, when there is one (counting method 3)."""
    import os

    ref = exp.model.path if exp.model else None
    if not ref and exp.server.command:
        model = ServerArgv.parse(exp.server.command).model()
        ref = model if isinstance(model, str) else None
    if ref and os.path.isfile(os.path.join(ref, "tokenizer.json")):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(os.path.join(ref, "tokenizer.json"))
    return None


def _level_seed(level: Level, index: int) -> int:
    """A seed part per level: the streams, or the level's place in the rate list."""
    return index + 1_000 if is_rate(level) else int(level)


async def _run_trial(ctx: RunContext, engine, client, vp: VariantPlan, start_index: int, level: Level,
                     trial_index: int, tokenizer, lead_s: float = 0.0):
    from truthput.load.schedule import ClosedLoop, OpenLoop
    from truthput.measure.model import LoadLevel
    from truthput.measure.names import metric_names
    from truthput.pipeline.trial import TrialSetup, commit, run_trial

    exp = ctx.exp
    wl = exp.workload
    seed = (exp.experiment.seed * 1_000_003 + start_index * 10_007
            + _level_seed(level, ctx.plan.levels.index(level)) * 101 + trial_index)
    workload = _workload(exp, seed, tokenizer)
    loop: Any
    if is_rate(level):
        loop = OpenLoop(client, workload, float(level), wl.arrival, wl.max_in_flight, duration_s=wl.duration_s,
                        max_requests=wl.requests, seed=seed, lead_s=lead_s)
    else:
        loop = ClosedLoop(client, workload, int(level), duration_s=wl.duration_s, max_requests=wl.requests,
                          lead_s=lead_s)

    def in_flight(result: Any) -> int:
        # an open loop's streams are what the server made of the offered rate
        return int(level) if not is_rate(level) else max(1, wl.max_in_flight or result.max_in_flight)

    def logs(t_from: float, t_to: float) -> list[tuple[float, str]]:
        return [(t, line) for (t, _s, line) in ctx.log_buffer if t_from <= t <= t_to]

    setup = TrialSetup(
        base_url=engine.base_url, names=metric_names(metric_family(ctx.plan.engine), exp.server.metric_names or None),
        engine=metric_family(ctx.plan.engine), speculative=vp.speculative, tokenizer=tokenizer,
        simulated=ctx.simulated, sample_gpu=not ctx.simulated, error_threshold=exp.measure.request_error_threshold,
        log_lines=logs, crashed=engine.crashed if hasattr(engine, "crashed") else None,
        server_pgids={engine.pid} if getattr(engine, "pid", None) else set(), open_loop=is_rate(level))
    trial = await run_trial(setup, lambda ws, we: loop.run(on_window_start=ws, on_window_end=we), in_flight)
    if is_rate(level):
        trial.results.load = LoadLevel(mode="open", level=float(level), unit="req/s", arrival=wl.arrival,
                                       max_in_flight_seen=trial.load.max_in_flight)
    if exp.slo is not None and (exp.slo.ttft_ms or exp.slo.itl_ms):
        from truthput.load.goodput import SLO, goodput
        from truthput.measure.model import Goodput

        start, end = trial.window
        trial.results.goodput = Goodput.model_validate(goodput(
            trial.load.records, SLO(ttft_ms=exp.slo.ttft_ms, itl_ms=exp.slo.itl_ms),
            (start, end) if start is not None and end is not None else None))
    _flush_logs(ctx)
    commit(ctx.store, ctx.run_id, vp.name, ctx.start_id, TrialKey(vp.name, start_index, level, trial_index), trial)
    return trial


async def _warmup(ctx: RunContext, client, level: Level, tokenizer) -> None:
    from truthput.load.schedule import ClosedLoop, OpenLoop

    wl = ctx.exp.workload
    if wl.warmup_s <= 0:
        return
    workload = _workload(ctx.exp, 999_999 + _level_seed(level, ctx.plan.levels.index(level)), tokenizer)
    loop: Any
    if is_rate(level):
        loop = OpenLoop(client, workload, float(level), wl.arrival, wl.max_in_flight, duration_s=wl.warmup_s,
                        seed=999_999)
    else:
        loop = ClosedLoop(client, workload, int(level), duration_s=wl.warmup_s, drain=False)
    await loop.run()


async def _guard_outputs(ctx: RunContext, client, vp: VariantPlan) -> None:
    """Same fixed prompts at temperature 0 to every variant: does the variant change greedy output?"""
    m = ctx.exp.measure
    if not m.output_guard or vp.name in ctx.guard_texts:
        return
    texts = []
    for i in range(m.guard_prompts):
        body = _guard_body(ctx.exp, i)
        rec = await client.stream(i, body)
        texts.append(rec.text if rec.status == "ok" else f"<error: {rec.error}>")
    ctx.guard_texts[vp.name] = texts


def _guard_body(exp: Experiment, i: int) -> dict:
    subjects = ["the history of the printing press", "how a bicycle gear works", "why the sky is blue",
                "the rules of chess", "how bread rises", "the water cycle", "how a compiler works", "tides"]
    prompt = f"Explain {subjects[i % len(subjects)]} in plain words, step by step."
    body: dict[str, Any] = {"max_tokens": exp.measure.guard_max_tokens, "temperature": 0.0, "seed": 0,
                            "ignore_eos": True}
    if exp.workload.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


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


async def _run_start(ctx: RunContext, vp: VariantPlan, start_index: int, done: set[TrialKey], tokenizer) -> None:
    from truthput.analyze.cells import headline, source_label
    from truthput.load.client import ClientConfig, StreamClient

    exp, store = ctx.exp, ctx.store
    todo = [(c, t) for c in ctx.plan.levels for t in range(ctx.plan.repeats)
            if TrialKey(vp.name, start_index, c, t) not in done]
    need_guard = exp.measure.output_guard and vp.name not in ctx.guard_texts
    if not todo and not need_guard:
        return
    seed = exp.experiment.seed * 7919 + start_index * 131 + vp.position
    engine, launched = make_engine(exp, ctx.plan.engine, vp.argv, vp.env, seed, log_sink=_log_sink(ctx),
                                   run_id=ctx.run_id, variant=vp.name, start_index=start_index)
    ctx.log_buffer = []
    ctx.log_seq = 0
    ctx.start_id = store.begin_start(ctx.run_id, vp.name, start_index, launched, getattr(engine, "port", None))
    if ctx.placement:
        store.merge_start_info(ctx.start_id, {"placement": ctx.placement})
    if hasattr(engine, "on_spawn"):
        sid = ctx.start_id

        def record_spawn(pid: int) -> None:
            from truthput.engines.process import process_identity

            store.update_start(sid, pid=pid)
            store.merge_start_info(sid, {"process": process_identity(pid)})

        engine.on_spawn = record_spawn
    ctx.emit(StartLaunching(vp.name, start_index, ctx.plan.engine))
    start_failed = False
    try:
        outcome = await engine.start()
        _flush_logs(ctx)
        if not outcome.ok:
            store.update_start(ctx.start_id, status="failed", failure_class=outcome.failure_kind,
                               failure_reason=outcome.reason, failure_line=outcome.root_cause_line,
                               log_excerpt=outcome.excerpt or "\n".join(engine.recent_log(30)), pid=outcome.pid,
                               stopped_at=time.time())
            ctx.failed[vp.name] = f"{outcome.failure_kind}: {outcome.reason}"
            ctx.emit(StartFailed(vp.name, start_index, outcome.failure_kind, outcome.reason))
            store.event(ctx.run_id, "start_failed", f"{vp.name} start {start_index}: {outcome.failure_kind}: {outcome.reason}")
            return
        from truthput.pipeline.trial import serves_simulator

        if not ctx.simulated and await serves_simulator(engine.base_url):
            # a simulator behind `command`/`external`/`systemd` is still a simulator (principle 1)
            ctx.simulated = True
            store.mark_simulated(ctx.run_id)
            ctx.emit(Note("the server reports itself as the truthput SIMULATOR: figures are simulated", "warning"))
        info = dict(outcome.info or {})
        if ctx.placement:
            info["placement"] = ctx.placement
        if exp.server.cpus or exp.workload.client_cpus:
            info["cpus"] = {"server": getattr(engine, "cpus", None), "client": exp.workload.client_cpus}
        store.update_start(ctx.start_id, status="ready", ready_s=outcome.ready_s, pid=outcome.pid,
                           engine_version=await _engine_version(ctx.plan.engine, launched))
        store.merge_start_info(ctx.start_id, info)
        ctx.emit(StartReady(vp.name, start_index, outcome.ready_s))
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
                lead = exp.workload.warmup_s if exp.workload.requests is None else 0.0
                if not lead:
                    await _warmup(ctx, client, c, tokenizer)
                for i, t in enumerate(trials):
                    trial = await _run_trial(ctx, engine, client, vp, start_index, c, t, tokenizer,
                                             lead_s=lead if i == 0 else 0.0)
                    h = headline(trial.results)
                    ctx.emit(TrialDone(vp.name, start_index, c, t, h.number(), source_label(h.source),
                                       trial.results.simulated, trial.status))
                    if trial.crashed:
                        # a crash under load ends this start (its finished trials are kept); a variant
                        # whose server crashes in CRASHES_TO_FAIL starts is failed, not started again
                        start_failed = True
                        crashes = ctx.crashes.get(vp.name, 0) + 1
                        ctx.crashes[vp.name] = crashes
                        store.update_start(ctx.start_id, status="failed", failure_class="crash_under_load",
                                           failure_reason=trial.error, log_excerpt="\n".join(engine.recent_log(30)))
                        if crashes >= CRASHES_TO_FAIL:
                            ctx.failed[vp.name] = f"crash_under_load in {crashes} starts: {trial.error or 'crashed'}"
                        ctx.emit(Note(f"{vp.name} start {start_index + 1}: the server crashed under load "
                                      f"({trial.error}); this start ends here", "warning"))
                        return
            if need_guard:
                await _guard_outputs(ctx, client, vp)
    finally:
        await engine.stop()
        if getattr(engine, "pid", None) and ctx.plan.engine not in SIMULATED_ENGINES:
            from truthput.engines.telemetry import gpu_memory_released

            released = await asyncio.get_running_loop().run_in_executor(None, gpu_memory_released, [engine.pid], 60.0)
            if released is False:
                ctx.emit(Note(f"{vp.name}: GPU memory of pid {engine.pid} not released after 60 s", "warning"))
        _flush_logs(ctx)
        if ctx.start_id is not None:
            row_status = "failed" if start_failed or vp.name in ctx.failed else "stopped"
            store.update_start(ctx.start_id, stopped_at=time.time(), status=row_status)


def _stop_leftovers(store: Store, run_id: str, emit: Callable[[Event], None]) -> None:
    """Starts a dead truthput left `starting` or `ready`: stop their servers if they still run (only
    the very process recorded, never a stranger reusing the pid) and mark the starts lost; their
    finished trials stay theirs, and the resume starts new servers."""
    from truthput.engines.process import stop_leftover_server

    for s in store.starts(run_id):
        if s["status"] not in ("starting", "ready"):
            continue
        what = "no server was recorded"
        info = json.loads(s["info_json"]) if s["info_json"] else {}
        placement = info.get("placement")
        if placement and placement.get("executor") == "ray":
            # its pid is on a cluster node: the server died with its actor (parent-death signal)
            what = f"its server ran on node {placement.get('node')}, and died with its actor"
        elif s["pid"]:
            argv = json.loads(s["argv_json"] or "[]")
            what = {"stopped": f"its server (pid {s['pid']}) was still running and was stopped",
                    "gone": "its server had already exited",
                    "not ours": f"pid {s['pid']} is now another process, left alone"}[
                stop_leftover_server(int(s["pid"]), float(s["started_at"] or 0.0), argv,
                                     identity=info.get("process"))]
        store.update_start(s["id"], status="lost", stopped_at=time.time(),
                           failure_reason=f"the truthput running this start stopped before it ended; {what}")
        emit(Note(f"{s['variant']} start {s['start_index'] + 1}: left by a stopped truthput; {what}", "warning"))


def summarize(store: Store, run_id: str, guard_texts: dict[str, list[str]] | None = None) -> dict:
    """The run's summary as stored in `runs.summary_json` (`truthput.analyze.summary` decides it)."""
    from truthput.report.runsummary import run_summary

    return run_summary(store, run_id, guard_texts).to_dict()


async def run_experiment(exp: Experiment, exp_text: str, exp_path: str | None, store: Store, engine: str | None = None,
                         resume: str | None = None, progress: Any = None, sim_target: dict | None = None,
                         executor: Any = None) -> str:
    """Run (or resume) the experiment; `progress` receives the run's events (`truthput.events`):
    through its `handle(event)` when it has one, else as plain text lines. `executor` places the
    server starts (truthput.executors; default: this machine)."""
    from truthput.engines.versions import machine_metadata
    from truthput.executors.local import LocalExecutor

    executor = executor or LocalExecutor()

    progress = progress or Progress()
    emit = emitter(progress)
    run_lock = None
    if resume:
        run_id = store.resolve_run(resume)
        run_lock = store.lock_run(run_id)
        row = store.run(run_id)
        engine = row["engine"]
        store.set_run_status(run_id, "running")
        store.event(run_id, "resumed", "run resumed")
    plan = build_plan(exp, engine)
    placed = executor.prepare(exp, plan) if hasattr(executor, "prepare") else []
    from truthput.engines.cpus import cpu_string, pin_client, unpin_client

    # on a cluster each node's actor pins its own load generator
    pinned = pin_client(exp.workload.client_cpus) if executor.name == "local" else None
    if resume:
        _stop_leftovers(store, run_id, emit)
    if hasattr(progress, "set_plan"):
        progress.set_plan(plan)
    if not resume:
        run_id = store.create_run(exp.experiment.name, plan.engine, plan.engine in SIMULATED_ENGINES, exp_path,
                                  exp_text, exp.experiment.seed, machine_metadata())
        run_lock = store.lock_run(run_id)
        if sim_target:
            # kept so that a resume models the same GPU and profile
            store.event(run_id, "sim_target", json.dumps(sim_target))
            emit(Note("simulating " + "; ".join(sim_target.get("said") or []) + " (from --sim-gpu/--sim-model)"))
    for vp in plan.variants:
        store.put_variant(run_id, vp.name, vp.position, vp.is_baseline, vp.argv.to_argv(),
                          {"diff": vp.diff, "lines": vp.diff_text, "speculative": vp.speculative}, vp.env)
    ctx = RunContext(exp=exp, store=store, run_id=run_id, plan=plan, emit=emit,
                     simulated=plan.engine in SIMULATED_ENGINES or bool(store.run(run_id)["simulated"]),
                     executor=executor)
    if resume:
        prev = store.run(run_id)["summary_json"]
        if prev:
            ctx.guard_texts = json.loads(prev).get("guard_texts") or {}
    if pinned or exp.server.cpus:
        where = (f"client on core(s) {cpu_string(pinned) if pinned else 'any'}, servers on "
                 f"{cpu_string(exp.server.cpus) if exp.server.cpus else 'all of the host'}")
        store.event(run_id, "pinning", where)
        emit(Note(f"CPU pinning: {where}"))
    if executor.name != "local":
        store.event(run_id, "executor", executor.describe())
        for line in placed:
            emit(Note(line))
    done = store.done_trials(run_id)
    emit(RunStarted(run_id, len(plan.variants), len(plan.levels), plan.engine,
                    plan.engine in SIMULATED_ENGINES, resumed=bool(resume), kept_trials=len(done),
                    estimate_s=plan.estimate_s, max_estimate_s=plan.max_estimate_s))
    tokenizer = load_tokenizer(exp)
    status = "failed"
    try:
        order = list(plan.order)
        await _run_order(ctx, order, done, tokenizer)
        await _maybe_more_starts(ctx, tokenizer)
        status = "done"
    except asyncio.CancelledError:
        status = "interrupted"
        raise
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        summary = None
        try:
            summary = summarize(store, run_id, ctx.guard_texts)
        except Exception as exc:  # a summary failure must not lose the run's status
            store.event(run_id, "summary_error", repr(exc))
            summary = {"guard_texts": ctx.guard_texts}
        try:
            store.set_run_status(run_id, status, summary)
        finally:
            run_lock.close()
            if pinned:
                unpin_client()
    return run_id


async def _run_order(ctx: RunContext, order: list[tuple[str, int]], done: set[TrialKey], tokenizer) -> None:
    await ctx.executor.run_order(ctx, order, done, tokenizer)


async def run_starts_here(ctx: RunContext, order: list[tuple[str, int]], done: set[TrialKey], tokenizer) -> None:
    """The starts of `order`, one after another, on this machine."""
    for name, start_index in order:
        if skipped(ctx, name, start_index):
            continue
        await _run_start(ctx, ctx.plan.variant(name), start_index, done, tokenizer)


def skipped(ctx: RunContext, name: str, start_index: int) -> bool:
    """A start of a failed variant is not made; the run says so (every executor asks here)."""
    if name not in ctx.failed:
        return False
    ctx.emit(Note(f"{name} start {start_index + 1}: skipped (variant failed: {ctx.failed[name]})"))
    return True


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
    placement: dict | None = None


@dataclass
class StartOutcome:
    """What a start done on a node changed in the driver's run state (besides the store)."""

    failed: dict[str, str]
    crash_added: bool
    guard_texts: dict[str, list[str]]
    simulated: bool


async def run_start_on_node(job: StartJob, send: Callable[[tuple[str, Any]], None]) -> StartOutcome:
    """One server start where the store is not (a cluster node): the same `_run_start`, its store
    writes recorded and sent to the driver (`("op", StoreOp)`), its events too (`("event", ev)`)."""
    from truthput.engines.cpus import pin_client, unpin_client
    from truthput.executors.recording import RecordingStore

    ctx = RunContext(exp=job.exp, store=RecordingStore(lambda op: send(("op", op))), run_id=job.run_id,  # type: ignore[arg-type]
                     plan=job.plan, emit=lambda ev: send(("event", ev)), guard_texts=dict(job.guard_texts),
                     failed=dict(job.failed), crashes=dict(job.crashes), simulated=job.simulated,
                     placement=job.placement)
    pinned = pin_client(job.exp.workload.client_cpus)
    try:
        await _run_start(ctx, job.plan.variant(job.variant), job.start_index, job.done, load_tokenizer(job.exp))
    finally:
        if pinned:
            unpin_client()
    return StartOutcome(failed={k: v for k, v in ctx.failed.items() if k not in job.failed},
                        crash_added=ctx.crashes.get(job.variant, 0) > job.crashes.get(job.variant, 0),
                        guard_texts={k: v for k, v in ctx.guard_texts.items() if k not in job.guard_texts},
                        simulated=ctx.simulated)


def apply_outcome(ctx: RunContext, variant: str, out: StartOutcome) -> None:
    """Fold a node's start outcome into the driver's run state."""
    if out.crash_added:
        ctx.crashes[variant] = ctx.crashes.get(variant, 0) + 1
        if ctx.crashes[variant] >= CRASHES_TO_FAIL and variant not in out.failed:
            ctx.failed[variant] = f"crash_under_load in {ctx.crashes[variant]} starts"
    ctx.failed.update(out.failed)
    ctx.guard_texts.update(out.guard_texts)
    if out.simulated and not ctx.simulated:
        ctx.simulated = True


async def _maybe_more_starts(ctx: RunContext, tokenizer) -> None:
    """The stopping rule: add interleaved rounds of starts until every comparison is decided (or
    precise enough, with a target), or max_starts per variant (`truthput.analyze.summary`)."""
    from truthput.analyze.summary import stopping_rule
    from truthput.report.runsummary import run_summary

    m = ctx.exp.measure
    rule = stopping_rule(m)
    if rule is None:
        return
    t_start = time.monotonic()
    n = m.starts
    while True:
        summary = run_summary(ctx.store, ctx.run_id, ctx.guard_texts)
        comps = summary.verdict.comparisons()
        reason = rule.reason(n, [c.decided for c in comps], [c.estimate.rel_halfwidth for c in comps],
                             elapsed_s=time.monotonic() - t_start, budget_s=m.time_budget_s)
        alive = [vp.name for vp in ctx.plan.variants if vp.name not in ctx.failed]
        if reason == "continue" and len(alive) < 2:
            reason = "nothing left to compare"
        if reason != "continue":
            open_ = [c for c in comps if not c.decided]
            detail = f"{len(comps) - len(open_)} of {len(comps)} comparisons decided"
            ctx.store.event(ctx.run_id, "stopping_rule", f"stopped after {n} starts per variant: {reason}; {detail}")
            ctx.stopping = {"starts": n, "reasons": reason, "method": rule.describe()}
            ctx.emit(Note(f"stopping rule: {n} starts per variant: {reason} ({detail})"))
            return
        undecided = sum(1 for c in comps if not c.decided)
        ctx.emit(Note(f"stopping rule: {undecided} of {len(comps)} comparisons not decided after {n} starts per "
                      f"variant; adding start round {n + 1} (at most {rule.max_starts})"))
        order = [(vp.name, n) for vp in ctx.plan.variants if vp.name not in ctx.failed]
        await _run_order(ctx, order, ctx.store.done_trials(ctx.run_id), tokenizer)
        n += 1
