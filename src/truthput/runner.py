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
import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from truthput.engines.factory import make_engine, sim_requirements
from truthput.errors import SpecError
from truthput.measure.figures import headline_tokps
from truthput.measure.scrape import scrape_metrics, settled_post_scrape
from truthput.spec.argv import ServerArgv, argv_diff, speculative_settings, variant_argv
from truthput.spec.experiment import Experiment
from truthput.store.db import Store, TrialKey

SIMULATED_ENGINES = {"sim"}


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
    concurrency: list[int]
    repeats: int
    estimate_s: float
    max_estimate_s: float

    def variant(self, name: str) -> VariantPlan:
        return next(v for v in self.variants if v.name == name)


def _engine_for_argv(engine: str) -> str:
    return "vllm" if engine in ("sim", "vllm", "external", "systemd") else engine


def build_plan(exp: Experiment, engine: str | None = None) -> Plan:
    """Resolve every variant's argv (parsed, never string-replaced) and the order of server starts."""
    from truthput.analyze.design import estimate_plan_time, interleaved_order

    kind = engine or exp.server.engine
    if kind == "sim":
        sim_requirements(exp)
    base = ServerArgv.parse(exp.server.command, engine=_engine_for_argv(kind))
    variants: list[VariantPlan] = []
    for pos, v in enumerate(exp.variant):
        argv = variant_argv(base, set=v.set, remove=v.remove, where=f"[[variant]] {v.name!r}")
        try:
            spec = speculative_settings(argv)
        except SpecError as exc:
            raise SpecError(f"[[variant]] {v.name!r}: {exc}") from None
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
    cost = estimate_plan_time(len(variants), len(wl.concurrency), exp.measure.starts, exp.measure.repeats,
                              restart_s=restart_s, trial_s=(wl.duration_s or 30.0) + 3.0, warmup_s=wl.warmup_s,
                              max_starts=exp.measure.max_starts if exp.measure.target else None)
    return Plan(engine=kind, variants=variants, order=order, concurrency=list(wl.concurrency),
                repeats=exp.measure.repeats, estimate_s=cost.total_s, max_estimate_s=cost.max_total_s)


# ---- progress --------------------------------------------------------------------------------
class Progress:
    """Plain progress lines (rich markup where a terminal shows it)."""

    def __init__(self, console=None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True, highlight=False)
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        el = time.monotonic() - self.t0
        self.console.print(f"[dim]{el:7.1f}s[/dim] {msg}")


# ---- the run ---------------------------------------------------------------------------------
@dataclass
class RunContext:
    exp: Experiment
    store: Store
    run_id: str
    plan: Plan
    progress: Callable[[str], None]
    log_buffer: list[tuple[float, str, str]] = field(default_factory=list)
    log_seq: int = 0
    start_id: int | None = None
    guard_texts: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    stopping: dict | None = None
    simulated: bool = False


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


