"""The simulator in virtual time: the same engine, scheduler and pricer as `sim serve`, no sleeping.

A trial on the real-time simulator waits out every step's price on the wall clock, so screening a
few hundred configurations would take hours. Here the event loop's clock is virtual: when nothing
is ready to run, the loop jumps the clock to the next timer instead of waiting for it. The engine
(`SimEngine`) is unchanged -- it still asks `loop.time()` and sleeps until each step's end -- so the
figures are the real-time simulator's figures, computed in CPU time.

The load runs in the same process, requests built the way the HTTP front builds them (the same
output streams, so n-gram speculation finds the same repeats): a closed loop of `concurrency`
streams, each submitting its next request when the last one finished, or an open loop of arrivals
at `rate` per second (Poisson or constant, whatever the server does), whose goodput -- output
tokens of requests that met the TTFT and ITL targets -- is counted as a served trial counts it.
There is no HTTP: what the HTTP front adds on a real server is the host's CPU, which the simulator
does not price anyway.

`python -m truthput.sim batch` reads one JSON object per line (a configuration: the `sim serve`
argv and the load) and writes one JSON object per line: per-start tok/s from the engine's
emitted-token counter over the window, TTFT and inter-chunk latency percentiles, goodput under
the line's SLOs for an open loop, or the start-up failure in vLLM's words. Every figure it prints is SIMULATED.
"""

from __future__ import annotations

import functools
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from truthput.errors import InputError
from truthput.load.virtual import VirtualLoad
from truthput.sim import textgen
from truthput.sim.engine import SimRequest
from truthput.sim.power import PowerMeter


@dataclass
class StartFigures:
    """One simulated server start's figures (virtual seconds)."""

    tokps: float
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    requests: int = 0
    virtual_s: float = 0.0
    tokps_per_w: float | None = None
    """Window tokens per joule the GPUs drew by the power model (tok/s per watt); None when the
    hardware's board power is not known."""
    goodput: float | None = None
    """Open loop: output tokens per second of the requests that finished in the window and met the
    SLOs (TTFT from arrival to first token; mean ITL over the tokens after the first step's)."""


#: As the closed-loop client: a window opens after this long even if the streams never all generated.
SETTLE_TIMEOUT_S = 120.0


class _Uncounted:
    """Stands in for every Prometheus series in virtual time: nobody scrapes a virtual server, and
    the counters' bookkeeping would be most of a step's CPU cost."""

    def inc(self, *_: Any) -> None:
        pass

    observe = set = inc

    def __getitem__(self, _: Any) -> "_Uncounted":
        return self


class _NoMetrics:
    def __getattr__(self, name: str) -> _Uncounted:
        setattr(self, name, _UNCOUNTED)  # found directly from the next step on
        return _UNCOUNTED


_UNCOUNTED = _Uncounted()


def _quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


class _Recorded(_Uncounted):
    """A latency series recorded as values, only while the window is open."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.on = False

    def observe(self, value: float) -> None:
        if self.on:
            self.values.append(value)


class _WindowMetrics(_NoMetrics):
    def __init__(self) -> None:
        self.ttft = _Recorded()
        self.itl = _Recorded()


class _Requests:
    """Builds the load's requests as the HTTP front builds them, numbered, from a seeded RNG."""

    def __init__(self, server: Any, load: VirtualLoad, seed: int) -> None:
        self.server = server
        self.load = load
        self.seed = seed
        self.copy_q = server.repetition.copy_start_prob(0.0)  # greedy, as the load's temperature 0
        self.max_new = max(1, min(load.output_tokens, server.max_model_len - load.input_tokens))
        self.sent = 0

    def new(self, now: float) -> SimRequest:
        from truthput.sim.server import Prompt

        self.sent += 1
        key_text = f"virtual prompt {self.seed} {self.sent}"
        n_in = self.load.input_tokens
        p = Prompt(tokens=n_in, key_text=key_text, text=None)
        skey = textgen.stream_key(textgen.text_key(key_text), greedy=True, seed=None,
                                  fp8_kv=self.server.fp8_kv, fallback=0)
        ids = functools.partial(_prompt_ids, (self.seed << 32) ^ self.sent ^ 0x51A7, n_in, self.server.vocab)
        return SimRequest(f"v{self.sent}", n_in, self.max_new, "length",
                          self.server.output_stream(p, skey, self.copy_q, ids), now)


