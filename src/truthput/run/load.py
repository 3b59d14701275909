"""`truthput load`: load against a running endpoint, measured and stored exactly like `truthput run`.

`truthput run` owns server lifecycles; this drives a server someone else runs (like `vllm bench
serve`) through the same trial pipeline (`truthput.run.trial`: scrapes, in-window samples,
settle, measure, failure rule, commit before the next trial). Each load level (a concurrency, a
rate, or a sweep step) is one trial. A simulator behind the URL is detected as `run` detects it,
and every figure of such a run is labelled simulated.

Lean on purpose (the whole run's CPU is part of what the client costs): nothing heavy is imported
until the load is over, and the store write is one transaction per trial.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from truthput.errors import InputError
from truthput.store.db import Store
from truthput.load.client import ClientConfig, StreamClient
from truthput.load.goodput import SLO, goodput
from truthput.load.rows import RowLedger
from truthput.load.schedule import ClosedLoop, LoadResult, OpenLoop, Sweep
from truthput.load.workers import TrialLoad, WorkerPool
from truthput.load.workload import Distribution, Workload, WorkloadSpec
from truthput.measure.model import Goodput, LoadLevel, TrialResults
from truthput.run.trial import TrialRun
from truthput.analyze.loadrows import LoadRow, LoadSummary


@dataclass
class LoadOptions:
    """Everything `truthput load` was asked to do (stored as the run's TOML, minus secrets)."""

    url: str
    concurrency: list[int] = field(default_factory=lambda: [1])
    rate: list[float] = field(default_factory=list)  # req/s; non-empty -> open loop
    arrival: str = "poisson"
    max_in_flight: int | None = None
    sweep: bool = False
    sweep_max: float = 512.0
    sweep_tolerance: float = 0.05
    requests: int | None = None
    duration_s: float | None = None
    workload: WorkloadSpec = field(default_factory=lambda: WorkloadSpec(input_tokens=128, output_tokens=128))
    seed: int = 0
    model: str | None = None
    api_key_env: str | None = None
    slo: SLO = field(default_factory=SLO)
    workers: int = 1
    tokenizer_path: str | None = None
    engine: str = "vllm"
    name: str = "load"
    test_chunk_spin_s: float = 0.0
    sample_interval_s: float = 0.5
    cache: str = "as-is"
    """The prefix cache at each level's window: as-is, warm or reset (`engines.cache.CACHE_POLICIES`)."""

    def __post_init__(self) -> None:
        if self.workload.prompt_source.startswith("trace:"):  # one level: the trace's own times
            from truthput.load.workload import cached_trace
            from truthput.load.trace import TraceOptions

            replay = cached_trace(self.workload.prompt_source[len("trace:"):]).replayed(
                self.workload.trace or TraceOptions())
            self.rate, self.concurrency, self.requests = [round(replay.rate, 4)], [1], len(replay.requests)
        if self.requests is None and self.duration_s is None:
            raise InputError("truthput load: give --requests N or --duration SECONDS")
        if self.workers < 1:
            raise InputError(f"--workers {self.workers}: must be >= 1")
        if any(c < 1 for c in self.concurrency):
            raise InputError(f"--concurrency {self.concurrency}: every level must be >= 1")
        if self.duration_s is not None and not 0 < self.duration_s < float("inf"):
            raise InputError(f"--duration {self.duration_s}: expected a finite number of seconds > 0")
        if any(not 0 < r < float("inf") for r in self.rate):
            raise InputError(f"--rate {self.rate}: every rate must be > 0 requests/s")
        from truthput.engines.cache import CACHE_POLICIES

        if self.cache not in CACHE_POLICIES:
            raise InputError(f"--cache {self.cache}: expected one of {', '.join(CACHE_POLICIES)}")
        if not 0 <= self.sample_interval_s < float("inf"):
            raise InputError(f"--sample-interval {self.sample_interval_s}: must be a number of seconds >= 0")

    @property
    def mode(self) -> str:
        return "open" if self.rate else "closed"

    def client_config(self) -> ClientConfig:
        return ClientConfig(base_url=self.url, endpoint=self.workload.endpoint, model=self.model,
                            api_key_env=self.api_key_env, test_chunk_spin_s=self.test_chunk_spin_s)

    def toml(self) -> str:
        """The options as TOML (the run's `experiment_toml`); the API key itself is never in it."""
        wl = self.workload
        rows: dict[str, Any] = {
            "url": self.url, "mode": self.mode, "concurrency": self.concurrency, "rate": self.rate,
            "arrival": self.arrival, "max_in_flight": self.max_in_flight, "sweep": self.sweep,
            "requests": self.requests, "duration_s": self.duration_s, "seed": self.seed, "model": self.model,
            "api_key_env": self.api_key_env, **{f"slo_{k}": v for k, v in self.slo.targets().items()},
            "workers": self.workers, "tokenizer": self.tokenizer_path, "cache": self.cache,
        }
        wrows: dict[str, Any] = {
            "endpoint": wl.endpoint, "prompt_source": wl.prompt_source, "ignore_eos": wl.ignore_eos,
            "temperature": wl.temperature, "top_p": wl.top_p, "seed": wl.seed,
            "input_tokens": _dist_text(wl.input_tokens), "output_tokens": _dist_text(wl.output_tokens),
            "thinking": wl.thinking, "prefixes": wl.prefixes, "suffixes": wl.suffixes,
            "prefix_tokens": wl.prefix_tokens, "turns": wl.turns, "tool_choice": wl.tool_choice,
        }
        return "[load]\n" + _toml_rows(rows) + "\n[load.workload]\n" + _toml_rows(wrows)


def _dist_text(d: Any) -> Any:
    if isinstance(d, Distribution):
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(d).items()
                if v not in ((), 0, 0.0) or k == "kind"}
    return d