async def _run_trial(ctx: RunContext, engine, client, vp: VariantPlan, start_index: int, concurrency: int,
                     trial_index: int, tokenizer) -> dict:
    import aiohttp

    from truthput.engines.telemetry import GpuSampler, energy_per_token
    from truthput.load.schedule import ClosedLoop
    from truthput.measure.names import metric_names
    from truthput.measure.trial import measure_trial

    exp = ctx.exp
    names = metric_names(_engine_for_argv(ctx.plan.engine), exp.server.metric_names or None)
    seed = exp.experiment.seed * 1_000_003 + start_index * 10_007 + concurrency * 101 + trial_index
    workload = _workload(exp, seed, tokenizer)
    scrapes = []
    t0_wall, t0_mono = time.time(), time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        async def window_start() -> None:
            scrapes.append(await scrape_metrics(session, engine.base_url, "window_start"))

        async def window_end() -> None:
            scrapes.append(await scrape_metrics(session, engine.base_url, "window_end"))

        scrapes.append(await scrape_metrics(session, engine.base_url, "pre"))
        loop = ClosedLoop(client, workload, concurrency, duration_s=exp.workload.duration_s,
                          max_requests=exp.workload.requests)
        sampler = GpuSampler().start() if not ctx.simulated else None
        try:
            result = await loop.run(on_window_start=window_start, on_window_end=window_end)
        finally:
            telemetry = sampler.stop() if sampler is not None else None
        scrapes.append(await settled_post_scrape(session, engine.base_url, names.candidates("emitted_tokens")))
    t_end = time.monotonic()
    window = (result.t_window_start, result.t_window_end)
    logs = [(t, line) for (t, _s, line) in ctx.log_buffer if t0_mono - 1.0 <= t <= t_end + 1.0]
    results = measure_trial(result.records, scrapes, logs, window if None not in window else None, concurrency,
                            engine=_engine_for_argv(ctx.plan.engine), speculative=vp.speculative,
                            tokenizer=tokenizer, names=names)
    results["simulated"] = ctx.simulated
    if telemetry is None:
        results["telemetry"] = {"available": False, "reason": "no GPU telemetry: simulated server (no GPU)"}
    else:
        results["telemetry"] = telemetry.to_dict()
        tokens = results.get("integrity", {}).get("counter_delta", {}).get("value")
        if telemetry.available and tokens:
            results["telemetry"]["energy_per_token_j"] = {
                "value": energy_per_token(telemetry, tokens), "unit": "J/token", "source": "nvml + server_counter"}
    results["client"] = {"selfcheck": dataclasses.asdict(result.selfcheck) if result.selfcheck else None,
                         "notes": list(result.notes),
                         "never_settled": result.never_settled,
                         "continuous_usage": getattr(client, "continuous_usage_supported", None)}
    n_err = sum(1 for r in result.records if r.status != "ok")
    status = "ok"
    error = None
    if result.records and n_err / len(result.records) > exp.measure.request_error_threshold:
        status, error = "failed", f"request_errors: {n_err} of {len(result.records)} requests failed"
    crash = engine.crashed() if hasattr(engine, "crashed") else None
    if crash is not None:
        status, error = "failed", f"{crash.failure_kind}: {crash.reason}"
    _flush_logs(ctx)
    ctx.store.commit_trial(ctx.run_id, vp.name, ctx.start_id,
                           TrialKey(vp.name, start_index, concurrency, trial_index), status, t0_wall, t0_mono,
                           window, t_end, results, result.records, scrapes,
                           telemetry=[(x.t_mono, x.gpu, x.util_pct, x.mem_used_bytes, x.power_w, x.sm_clock_mhz)
                                      for x in (sampler.samples if sampler is not None else [])],
                           error=error)
    return {"status": status, "error": error, "results": results, "crashed": crash is not None}


async def _warmup(ctx: RunContext, client, concurrency: int, tokenizer) -> None:
    from truthput.load.schedule import ClosedLoop

    if ctx.exp.workload.warmup_s <= 0:
        return
    workload = _workload(ctx.exp, 999_999 + concurrency, tokenizer)
    loop = ClosedLoop(client, workload, concurrency, duration_s=ctx.exp.workload.warmup_s)
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