def _prompt_ids(key: int, n: int, vocab: int) -> list[int]:
    """A virtual prompt's token ids, from the request's own seeded RNG. Drawn only when read (by
    n-gram lookup, or the output copying from its prompt): drawing every prompt's ids up front
    was a tenth of a screen's CPU."""
    rng = random.Random(key)
    return [int(rng.random() * vocab) for _ in range(n)]


class _Window:
    """The timed window on the virtual clock, and the engine's emitted-token counter at its ends
    (read inside the step that crosses each end, as a scrape lands inside a step); the modelled
    energy the GPUs drew inside it."""

    def __init__(self, metrics: _WindowMetrics, power: PowerMeter | None = None) -> None:
        self.metrics = metrics
        self.power = power
        self.now = 0.0
        if power is not None:
            power.clock = lambda: self.now  # a step is priced at the virtual time it is planned
        self.energy_at_w0: float | None = None
        self.energy_at_w1: float | None = None
        self.w0: float | None = None
        self.w1 = math.inf
        self.duration_s = 1.0
        self.emitted_at_w0: int | None = None
        self.emitted_at_w1: int | None = None

    def open(self, at: float, duration_s: float) -> None:
        self.w0, self.w1, self.duration_s = at, at + duration_s, duration_s

    def plan(self, engine: Any, now: float) -> tuple[list, list, float] | None:
        """The engine's next step, planned (and priced) at `now`."""
        self.now = now
        return engine.plan_step(now)

    def step(self, engine: Any, decodes: list, prefills: list, now: float, dt: float) -> tuple[float, bool]:
        """Run a planned step to its end; returns (its end, whether it ended inside the window)."""
        end = now + dt
        self._count(engine, end)
        inside = self.w0 is not None and self.w0 < end <= self.w1
        self.metrics.ttft.on = self.metrics.itl.on = inside
        engine.emit_step(decodes, prefills, end)
        if end <= self.w1:
            self.emitted_at_w1 = engine.total_emitted
            if self.power is not None:
                self.energy_at_w1 = self.power.energy_j(end)
        return end, inside

    def idle(self, engine: Any, until: float) -> float:
        """The clock jumps to `until`: nothing runs."""
        self._count(engine, until)
        if self.power is not None and self.w0 is not None and until <= self.w1:
            self.energy_at_w1 = self.power.energy_j(until)
        return until

    def _count(self, engine: Any, until: float) -> None:
        if self.w0 is not None and self.emitted_at_w0 is None and until > self.w0:
            self.emitted_at_w0 = engine.total_emitted  # the counters as the window opens
            if self.power is not None:
                self.energy_at_w0 = self.power.energy_j(self.w0)

    def tokps_per_w(self) -> float | None:
        """Window tokens per joule of modelled energy: tok/s per watt."""
        if self.energy_at_w0 is None or self.energy_at_w1 is None or self.energy_at_w1 <= self.energy_at_w0:
            return None
        return self.tokps() * self.duration_s / (self.energy_at_w1 - self.energy_at_w0)

    def tokps(self) -> float:
        e0 = self.emitted_at_w0 or 0
        e1 = self.emitted_at_w1 if self.emitted_at_w1 is not None else e0
        return (e1 - e0) / self.duration_s


def _measure(server: Any, load: VirtualLoad, seed: int, power: PowerMeter | None = None) -> StartFigures:
    """Drive the engine step by step on a virtual clock: a step planned at `now` ends at `now + dt`,
    its tokens go out then, and each stream whose request finished sends its next one at once."""
    if load.rate is not None:
        return _measure_open(server, load, seed, power)
    metrics = _WindowMetrics()
    server.metrics = metrics
    engine = server.make_engine()
    requests_of = _Requests(server, load, seed)

    def send(now: float) -> None:
        engine.submit(requests_of.new(now))

    # The window opens as a closed-loop trial's does: `warmup_s` after the first moment every
    # stream has a token (so a loop whose streams move in step is cut at the same phase as on a
    # served run), and closes `duration_s` later.
    window = _Window(metrics, power)
    now = 0.0
    inflight: set[SimRequest] = set()

    def send_tracked(t: float) -> None:
        send(t)
        inflight.add(engine.waiting[-1])

    for _ in range(load.concurrency):
        send_tracked(now)
    requests = 0
    while now < window.w1:
        planned = window.plan(engine, now)
        if planned is None:
            raise RuntimeError("virtual-time simulator: the engine went idle under a closed loop")
        decodes, prefills, dt = planned
        now, inside = window.step(engine, decodes, prefills, now, dt)
        for req, _ in (*decodes, *prefills):
            if req.finish_reason is not None and req in inflight:
                inflight.discard(req)
                requests += inside
                send_tracked(now)
        if window.w0 is None and (all(r.emitted >= 1 for r in inflight) or now >= SETTLE_TIMEOUT_S):
            # never settling (fewer sequences allowed than streams) opens it anyway, as a trial does
            window.open(now + load.warmup_s, load.duration_s)
    return StartFigures(tokps=window.tokps(), ttft_s=metrics.ttft.values, itl_s=metrics.itl.values,
                        requests=requests, virtual_s=now, tokps_per_w=window.tokps_per_w())


