"""One trial, the same way for `truthput run` and `truthput load`.

Anatomy: scrape /metrics (`pre`); drive the load, scraping when all streams are in flight
(`window_start`), every `sample_interval_s` inside the window (`periodic`: the server's own
running/waiting gauges and counter progress) and when the window closes (`window_end`); after
the drain scrape until the emitted-token counter settles (`post`); measure every figure
(`truthput.measure.trial.measure_trial`); apply the failure rule; commit the whole trial before
the next one starts (principle 3: nothing is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from truthput.engines.base import StartOutcome
from truthput.load.rows import RowLedger
from truthput.load.schedule import LoadResult
from truthput.measure.model import ClientCheck, Figure, SelfCheckFigures, TrialResults
from truthput.measure.names import EngineMetricNames
from truthput.measure.prom import Scrape
from truthput.measure.slots import SlotsRead, read_slots
from truthput.run.sink import TrialSink
from truthput.store.db import TrialKey

SAMPLE_INTERVAL_S = 0.5
NO_SLOTS = frozenset({"vllm", "sglang"})
"""Engines with no `/slots` (llama.cpp has it; an unknown `command` server may): not read."""
"""In-window /metrics sampling period: a few samples in a short window, and a modest client cost
(one GET and a filtered copy of the text per sample; the parse happens after the load)."""

WindowCallback = Callable[[], Awaitable[None]]
Drive = Callable[[WindowCallback, WindowCallback], Awaitable[LoadResult]]


@dataclass
class TrialSetup:
    """What a trial needs besides the load itself."""

    base_url: str
    names: EngineMetricNames
    engine: str
    """Metric-name family the figures are read with (vllm, sglang, llamacpp)."""
    speculative: dict[str, Any] | None = None
    tokenizer: Any = None
    simulated: bool = False
    sample_gpu: bool = False
    error_threshold: float = 0.5
    """A trial with more than this share of failed requests is a failed trial."""
    sample_interval_s: float = SAMPLE_INTERVAL_S
    log_lines: Callable[[float, float], list[tuple[float, str]]] | None = None
    crashed: Callable[[], StartOutcome | None] | None = None
    """The server's classified failure once it died under load (None: still up, or not known)."""
    server_pgids: set[int] = field(default_factory=set)
    """Process groups of the server's processes (empty: unknown, e.g. a server someone else runs)."""
    open_loop: bool = False
    """Requests arrive at a rate: a queue in the server is what is measured, not a load not reached."""
    workload: Any = None
    """The trial's `load.workload.Workload`: what each request asked for, to check the work done against."""
    rows: RowLedger | None = None
    """The rows of the user's file this server has been sent (a row source): the trial's are added,
    and a row sent again is flagged (`workload_repeats`)."""


@dataclass
class TrialRun:
    """A finished trial: its figures, the raw data behind them, and its status."""

    results: TrialResults
    load: LoadResult
    scrapes: list[Scrape]
    t0_wall: float
    t0_mono: float
    t_end: float
    status: str = "ok"
    error: str | None = None
    crashed: bool = False
    telemetry_rows: list[tuple[float, int, float | None, float | None, float | None, float | None]] = \
        field(default_factory=list)

    @property
    def window(self) -> tuple[float | None, float | None]:
        return (self.load.t_window_start, self.load.t_window_end)

    def client_tokens(self) -> int:
        """Tokens of every finished request (usage), plus the running count of failed ones."""
        from truthput.load.records import client_tokens

        return client_tokens(self.load.records)


def _sampled_families(names: EngineMetricNames) -> tuple[str, ...]:
    """Metric names whose lines an in-window sample keeps (the rest of the text is not needed)."""
    out: list[str] = []
    for f in ("emitted_tokens", "running", "waiting", "kv_usage", "preemptions", "spec_drafts",
              "spec_draft_tokens", "spec_accepted", "spec_accepted_per_pos", "spec_verify_calls"):
        for n in names.candidates(f):
            base = n[: -len("_total")] if n.endswith("_total") else n
            out.extend([n, base + "_created"] if n.endswith("_total") else [n])
    return tuple(out)


def _keep_lines(text: str | None, prefixes: tuple[str, ...]) -> str | None:
    """The sampled families' lines of a periodic scrape (what the window's series need)."""
    if text is None:
        return None
    keep = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[2].startswith(prefixes):
                keep.append(line)
        elif line.startswith(prefixes):
            keep.append(line)
    return "\n".join(keep) + "\n"