async def _serves_simulator(base_url: str) -> bool:
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            async with session.get(base_url + "/version") as resp:
                return resp.status == 200 and "truthput" in (await resp.text()).lower()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


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
    from truthput.load.client import ClientConfig, StreamClient

    exp, store = ctx.exp, ctx.store
    todo = [(c, t) for c in ctx.plan.concurrency for t in range(ctx.plan.repeats)
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
    ctx.progress(f"[bold]{vp.name}[/bold] start {start_index + 1}: launching {ctx.plan.engine} server")
    try:
        outcome = await engine.start()
        _flush_logs(ctx)
        if not outcome.ok:
            store.update_start(ctx.start_id, status="failed", failure_class=outcome.failure_kind,
                               failure_reason=outcome.reason, failure_line=outcome.root_cause_line,
                               log_excerpt=outcome.excerpt or "\n".join(engine.recent_log(30)), pid=outcome.pid,
                               stopped_at=time.time())
            ctx.failed[vp.name] = f"{outcome.failure_kind}: {outcome.reason}"
            ctx.progress(f"[red]{vp.name}: failed: {outcome.failure_kind}: {outcome.reason}[/red]")
            store.event(ctx.run_id, "start_failed", f"{vp.name} start {start_index}: {outcome.failure_kind}: {outcome.reason}")
            return
        if not ctx.simulated and await _serves_simulator(engine.base_url):
            # a simulator behind `command`/`external`/`systemd` is still a simulator (principle 1)
            ctx.simulated = True
            store.mark_simulated(ctx.run_id)
            ctx.progress("[yellow]the server reports itself as the truthput SIMULATOR: figures are simulated[/yellow]")
        store.update_start(ctx.start_id, status="ready", ready_s=outcome.ready_s, pid=outcome.pid,
                           engine_version=await _engine_version(ctx.plan.engine, launched),
                           info_json=outcome.info or {})
        ctx.progress(f"{vp.name} start {start_index + 1}: ready in {outcome.ready_s:.1f} s")
        wl = exp.workload
        cfg = ClientConfig(base_url=engine.base_url, endpoint=wl.endpoint, model=wl.model, api_key_env=wl.api_key_env)
        async with StreamClient(cfg) as client:
            await client.resolve_model()
            for c in ctx.plan.concurrency:
                trials = [t for (cc, t) in todo if cc == c]
                if not trials:
                    continue
                await _warmup(ctx, client, c, tokenizer)
                for t in trials:
                    out = await _run_trial(ctx, engine, client, vp, start_index, c, t, tokenizer)
                    val, source = headline_tokps(out["results"])
                    sim = ", simulated" if out["results"].get("simulated") else ""
                    source_text = {"server_counter": "server counter", "usage": "usage field: no counter"}.get(source, source)
                    shown = f"{val:.1f} tok/s \\[{source_text}{sim}]" if val is not None else "no throughput figure"
                    ctx.progress(f"{vp.name} start {start_index + 1} c={c} trial {t + 1}: {shown} {out['status']}")
                    if out["crashed"]:
                        ctx.failed[vp.name] = out["error"]
                        store.update_start(ctx.start_id, status="failed", failure_class="crash_under_load",
                                           failure_reason=out["error"], log_excerpt="\n".join(engine.recent_log(30)))
                        return
            if need_guard:
                await _guard_outputs(ctx, client, vp)
    finally:
        await engine.stop()
        if getattr(engine, "pid", None) and ctx.plan.engine not in SIMULATED_ENGINES:
            from truthput.engines.telemetry import gpu_memory_released

            released = await asyncio.get_running_loop().run_in_executor(None, gpu_memory_released, [engine.pid], 60.0)
            if released is False:
                ctx.progress(f"[yellow]{vp.name}: GPU memory of pid {engine.pid} not released after 60 s[/yellow]")
        _flush_logs(ctx)
        if ctx.start_id is not None:
            row_status = "failed" if vp.name in ctx.failed else "stopped"
            store.update_start(ctx.start_id, stopped_at=time.time(), status=row_status)


def _cells(store: Store, run_id: str) -> dict[tuple[str, int], list[list[float]]]:
    cells: dict[tuple[str, int], dict[int, list[float]]] = {}
    for row in store.trial_results(run_id):
        if row["status"] != "ok":
            continue
        val, _source = headline_tokps(row["results"])
        if val is None:
            continue
        cells.setdefault((row["variant"], row["concurrency"]), {}).setdefault(row["start_index"], []).append(val)
    return {k: [v[s] for s in sorted(v)] for k, v in cells.items()}


def summarize(store: Store, run_id: str, exp: Experiment, guard_texts: dict[str, list[str]] | None = None) -> dict:
    """Verdict + guard from what the store holds (so `truthput report` recomputes the same thing)."""
    from truthput.analyze.guard import compare_outputs
    from truthput.analyze.verdict import make_verdict

    run = store.run(run_id)
    failed = {}
    for s in store.starts(run_id):
        if s["status"] == "failed" and s["failure_class"]:
            failed[s["variant"]] = f"{s['failure_class']}: {s['failure_reason']}"
    guard = None
    guard_json = {}
    if guard_texts and exp.experiment.baseline in guard_texts:
        base = guard_texts[exp.experiment.baseline]
        guard = {name: compare_outputs(base, texts) for name, texts in guard_texts.items()
                 if name != exp.experiment.baseline}
        guard_json = {k: dataclasses.asdict(v) for k, v in guard.items()}
    elif run["summary_json"]:
        prev = json.loads(run["summary_json"]).get("guard_texts") or {}
        if prev:
            return summarize(store, run_id, exp, prev)
    cells = _cells(store, run_id)
    rule, look, stopping = None, None, None
    m = exp.measure
    if m.target_rel is not None:
        from truthput.analyze.stopping import StoppingRule, fixed_design_starts

        rule = StoppingRule(target_rel_halfwidth=m.target_rel, max_starts=m.max_starts, min_starts=m.starts,
                            alpha=1 - m.confidence)
        look = max((len(v) for v in cells.values()), default=None)
        stopping = {"method": rule.method, "starts_used": look}
        try:
            stopping["fixed_design_starts"] = fixed_design_starts(cells, exp.experiment.baseline, m.target_rel,
                                                                  confidence=m.confidence)
        except Exception as exc:  # not enough data to size a fixed design
            stopping["fixed_design_note"] = str(exc)
    verdict = make_verdict(cells, exp.experiment.baseline, failed=failed, guard=guard,
                           confidence=m.confidence, simulated=bool(run["simulated"]), stopping_rule=rule, look=look)
    return {"verdict": verdict.to_dict(), "verdict_lines": verdict.lines(), "failed": failed, "guard": guard_json,
            "guard_texts": guard_texts or {}, "stopping": stopping}


async def run_experiment(exp: Experiment, exp_text: str, exp_path: str | None, store: Store, engine: str | None = None,
                         resume: str | None = None, progress: Callable[[str], None] | None = None) -> str:
    from truthput.engines.versions import machine_metadata

    progress = progress or Progress()
    if resume:
        run_id = store.resolve_run(resume)
        row = store.run(run_id)
        engine = row["engine"]
        store.set_run_status(run_id, "running")
        store.event(run_id, "resumed", "run resumed")
    plan = build_plan(exp, engine)
    if hasattr(progress, "set_plan"):
        progress.set_plan(plan)
    if not resume:
        run_id = store.create_run(exp.experiment.name, plan.engine, plan.engine in SIMULATED_ENGINES, exp_path,
                                  exp_text, exp.experiment.seed, machine_metadata())
    for vp in plan.variants:
        store.put_variant(run_id, vp.name, vp.position, vp.is_baseline, vp.argv.to_argv(),
                          {"diff": vp.diff, "lines": vp.diff_text, "speculative": vp.speculative}, vp.env)
    ctx = RunContext(exp=exp, store=store, run_id=run_id, plan=plan, progress=progress,
                     simulated=plan.engine in SIMULATED_ENGINES or bool(store.run(run_id)["simulated"]))
    if resume:
        prev = store.run(run_id)["summary_json"]
        if prev:
            ctx.guard_texts = json.loads(prev).get("guard_texts") or {}
    progress(f"run [bold]{run_id}[/bold]: {len(plan.variants)} variants x {len(plan.concurrency)} concurrency levels, "
             f"engine {plan.engine}{' (SIMULATED)' if plan.engine in SIMULATED_ENGINES else ''}")
    tokenizer = load_tokenizer(exp)
    status = "failed"
    try:
        done = store.done_trials(run_id)
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
            summary = summarize(store, run_id, exp, ctx.guard_texts)
        except Exception as exc:  # a summary failure must not lose the run's status
            store.event(run_id, "summary_error", repr(exc))
            summary = {"guard_texts": ctx.guard_texts}
        store.set_run_status(run_id, status, summary)
    return run_id


async def _run_order(ctx: RunContext, order: list[tuple[str, int]], done: set[TrialKey], tokenizer) -> None:
    for name, start_index in order:
        if name in ctx.failed:
            ctx.progress(f"{name} start {start_index + 1}: skipped (variant failed: {ctx.failed[name]})")
            continue
        await _run_start(ctx, ctx.plan.variant(name), start_index, done, tokenizer)


async def _maybe_more_starts(ctx: RunContext, tokenizer) -> None:
    """The stopping rule: add interleaved rounds of starts until the intervals are tight enough."""
    m = ctx.exp.measure
    target = m.target_rel
    if target is None:
        return
    from truthput.analyze.stopping import StoppingRule

    rule = StoppingRule(target_rel_halfwidth=target, max_starts=m.max_starts, min_starts=m.starts, alpha=1 - m.confidence)
    t_start = time.monotonic()
    n = m.starts
    while True:
        cells = _cells(ctx.store, ctx.run_id)
        decisions = []
        for c in ctx.plan.concurrency:
            per_variant = {v: cells.get((v, c), []) for v in (vp.name for vp in ctx.plan.variants)
                           if v not in ctx.failed}
            decisions.append(rule.decide(per_variant, ctx.exp.experiment.baseline,
                                         elapsed_s=time.monotonic() - t_start, budget_s=m.time_budget_s, look=n))
        if all(d.stop for d in decisions) or n >= m.max_starts:
            reasons = "; ".join(f"c={c}: {d.reason}" for c, d in zip(ctx.plan.concurrency, decisions))
            ctx.store.event(ctx.run_id, "stopping_rule", f"stopped after {n} starts per variant: {reasons}")
            ctx.stopping = {"starts": n, "reasons": reasons, "method": decisions[0].method if decisions else None}
            ctx.progress(f"stopping rule: {n} starts per variant: {reasons}")
            return
        ctx.progress(f"stopping rule: adding start round {n + 1}")
        order = [(vp.name, n) for vp in ctx.plan.variants if vp.name not in ctx.failed]
        await _run_order(ctx, order, ctx.store.done_trials(ctx.run_id), tokenizer)
        n += 1