def _toml_value(v: Any) -> str:
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v))


def _toml_rows(rows: dict[str, Any]) -> str:
    return "".join(f"{k} = {_toml_value(v)}\n" for k, v in rows.items() if v is not None)


@dataclass
class TrialOutcome:
    """One load level's trial (what the summary prints)."""

    level: float
    mode: str
    trial: TrialRun
    trial_id: int | None = None

    @property
    def results(self) -> TrialResults:
        return self.trial.results

    @property
    def load(self) -> LoadResult:
        return self.trial.load

    @property
    def counter_tps(self) -> float | None:
        return self.results.throughput.counter_window.number()

    @property
    def client_tokens(self) -> int:
        return self.trial.client_tokens()

    @property
    def counter_tokens(self) -> float | None:
        return self.results.integrity.counter_delta.number()


@dataclass
class LoadRun:
    run_id: str | None
    outcomes: list[TrialOutcome]
    summary: LoadSummary
    """Its rows as every view shows them (computed once; stored with the run)."""
    simulated: bool = False

    def rows(self) -> list[LoadRow]:
        """One row per trial with the figures the table and `--json` show."""
        return self.summary.levels


def load_summary(opts: LoadOptions, run_id: str | None, outcomes: list[TrialOutcome], sweep: Sweep | None,
                 simulated: bool, before_load: list[str] | None = None) -> LoadSummary:
    """The run's one summary: a row per trial (`truthput.analyze.loadrows.load_row`) and the sweep's answer."""
    from truthput.analyze.loadrows import LoadSweep, load_row

    said = None
    if sweep is not None:
        sat = sweep.saturation()
        said = LoadSweep(saturation_level=sat.level if sat else None, saturation_tps=sat.throughput if sat else None,
                         saturated=sweep.saturated, tolerance=sweep.tolerance)
    rows = [load_row(o.level, o.mode, o.results, o.load.records, o.trial.status, o.trial.error, o.client_tokens)
            for o in outcomes]
    return LoadSummary(url=opts.url, run_id=run_id, simulated=simulated, unit="req/s" if opts.rate else "streams",
                       goodput=opts.slo.any, levels=rows, sweep=said, before_load=list(before_load or []))


