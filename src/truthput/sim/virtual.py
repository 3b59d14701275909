"""The simulator in virtual time: the same engine, scheduler and pricer as `sim serve`, no sleeping.

A trial on the real-time simulator waits out every step's price on the wall clock, so screening a
few hundred configurations would take hours. Here the event loop's clock is virtual: when nothing
is ready to run, the loop jumps the clock to the next timer instead of waiting for it. The engine
(`SimEngine`) is unchanged -- it still asks `loop.time()` and sleeps until each step's end -- so the
figures are the real-time simulator's figures, computed in CPU time.

The load is a closed loop in the same process: `concurrency` streams, each submitting its next
request when the last one finished, requests built the way the HTTP front builds them (the same
output streams, so n-gram speculation finds the same repeats). There is no HTTP: what the HTTP
front adds on a real server is the host's CPU, which the simulator does not price anyway.

`python -m truthput.sim batch` reads one JSON object per line (a configuration: the `sim serve`
argv and the load) and writes one JSON object per line: per-start tok/s from the engine's
emitted-token counter over the window, TTFT and inter-chunk latency percentiles, or the start-up
failure in vLLM's words. Every figure it prints is SIMULATED.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from truthput.errors import SpecError
from truthput.sim import textgen
from truthput.sim.engine import SimRequest


@dataclass
class LoadSpec:
    """A closed-loop load: `concurrency` streams of fixed-length requests, measured over a window."""

    concurrency: int
    input_tokens: int = 256
    output_tokens: int = 256
    duration_s: float = 30.0
    warmup_s: float = 5.0


@dataclass
class StartFigures:
    """One simulated server start's figures (virtual seconds)."""

    tokps: float
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    requests: int = 0
    virtual_s: float = 0.0


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


def _measure(server: Any, load: LoadSpec, seed: int) -> StartFigures:
    """Drive the engine step by step on a virtual clock: a step planned at `now` ends at `now + dt`,
    its tokens go out then, and each stream whose request finished sends its next one at once."""
    from truthput.sim.server import Prompt

    metrics = _WindowMetrics()
    server.metrics = metrics
    engine = server.make_engine()
    rng = random.Random(seed ^ 0x51A7)
    vocab_ids = range(server.vocab)
    copy_q = server.repetition.copy_start_prob(0.0)  # greedy, as the load's temperature 0
    max_new = max(1, min(load.output_tokens, server.max_model_len - load.input_tokens))
    sent = 0

    def send(now: float) -> None:
        nonlocal sent
        sent += 1
        key_text = f"virtual prompt {seed} {sent}"
        p = Prompt(tokens=load.input_tokens, key_text=key_text, text=None,
                   ids=rng.choices(vocab_ids, k=load.input_tokens))
        skey = textgen.stream_key(textgen.text_key(key_text), greedy=True, seed=None,
                                  fp8_kv=server.fp8_kv, fallback=0)
        engine.submit(SimRequest(f"v{sent}", load.input_tokens, max_new, "length",
                                 server.output_stream(p, skey, copy_q), now))

    # The window opens as a closed-loop trial's does: `warmup_s` after the first moment every
    # stream has a token (so a loop whose streams move in step is cut at the same phase as on a
    # served run), and closes `duration_s` later.
    w0: float | None = None
    w1 = math.inf
    now = 0.0
    inflight: set[SimRequest] = set()

    def send_tracked(t: float) -> None:
        send(t)
        inflight.add(engine.waiting[-1])

    for _ in range(load.concurrency):
        send_tracked(now)
    emitted_at_w0: int | None = None
    emitted_at_w1: int | None = None
    requests = 0
    while now < w1:
        planned = engine.plan_step(now)
        if planned is None:
            raise RuntimeError("virtual-time simulator: the engine went idle under a closed loop")
        decodes, prefills, dt = planned
        end = now + dt
        if w0 is not None and emitted_at_w0 is None and end > w0:
            emitted_at_w0 = engine.total_emitted  # the counter as the window opens, inside this step
        inside = w0 is not None and w0 < end <= w1
        metrics.ttft.on = metrics.itl.on = inside
        engine.emit_step(decodes, prefills, end)
        now = end
        if now <= w1:
            emitted_at_w1 = engine.total_emitted
        for req, _ in (*decodes, *prefills):
            if req.finish_reason is not None and req in inflight:
                inflight.discard(req)
                requests += inside
                send_tracked(now)
        if w0 is None and (all(r.emitted >= 1 for r in inflight) or now >= SETTLE_TIMEOUT_S):
            # never settling (fewer sequences allowed than streams) opens it anyway, as a trial does
            w0 = now + load.warmup_s
            w1 = w0 + load.duration_s
    e0 = emitted_at_w0 or 0
    e1 = emitted_at_w1 if emitted_at_w1 is not None else e0
    return StartFigures(tokps=(e1 - e0) / load.duration_s, ttft_s=metrics.ttft.values, itl_s=metrics.itl.values,
                        requests=requests, virtual_s=now)


def run_start(argv: list[str], load: LoadSpec, seed: int) -> StartFigures:
    """One server start of `argv` (sim serve flags, `--seed` replaced by `seed`) under `load`, in
    virtual time. Raises StartupFailure or SpecError as `sim serve` would refuse to start."""
    from truthput.sim.flags import parse_serve_args
    from truthput.sim.server import SimServer, make_pricer, resolve_setup

    cfg = parse_serve_args([*argv, "--seed", str(seed), "--disable-log-stats"])
    setup = resolve_setup(cfg)
    make_pricer(cfg, setup)
    server = SimServer(cfg, setup, pricer=make_pricer(cfg, setup, None))
    return _measure(server, load, seed)


def evaluate(config: dict) -> dict:
    """One configuration (a batch line) -> its figures, or its start-up failure, as a JSON dict."""
    import truthput.sim.flags  # noqa: F401  (imported before the clock starts: the first line's CPU is its own)
    from truthput.sim.server import StartupFailure

    load = LoadSpec(concurrency=int(config["concurrency"]), input_tokens=int(config.get("input_tokens", 256)),
                    output_tokens=int(config.get("output_tokens", 256)),
                    duration_s=float(config.get("duration_s", 30.0)), warmup_s=float(config.get("warmup_s", 5.0)))
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
    except SpecError as exc:
        out.update(ok=False, failure="invalid", reason=str(exc))
        return out
    ttft = [v for r in runs for v in r.ttft_s]
    itl = [v for r in runs for v in r.itl_s]
    out.update(
        ok=True,
        tokps=[r.tokps for r in runs],
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