async def run_trial(setup: TrialSetup, drive: Drive, concurrency: int | Callable[[LoadResult], int]) -> TrialRun:
    """Scrape, load, sample, settle, measure; returns the trial (not yet committed)."""
    import aiohttp

    from truthput.measure.scrape import scrape_edge, scrape_metrics, settled_post_scrapes
    from truthput.measure.trial import measure_trial

    from truthput.engines.interference import HostLoad

    scrapes: list[Scrape] = []
    slot_reads: list[SlotsRead] = []
    families = _sampled_families(setup.names)
    host = HostLoad(server_pgids=set(setup.server_pgids))
    t0_wall, t0_mono = time.time(), time.monotonic()
    sampler_task: asyncio.Task[None] | None = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        async def sample() -> None:
            # jittered (0.5-1.5x the interval): samples at a fixed period alias with a request cycle of
            # the same period and can see every request in the same phase (e.g. always queued)
            rng = random.Random(int(t0_mono * 1e6))
            while True:
                await asyncio.sleep(setup.sample_interval_s * rng.uniform(0.5, 1.5))
                s = await scrape_metrics(session, setup.base_url, "periodic")
                scrapes.append(Scrape(s.phase, s.t_mono, _keep_lines(s.text, families), s.error))

        async def window_start() -> None:
            nonlocal sampler_task
            scrapes.extend(await scrape_edge(session, setup.base_url, "window_start"))
            if setup.engine not in NO_SLOTS:
                slot_reads.append(await read_slots(session, setup.base_url, "window_start"))
            host.begin()
            if setup.sample_interval_s > 0:
                sampler_task = asyncio.ensure_future(sample())

        async def window_end() -> None:
            if sampler_task is not None:
                sampler_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler_task
            scrapes.extend(await scrape_edge(session, setup.base_url, "window_end"))
            if slot_reads and slot_reads[0].error is None:
                slot_reads.append(await read_slots(session, setup.base_url, "window_end"))
            host.end()

        scrapes.extend(await scrape_edge(session, setup.base_url, "pre"))
        gpu = None
        if setup.sample_gpu:
            from truthput.engines.telemetry import GpuSampler

            gpu = GpuSampler().start()
        try:
            result = await drive(window_start, window_end)
        finally:
            if sampler_task is not None and not sampler_task.done():
                sampler_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler_task
            telemetry = gpu.stop() if gpu is not None else None
        scrapes.extend(await settled_post_scrapes(session, setup.base_url, setup.names.candidates("emitted_tokens")))
    t_end = time.monotonic()
    scrapes.sort(key=lambda s: s.t_mono)
    window = (result.t_window_start, result.t_window_end)
    logs = setup.log_lines(t0_mono - 1.0, t_end + 1.0) if setup.log_lines else None
    level = concurrency(result) if callable(concurrency) else concurrency
    results = measure_trial(result.records, scrapes, logs,
                            (window[0], window[1]) if window[0] is not None and window[1] is not None else None,
                            level, engine=setup.engine, speculative=setup.speculative, tokenizer=setup.tokenizer,
                            names=setup.names, open_loop=setup.open_loop, model=result.model, slots=slot_reads,
                            simulated=setup.simulated)
    results.simulated = setup.simulated
    results.client = ClientCheck(
        selfcheck=SelfCheckFigures.model_validate(dataclasses.asdict(result.selfcheck)) if result.selfcheck else None,
        notes=list(result.notes), never_settled=bool(result.never_settled))
    run = TrialRun(results=results, load=result, scrapes=scrapes, t0_wall=t0_wall, t0_mono=t0_mono, t_end=t_end)
    results.client.token_total = run.client_tokens()
    from truthput.measure.validity import check_client

    check_client(results)
    if setup.workload is not None:
        from truthput.measure.validity import check_work

        spec = setup.workload.spec
        check_work(results, result.records, setup.workload.asked, spec.ignore_eos,
                   exact_prompts=setup.workload.tokenizer is not None, chat=spec.endpoint == "chat")
    offsets = setup.workload.trace_offsets() if setup.workload is not None else None
    if offsets:
        from truthput.measure.validity import check_replay

        check_replay(results, result.lateness, result.scheduled, offsets, [r.t_start for r in result.records])
    if setup.rows is not None and setup.workload is not None:
        from truthput.measure.validity import check_rows

        check_rows(results, setup.rows.record(setup.workload, (r.idx for r in result.records)))
    _telemetry(run, telemetry, setup, gpu)
    _interference(run, setup, host, telemetry)
    _failure_rule(run, setup)
    return run


def traffic_between(prev: TrialRun | None, cur: TrialRun, names: EngineMetricNames) -> str | None:
    """Other traffic between two trials that ran back to back with nothing of truthput's between
    them: the token counter should not move from the first one's settled `post` scrape to the
    second one's `pre` scrape. A line saying how much it moved (tok/s), or None."""
    if prev is None:
        return None
    posts = [s for s in prev.scrapes if s.phase == "post" and s.error is None]
    pres = [s for s in cur.scrapes if s.phase == "pre" and s.error is None]
    if not posts or not pres or pres[0].t_mono <= posts[-1].t_mono:
        return None
    from truthput.measure.scrape import counter_value

    emitted = names.candidates("emitted_tokens")
    a, b = counter_value(posts[-1], emitted), counter_value(pres[0], emitted)
    if a is None or b is None or b <= a:
        return None  # quiet (or restarted: the counter's own checks say so)
    seconds = pres[0].t_mono - posts[-1].t_mono
    return (f"other traffic: the server's token counter rose {b - a:g} in the {seconds:.1f} s between this trial and "
            f"the one before, with no request of truthput's in flight ({(b - a) / seconds:.1f} tok/s from another "
            "client); see foreign_traffic for what it did to this trial's figure")