async def run_load(opts: LoadOptions, store: Store | None = None, pool: WorkerPool | None = None,
                   progress: Callable[[str], None] | None = None, tokenizer: Any = None) -> LoadRun:
    """Every load level as a trial: scrape, load, scrape, measure, store. `pool` when --workers > 1
    (forked before the event loop started)."""
    from truthput.measure.names import metric_names
    from truthput.run.trial import serves_simulator, traffic_between
    from truthput.store.db import TrialKey

    say = progress or (lambda _m: None)
    names = metric_names(opts.engine)
    run_id = None
    from truthput.load.client import api_root

    simulated = await serves_simulator(api_root(opts.url))
    if simulated:
        say("the server reports itself as the truthput SIMULATOR: every figure is simulated")
    if store is not None:
        machine: dict[str, Any] = {}
        try:
            from truthput.engines.versions import machine_metadata

            machine = machine_metadata()
        except Exception:  # noqa: BLE001 - machine metadata is optional
            machine = {}
        run_id = store.create_run(opts.name, engine="external", simulated=simulated, experiment_path=None,
                                  experiment_toml=opts.toml(), seed=opts.seed, machine=machine)
        store.put_variant(run_id, "load", 0, True, [opts.url], {"lines": ["(load only: a running endpoint)"]}, {})
    start_id = None
    if store is not None and run_id is not None:
        start_id = store.begin_start(run_id, "load", 0, [opts.url], None)
        store.update_start(start_id, status="ready")
    outcomes: list[TrialOutcome] = []
    before_load: list[str] = []
    sweep: Sweep | None = None
    status = "failed"
    summary: LoadSummary | None = None
    client_cfg = opts.client_config()
    try:
        async with StreamClient(client_cfg) as client:
            base = client.url.rsplit("/v1/", 1)[0]
            await client.resolve_model()  # fail fast with one line when the endpoint is wrong
            from truthput.measure.scrape import other_traffic

            said, note = await other_traffic(base, names.candidates("emitted_tokens"), names.candidates("running"),
                                             client.model)
            if said:
                say("warning: " + said)
                before_load.append(said)
                if store is not None and run_id is not None:
                    store.event(run_id, "other_traffic", said)
            if note:
                say("note: " + note)
            ledger = await _row_ledger(opts, store, tokenizer)
            levels = _levels(opts)
            if opts.sweep:
                start = float(opts.rate[0]) if opts.rate else float(opts.concurrency[0])
                sweep = Sweep(start=start, max_level=opts.sweep_max, tolerance=opts.sweep_tolerance,
                              integer=not opts.rate)
            k = 0
            while True:
                if sweep is not None:
                    level = sweep.next_level()
                    if level is None:
                        break
                elif k < len(levels):
                    level = levels[k]
                else:
                    break
                cache = await _cache_before(opts, base, names, tokenizer, k, ledger)
                out = await _one_trial(opts, base, client, pool, level, k, names, tokenizer, simulated, ledger)
                out.trial.results.cache = cache
                if cache:
                    say(cache)
                # a reset's probes or a priming are truthput's own traffic between the two trials
                other = None if cache else traffic_between(outcomes[-1].trial if outcomes else None, out.trial, names)
                if other is not None:
                    out.trial.results.warnings.append(other)
                    say("warning: " + other)
                if sweep is not None:
                    sweep.record(level, out.counter_tps)
                if store is not None and run_id is not None:
                    out.trial_id = _commit(store, run_id, start_id, opts, out, k, TrialKey)
                outcomes.append(out)
                say(_progress_line(out))
                k += 1
        status = "done"
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = "interrupted"
        raise
    finally:
        summary = load_summary(opts, run_id, outcomes, sweep, simulated, before_load)
        if store is not None:
            if start_id is not None:
                store.update_start(start_id, status="stopped", stopped_at=time.time())
            if run_id is not None:
                store.set_run_status(run_id, status, summary.to_json())
    return LoadRun(run_id=run_id, outcomes=outcomes, summary=summary, simulated=simulated)


async def _cache_before(opts: LoadOptions, base: str, names: Any, tokenizer: Any, k: int,
                        ledger: RowLedger) -> str | None:
    """`--cache reset`: the prefix cache emptied (and checked) before every level's window; `--cache
    warm`: the level's shared text sent before it. What was done, or None."""
    from truthput.engines.cache import prime_cache, reset_cache

    if opts.cache == "reset":
        return await reset_cache(base, opts.engine, opts.model, names.candidates("prefix_cache_hits"))
    if opts.cache == "warm":
        texts = Workload(opts.workload, seed=_level_seed(opts, k, ledger.loads_before),
                         tokenizer=tokenizer).shared_texts()
        return await prime_cache(base, texts, opts.model) if texts else \
            "--cache warm: nothing to prime (this workload shares no text by design)"
    return None


async def _row_ledger(opts: LoadOptions, store: Store | None, tokenizer: Any) -> RowLedger:
    """The user's rows this server has been sent by earlier `load`s (the same URL, file and
    order, and the same server process where its /metrics says when it started): this load goes on
    after them, so a second load on one server sends new rows as the user's traffic would."""
    from truthput.load.client import api_root
    from truthput.measure.scrape import server_started

    workload = Workload(opts.workload, seed=opts.seed, tokenizer=tokenizer, order_seed=opts.seed)
    earlier = [run for run in (store.runs() if store is not None else [])
               if run.is_load and _stored_options(run.experiment_toml).get("url") == opts.url]
    if not workload.n_rows:  # text made here: each load's own, so no load meets an earlier one's in the cache
        return RowLedger(loads_before=len(earlier))
    started = await server_started(api_root(opts.url))
    reach = 0
    for run in earlier:
        if _stored_options(run.experiment_toml).get("seed", 0) != opts.seed:
            continue
        for kept in store.trial_results(run.id):  # type: ignore[union-attr]
            used = kept.results.rows
            if (used is not None and used.source == opts.workload.prompt_source and used.rows == workload.n_rows
                    and (started is None or used.server in (None, started))):
                reach = max(reach, used.reach)
    ledger = RowLedger.continuing(reach, workload)
    ledger.server = started
    return ledger