def arrival_times(rate: float, arrival: str, seed: int, until: float) -> list[float]:
    """Arrival times in [0, until): Poisson (exponential gaps from a seeded RNG) or constant."""
    if arrival == "constant":
        return [k / rate for k in range(int(math.ceil(until * rate)))]
    rng = random.Random(f"truthput-virtual-arrivals:{seed}")
    t, out = 0.0, []
    while t < until:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _measure_open(server: Any, load: VirtualLoad, seed: int, power: PowerMeter | None = None) -> StartFigures:
    """An open loop on the virtual clock: requests arrive on their schedule whatever the server does
    (one arriving during a step waits for the next), the engine steps while it has work, and the
    clock jumps to the next arrival when it has none. The window opens as an open-loop trial's
    does: when the first request has finished, and no sooner than `warmup_s` after the first
    arrival; it closes `duration_s` later."""
    assert load.rate is not None
    metrics = _WindowMetrics()
    server.metrics = metrics
    engine = server.make_engine()
    requests_of = _Requests(server, load, seed)
    # enough arrivals for any window: the window cannot open later than the first request's
    # lifetime, which a queue can stretch; more are drawn if the clock gets there
    horizon = load.warmup_s + load.duration_s + 60.0
    arrivals = arrival_times(load.rate, load.arrival, seed, horizon)
    nxt = 0
    held = -1  # arrivals up to this index found the cap full
    cap = load.max_in_flight or math.inf
    now = 0.0
    window = _Window(metrics, power)
    first_tokens: dict[SimRequest, int] = {}
    finished: list[tuple[SimRequest, int]] = []
    inflight: set[SimRequest] = set()
    while now < window.w1:
        if nxt >= len(arrivals):
            horizon *= 2
            arrivals = arrival_times(load.rate, load.arrival, seed, horizon)
        while nxt < len(arrivals) and arrivals[nxt] <= now and len(inflight) < cap:
            # one the cap held back is sent when a slot frees, as the client sends it
            req = requests_of.new(now if nxt <= held else arrivals[nxt])
            engine.submit(req)
            inflight.add(req)
            nxt += 1
        while held < len(arrivals) - 1 and arrivals[held + 1] <= now and len(inflight) >= cap:
            held += 1  # arrived while the cap was full
        planned = window.plan(engine, now)
        if planned is None:  # idle: jump to the next arrival
            now = window.idle(engine, max(now, arrivals[nxt]) if nxt < len(arrivals) else now + 1.0)
            continue
        decodes, prefills, dt = planned
        now, _ = window.step(engine, decodes, prefills, now, dt)
        for req, _ in (*decodes, *prefills):
            if req not in first_tokens and req.first_token_time is not None:
                first_tokens[req] = req.emitted
            if req.finish_reason is not None and req in inflight:
                inflight.discard(req)
                finished.append((req, first_tokens.get(req, req.emitted)))
                if window.w0 is None:
                    window.open(max(now, arrivals[0] + load.warmup_s), load.duration_s)
    w0, w1 = window.w0, window.w1
    done = [(r, first) for r, first in finished if w0 is not None and w0 <= r.last_token_time <= w1]
    good = sum(r.emitted for r, first in done if _meets(r, first, load))
    return StartFigures(tokps=window.tokps(), ttft_s=metrics.ttft.values, itl_s=metrics.itl.values,
                        requests=len(done), virtual_s=now, goodput=good / load.duration_s,
                        tokps_per_w=window.tokps_per_w())