def _interference(run: TrialRun, setup: TrialSetup, host: Any, telemetry: Any) -> None:
    from truthput.engines.interference import server_pids
    from truthput.measure.validity import check_interference

    i = run.results.interference
    if not setup.server_pgids:
        i.note = "host CPU: not checked (the server's processes are not known to truthput here)"
    elif host.other_cores is None:
        i.note = f"host CPU: not checked ({host.reason})"
    else:
        i.host_cores = host.cores
        i.host_other_cores = Figure(value=host.other_cores, unit="cores", source="client_clock", window="window",
                                    note="/proc/stat busy time less truthput's and the server's processes")
        if host.server_cores is not None:
            i.server_cores = Figure(value=host.server_cores, unit="cores", source="client_clock", window="window",
                                    note="CPU time of the server's processes (/proc) over the window")
        if host.front_cores is not None:
            i.server_front_cores = Figure(value=host.front_cores, unit="cores", source="client_clock",
                                          window="window", note="CPU time of the process truthput started (the "
                                          "server's front end; its children not counted) over the window")
    if telemetry is not None and getattr(telemetry, "available", False):
        mine = server_pids(setup.server_pgids) | {os.getpid()}
        seen = set(telemetry.gpu_pids)
        if seen and seen & mine:  # the GPU's pids are this host's: a stranger among them is another process
            i.gpu_foreign_pids = sorted(seen - mine)
        elif seen:
            i.note += "; GPU processes: pids from another namespace (a container), not compared"
        i.gpu_throttle_samples = dict(telemetry.throttle_samples)
    check_interference(run.results)


def _telemetry(run: TrialRun, telemetry: Any, setup: TrialSetup, gpu: Any) -> None:
    if telemetry is None:
        why = "simulated server (no GPU)" if setup.simulated else "not sampled for this trial"
        # a simulator's modelled energy (measure_trial read it from its counter) stays beside the why
        run.results.telemetry = {**(run.results.telemetry or {}), "available": False,
                                 "reason": f"no GPU telemetry: {why}"}
        return
    from truthput.engines.telemetry import energy_per_token

    run.results.telemetry = telemetry.to_dict()
    tokens = run.results.integrity.counter_delta.value
    if telemetry.available and tokens:
        run.results.telemetry["energy_per_token_j"] = {
            "value": energy_per_token(telemetry, tokens), "unit": "J/token", "source": "nvml + server_counter"}
    run.telemetry_rows = [(x.t_mono, x.gpu, x.util_pct, x.mem_used_bytes, x.power_w, x.sm_clock_mhz)
                          for x in gpu.samples]


def _failure_rule(run: TrialRun, setup: TrialSetup) -> None:
    """A trial fails when too many of its requests failed, or when the server crashed under it."""
    records = run.load.records
    n_err = sum(1 for r in records if r.status != "ok")
    if records and n_err / len(records) > setup.error_threshold:
        run.status, run.error = "failed", f"request_errors: {n_err} of {len(records)} requests failed"
    stopped = getattr(run.load, "stopped_early", None)
    if stopped:
        run.status, run.error = "failed", f"request_errors: load ended early: {stopped}"
    crash = setup.crashed() if setup.crashed is not None else None
    if crash is not None:
        run.status, run.error, run.crashed = "failed", f"{crash.failure_kind}: {crash.reason}", True


FAILED_ROWS_STORED = 200
"""Failed requests stored one row each per trial; beyond them only their count is kept
(`requests.failed_not_stored`), while the whole-trial identity keeps every failure's partial
tokens (`integrity.failed_partial_tokens`), so it can still be checked from the store."""


def commit(store: TrialSink, run_id: str, variant: str, start_id: int | None, key: TrialKey, run: TrialRun) -> int:
    """Write the trial and everything it saw in one transaction."""
    records = run.load.records
    failed = [r for r in records if r.status != "ok"]
    if len(failed) > FAILED_ROWS_STORED:
        keep = {id(r) for r in failed[:FAILED_ROWS_STORED]}
        records = [r for r in records if r.status == "ok" or id(r) in keep]
        run.results.requests.failed_not_stored = len(failed) - FAILED_ROWS_STORED
    return int(store.commit_trial(run_id, variant, start_id, key, run.status, run.t0_wall, run.t0_mono, run.window,
                                  run.t_end, run.results, records, run.scrapes,
                                  telemetry=run.telemetry_rows, error=run.error))


async def serves_simulator(base_url: str) -> bool:
    """Whether the server behind `base_url` says it is the truthput simulator (GET /version)."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            async with session.get(base_url + "/version") as resp:
                return resp.status == 200 and "truthput" in (await resp.text()).lower()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


def headline_line(results: TrialResults) -> str:
    """A trial's headline as one progress line fragment: the figure and where it came from."""
    from truthput.analyze.cells import headline, source_label

    h: Figure = headline(results)
    if h.value is None:
        return "no throughput figure"
    sim = ", simulated" if results.simulated else ""
    return f"{h.value:.1f} tok/s [{source_label(h.source)}{sim}]"