def _stored_options(toml_text: str) -> dict[str, Any]:
    import tomllib

    try:
        said = tomllib.loads(toml_text).get("load")
    except tomllib.TOMLDecodeError:
        return {}
    return said if isinstance(said, dict) else {}


def _level_seed(opts: LoadOptions, k: int, loads_before: int = 0) -> int:
    """The workload seed of the k-th level (its synthetic text, its shared prefixes), other for each
    earlier `load` of the same URL in the store: text made here never repeats an earlier load's."""
    return opts.seed * 1_000_003 + k + loads_before * 7_919


def _levels(opts: LoadOptions) -> list[float]:
    return [float(r) for r in opts.rate] if opts.rate else [float(c) for c in opts.concurrency]


ALL_FAILED = 1.0 - 1e-9
"""`truthput load` fails a trial only when every request failed: a running endpoint under a load
level it cannot take still has its answered requests measured (the table shows the failures)."""


async def _one_trial(opts: LoadOptions, base: str, client: StreamClient, pool: WorkerPool | None,
                     level: float, k: int, names: Any, tokenizer: Any, simulated: bool,
                     ledger: RowLedger) -> TrialOutcome:
    from truthput.run.trial import TrialSetup, run_trial

    seed = _level_seed(opts, k)
    workload = Workload(opts.workload, seed=_level_seed(opts, k, ledger.loads_before), tokenizer=tokenizer, order_seed=opts.seed, rows_from=ledger.reach)

    async def drive(window_start: Any, window_end: Any) -> LoadResult:
        if pool is not None:
            load = TrialLoad(mode=opts.mode, concurrency=int(level), rate=level if opts.rate else None,
                             arrival=opts.arrival, max_in_flight=opts.max_in_flight, duration_s=opts.duration_s,
                             max_requests=opts.requests, seed=seed)
            return await pool.run(workload, load, window_start, window_end)
        if opts.rate:
            return await OpenLoop(client, workload, level, opts.arrival, opts.max_in_flight,
                                  duration_s=opts.duration_s, max_requests=opts.requests,
                                  seed=seed, offsets=workload.trace_offsets()).run(window_start, window_end)
        return await ClosedLoop(client, workload, int(level), duration_s=opts.duration_s,
                                max_requests=opts.requests).run(window_start, window_end)

    def concurrency(result: LoadResult) -> int:
        return int(level) if not opts.rate else (opts.max_in_flight or result.max_in_flight)

    setup = TrialSetup(base_url=base, names=names, engine=opts.engine, tokenizer=tokenizer, simulated=simulated,
                       error_threshold=ALL_FAILED, sample_interval_s=opts.sample_interval_s, open_loop=bool(opts.rate),
                       workload=workload, rows=ledger)
    trial = await run_trial(setup, drive, concurrency)
    if trial.results.rows is not None:
        trial.results.rows.server = ledger.server
    res = trial.results
    window = trial.window
    res.load = LoadLevel(mode=opts.mode, level=level, unit="req/s" if opts.rate else "streams",
                         arrival=opts.arrival if opts.rate else None, max_in_flight_seen=trial.load.max_in_flight,
                         workers=opts.workers)
    start, end = window
    res.goodput = Goodput.model_validate(goodput(trial.load.records, opts.slo,
                                                 (start, end) if start is not None and end is not None else None))
    res.client.continuous_usage = client.continuous_usage_supported
    if trial.status != "ok" and trial.error and trial.error.startswith("request_errors"):
        trial.error = f"request_errors: all {len(trial.load.records)} requests failed"
    return TrialOutcome(level=level, mode=opts.mode, trial=trial)


def _commit(store: Store, run_id: str, start_id: int | None, opts: LoadOptions, out: TrialOutcome, k: int,
            key_type: Any) -> int:
    from truthput.run.trial import commit

    # the store keys trials by level: a closed loop's streams or an open loop's rate; trial_index k
    # keeps a sweep's repeated levels distinct
    from truthput.experiment.levels import Rate

    level_key = Rate(out.level) if opts.rate else int(out.level)
    return commit(store, run_id, "load", start_id, key_type("load", 0, level_key, k), out.trial)


def _progress_line(out: TrialOutcome) -> str:
    from truthput.run.trial import headline_line

    unit = "req/s" if out.mode == "open" else "streams"
    return f"{out.level:g} {unit}: {headline_line(out.results)}; {len(out.load.records)} requests"