def _meets(req: SimRequest, first_tokens: int, load: VirtualLoad) -> bool:
    """The client's rule for a good request (see `truthput.load.goodput`): TTFT within its target,
    the mean gap per token after the first chunk's within the ITL target, and arrival to last token
    within the end-to-end target."""
    if req.first_token_time is None:
        return False
    if load.slo_ttft_ms is not None and (req.first_token_time - req.arrival) * 1000.0 > load.slo_ttft_ms:
        return False
    intervals = req.emitted - max(first_tokens, 1)
    if load.slo_itl_ms is not None and intervals >= 1 and \
            (req.last_token_time - req.first_token_time) / intervals * 1000.0 > load.slo_itl_ms:
        return False
    if load.slo_e2e_ms is not None and (req.last_token_time - req.arrival) * 1000.0 > load.slo_e2e_ms:
        return False
    return True


def run_start(argv: list[str], load: VirtualLoad, seed: int) -> StartFigures:
    """One server start of `argv` (sim serve flags, `--seed` replaced by `seed`) under `load`, in
    virtual time. Raises StartupFailure or InputError as `sim serve` would refuse to start."""
    from truthput.sim.flags import parse_serve_args
    from truthput.sim.server import SimServer, make_pricer, resolve_setup

    cfg = parse_serve_args([*argv, "--seed", str(seed), "--disable-log-stats"])
    setup = resolve_setup(cfg)
    power = PowerMeter(setup.gpu, cfg.num_gpus)
    server = SimServer(cfg, setup, pricer=make_pricer(cfg, setup, None, on_step=power.priced))
    return _measure(server, load, seed, power)


@functools.cache
def _prepare() -> None:
    """What any line needs once per process: the modules a start imports and the GPU catalogue."""
    import truthput.hardware.physics  # noqa: F401
    import truthput.sim.flags  # noqa: F401
    import truthput.experiment.argv  # noqa: F401
    from truthput.hardware.gpus import list_gpus
    from truthput.hardware.models import list_models

    list_gpus()
    list_models()
    np.quantile([0.0], 0.5)  # numpy imports its quantile's helpers on first use


def evaluate(config: dict) -> dict:
    """One configuration (a batch line) -> its figures, or its start-up failure, as a JSON dict."""
    from truthput.sim.server import StartupFailure

    _prepare()  # before the clock starts: the first line's CPU is its own, not the process's start-up

    load = VirtualLoad.of_line(config)
    starts = int(config.get("starts", 1))
    seed0 = int(config.get("seed", 0))
    out: dict[str, Any] = {"id": config.get("id"), "source": "simulator"}
    cpu0 = time.process_time()
    try:
        runs = [run_start(list(config["argv"]), load, seed0 + i) for i in range(starts)]
    except StartupFailure as exc:
        text = " ".join(exc.lines)
        kind = "oom" if ("memory" in text.lower() or "KV cache" in text) else "invalid"
        out.update(ok=False, failure=kind, reason=exc.lines[-1] if exc.lines else "start-up failed")
        return out
    except InputError as exc:
        out.update(ok=False, failure="invalid", reason=str(exc))
        return out
    ttft = [v for r in runs for v in r.ttft_s]
    itl = [v for r in runs for v in r.itl_s]
    out.update(
        ok=True,
        tokps=[r.tokps for r in runs],
        goodput=[r.goodput for r in runs] if load.rate is not None else None,
        tokps_per_w=[r.tokps_per_w for r in runs] if all(r.tokps_per_w is not None for r in runs) else None,
        ttft_p50_s=_quantile(ttft, 0.5), ttft_p99_s=_quantile(ttft, 0.99),
        itl_p50_s=_quantile(itl, 0.5), itl_p99_s=_quantile(itl, 0.99),
        requests=sum(r.requests for r in runs),
        virtual_s=sum(r.virtual_s for r in runs),
        cpu_s=time.process_time() - cpu0,
    )
    return out


def batch_main(argv: list[str]) -> int:
    """`sim batch`: JSON lines in (stdin), JSON lines out (stdout), one per configuration, in order."""
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    for lineno, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            config = json.loads(line)
            if not isinstance(config, dict) or "argv" not in config or "concurrency" not in config:
                raise ValueError("expected an object with 'argv' and 'concurrency'")
        except ValueError as exc:
            print(f"truthput-sim batch: line {lineno}: {exc}", file=sys.stderr)
            return 2
        sys.stdout.write(json.dumps(evaluate(config)) + "\n")
        sys.stdout.flush()
    return 0
