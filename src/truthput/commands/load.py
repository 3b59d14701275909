"""`truthput load URL`: load a running OpenAI-compatible endpoint, measured and stored like `run`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import typer

DIST_HELP = ("Tokens: N (fixed), uniform:LOW:HIGH, normal:MEAN:STD[:LOW:HIGH] or hist:V=W,V=W "
             "(histogram of lengths with weights).")


def parse_distribution(text: str, what: str) -> Any:
    """`256`, `uniform:100:900`, `normal:500:100[:1:2000]`, `hist:128=3,1024=1` -> Distribution."""
    from truthput.errors import InputError
    from truthput.load.workload import Distribution

    try:
        if text.isdigit():
            return Distribution("fixed", value=int(text))
        kind, _, rest = text.partition(":")
        parts = rest.split(":") if rest else []
        if kind == "uniform" and len(parts) == 2:
            return Distribution("uniform", low=int(parts[0]), high=int(parts[1]))
        if kind == "normal" and len(parts) in (2, 4):
            mean, std = float(parts[0]), float(parts[1])
            low, high = (int(parts[2]), int(parts[3])) if len(parts) == 4 else (1, max(1, int(mean + 6 * std)))
            return Distribution("normal", mean=mean, std=std, low=low, high=high)
        if kind in ("hist", "histogram") and rest:
            pairs = [p.split("=") for p in rest.split(",")]
            return Distribution("histogram", values=tuple(int(v) for v, _ in pairs),
                                weights=tuple(float(w) for _, w in pairs))
    except InputError as exc:
        raise InputError(f"--{what} {text!r}: {exc}") from None
    except ValueError:
        pass
    raise InputError(f"--{what} {text!r}: expected N, uniform:LOW:HIGH, normal:MEAN:STD[:LOW:HIGH] or hist:V=W,...")


def _numbers(text: str, what: str, cast: Callable[[str], Any]) -> list[Any]:
    from truthput.errors import InputError

    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--{what} {text!r}: expected a comma-separated list of numbers") from None


def load(
    url: str = typer.Argument(..., help="Base URL of a running OpenAI-compatible server, e.g. http://127.0.0.1:8000"),
    concurrency: str = typer.Option("1", "--concurrency", "-c", help="Closed-loop streams, a list: 1,8,32"),
    rate: Optional[str] = typer.Option(None, "--rate", help="Open loop: requests/s, a list: 2,4,8"),
    arrival: str = typer.Option("poisson", "--arrival", help="Open-loop arrivals: poisson or constant"),
    max_in_flight: Optional[int] = typer.Option(None, "--max-in-flight", help="Open loop: cap on open requests"),
    sweep: bool = typer.Option(False, "--sweep", help="Double the concurrency (or rate) until throughput stops rising"),
    sweep_max: float = typer.Option(512, "--sweep-max", help="Highest level a sweep tries"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", help="Requests per trial"),
    duration: Optional[float] = typer.Option(None, "--duration", help="Window seconds per trial"),
    input_tokens: str = typer.Option("128", "--input-tokens", help=DIST_HELP),
    output_tokens: str = typer.Option("128", "--output-tokens", help=DIST_HELP),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Generate exactly max_tokens"),
    endpoint: str = typer.Option("completions", "--endpoint", help="completions or chat"),
    temperature: Optional[float] = typer.Option(0.0, "--temperature"),
    top_p: Optional[float] = typer.Option(None, "--top-p"),
    seed: int = typer.Option(0, "--seed", help="Workload seed (and the sampling seed sent in the body)"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Same as --output-tokens N"),
    model: Optional[str] = typer.Option(None, "--model", help="Model id (default: the first of GET /v1/models)"),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="NAME of the env var holding the API key"),
    workload: str = typer.Option("synthetic", "--workload",
                                 help="synthetic | jsonl:PATH | sharegpt[:PATH] | shared-prefix | multi-turn | tool-call "
                                      "| trace:PATH (Mooncake, Azure, BurstGPT or your own timestamped JSONL, replayed "
                                      "at its recorded times)"),
    prefixes: int = typer.Option(4, "--prefixes", help="shared-prefix: number of shared prefixes"),
    suffixes: int = typer.Option(16, "--suffixes", help="shared-prefix: suffixes per prefix"),
    prefix_tokens: int = typer.Option(256, "--prefix-tokens", help="shared-prefix: tokens per prefix"),
    turns: int = typer.Option(3, "--turns", help="multi-turn: user turns per conversation"),
    speedup: float = typer.Option(1.0, "--speedup", help="trace:PATH: the recorded gaps divided by this"),
    max_gap: Optional[float] = typer.Option(None, "--max-gap", help="trace:PATH: each recorded gap at most this many s"),
    trace_start: float = typer.Option(0.0, "--trace-start", help="trace:PATH: replay from this many s into the trace"),
    trace_duration: Optional[float] = typer.Option(None, "--trace-duration",
                                                   help="trace:PATH: replay this many s of the trace's own time"),
    block_tokens: Optional[int] = typer.Option(None, "--block-tokens",
                                               help="trace:PATH: prompt tokens per hash id (Mooncake's: 512)"),
    cache: str = typer.Option("as-is", "--cache", help="The prefix cache at each window: as-is, warm (the workload's "
                              "shared text sent first) or reset (emptied before every window, and checked)"),
    thinking: Optional[str] = typer.Option(None, "--thinking", help="on|off: chat_template_kwargs.enable_thinking"),
    slo_ttft_ms: Optional[float] = typer.Option(None, "--slo-ttft-ms", help="Goodput target: time to first token"),
    slo_itl_ms: Optional[float] = typer.Option(None, "--slo-itl-ms", help="Goodput target: mean inter-token latency"),
    slo_e2e_ms: Optional[float] = typer.Option(None, "--slo-e2e-ms", help="Goodput target: end-to-end latency"),
    workers: int = typer.Option(1, "--workers", help="Load processes (when one core is not enough); with "
                                "--executor ray, load workers spread over the cluster's nodes"),
    executor: str = typer.Option("local", "--executor", help="local (load processes here) or ray (load "
                                 "workers on the nodes of a Ray cluster; pip install 'truthput[ray]')"),
    address: Optional[str] = typer.Option(None, "--address", help="With --executor ray: the cluster "
                                          "('auto', the default, or HOST:PORT)"),
    clock_skew: Optional[str] = typer.Option(None, "--inject-clock-skew", hidden=True,
                                             help="K:SECONDS: worker K reports times SECONDS off, as another "
                                                  "machine's clock would be (checks the offset recovery)"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="tokenizer.json (or its folder): exact prompt lengths"),
    engine: str = typer.Option("vllm", "--engine", help="Metric names to read: vllm, sglang, llamacpp"),
    sample_interval: float = typer.Option(0.5, "--sample-interval",
                                          help="Seconds between /metrics samples inside the window (0: none)"),
    store: Path = typer.Option(Path("truthput.db"), "--store", help="Results store (SQLite)"),
    no_store: bool = typer.Option(False, "--no-store", help="Do not store the run"),
    name: str = typer.Option("load", "--name", help="Run name in the store"),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON on stdout instead of the tables "
                                 "(tok/s, req/s, TTFT/TPOT/ITL/E2E mean and percentiles in ms, flags)"),
) -> None:
    """Load a running endpoint (closed loop, open loop or a sweep) and report the server-counted throughput."""
    from truthput.load.goodput import SLO
    from truthput.load.tokenizer import load_tokenizer

    opts = _options(url, concurrency, rate, arrival, max_in_flight, sweep, sweep_max, requests, duration, seed,
                    model, api_key_env, SLO(slo_ttft_ms, slo_itl_ms, slo_e2e_ms), workers, tokenizer, engine, name, sample_interval,
                    cache, _workload_spec(workload, input_tokens, output_tokens, max_tokens, ignore_eos, temperature, top_p,
                                   seed, endpoint, prefixes, suffixes, prefix_tokens, turns, thinking,
                                   (speedup, max_gap, trace_start, trace_duration, block_tokens)))
    spec = opts.workload
    tok = load_tokenizer(tokenizer)
    # Build one body now: a bad workload is a one-line error before any process starts.
    from truthput.load.workload import Workload

    Workload(spec, seed=seed, tokenizer=tok).body(0)
    db = None
    if not no_store:
        from truthput.store.db import Store

        db = Store(store)
    result = _drive(opts, db, tok, executor, workers, address, _cluster_options(executor, address, clock_skew))
    if as_json:
        print(result.summary.to_json(indent=2))
    else:
        from truthput.report.loadtable import print_summary

        print_summary(result.summary, store=None if no_store else str(store))
    _exit_if_nothing_measured(result)


def _drive(opts: Any, db: Any, tok: Any, executor: str, workers: int, address: str | None,
           skews: dict[int, float]) -> Any:
    """The load itself, on this machine's worker processes or a Ray cluster's; a stop signal or
    Ctrl-C ends it like an interrupted run (finished trials kept, exit 128 + signal)."""
    import asyncio

    from truthput.load.client import prepare_load_process
    from truthput.run.load import run_load

    pool: Any = None
    if executor == "ray":
        from truthput.cluster import import_ray

        import_ray()  # a missing extra is one line before anything starts
    elif workers > 1:
        from truthput.load.workers import WorkerPool

        pool = WorkerPool(opts.client_config(), workers).start()  # forked before the event loop
    prepare_load_process()
    from truthput.report.console import make_console

    err = make_console(stderr=True, highlight=False)
    results: list[Any] = []
    received: list[int] = []

    async def main() -> None:
        from truthput.commandline import stop_signals, stop_task

        loop = asyncio.get_running_loop()
        for sig in stop_signals():  # SIGTERM / SIGHUP end the load like Ctrl-C: finished trials kept
            loop.add_signal_handler(sig, stop_task, asyncio.current_task(), sig, received)
        # The result leaves through a list, not as the task's result: on exit asyncio.run
        # restores the SIGINT handler, and CPython's signal module then formats a repr of the
        # handler, whose partial holds the main task, whose repr includes its result: every
        # chunk of every record (0.2 CPU-s for 164k chunks, measured). A None result costs nothing.
        nonlocal pool
        if executor == "ray":
            from truthput.load.cluster import RayLoadPool

            pool = await RayLoadPool(opts.client_config(), workers, address, skews).start()
            for line in pool.notes():
                err.print(line, markup=False)
        results.append(await run_load(opts, db, pool, progress=lambda m: err.print(m), tokenizer=tok))

    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        asyncio.run(main())
        result = results[0]
    except (KeyboardInterrupt, asyncio.CancelledError):
        why = f"stopped by {signal.Signals(received[0]).name}" if received and received[0] != signal.SIGINT \
            else "interrupted"
        typer.echo(f"truthput: {why}; finished trials are kept in the store", err=True)
        raise typer.Exit(128 + received[0] if received else 130)
    finally:
        if pool is not None:
            pool.close()
    return result


def _workload_spec(workload: str, input_tokens: str, output_tokens: str, max_tokens: int | None,
                   ignore_eos: bool, temperature: float | None, top_p: float | None, seed: int, endpoint: str,
                   prefixes: Any, suffixes: Any, prefix_tokens: Any, turns: Any, thinking: str | None,
                   trace: tuple[Any, ...] = (1.0, None, 0.0, None, None)) -> Any:
    """The request shape the options describe, checked (a bad one is one line, before any start)."""
    from truthput.errors import InputError
    from truthput.load.trace import TraceOptions
    from truthput.load.workload import WorkloadSpec

    if endpoint not in ("completions", "chat"):
        raise InputError(f"--endpoint {endpoint!r}: expected completions or chat")
    if thinking not in (None, "on", "off"):
        raise InputError(f"--thinking {thinking!r}: expected on or off")
    source = workload[len("jsonl:"):] if workload.startswith("jsonl:") else workload
    if workload.startswith("jsonl:") and not source:
        raise InputError("--workload jsonl:PATH: the path is missing")
    return WorkloadSpec(
        input_tokens=parse_distribution(input_tokens, "input-tokens"),
        output_tokens=parse_distribution(str(max_tokens) if max_tokens else output_tokens, "output-tokens"),
        ignore_eos=ignore_eos, temperature=temperature, top_p=top_p, seed=seed, prompt_source=source,
        endpoint=endpoint, prefixes=prefixes, suffixes=suffixes, prefix_tokens=prefix_tokens, turns=turns,
        thinking=None if thinking is None else thinking == "on",
        trace=TraceOptions(*trace) if source.startswith("trace:") else None,
    )


def _options(url: str, concurrency: str, rate: str | None, arrival: str, max_in_flight: int | None, sweep: bool,
             sweep_max: Any, requests: int | None, duration: float | None, seed: int, model: str | None,
             api_key_env: str | None, slo: Any, workers: int,
             tokenizer: str | None, engine: str, name: str, sample_interval: float, cache: str, spec: Any) -> Any:
    from truthput.run.load import LoadOptions

    return LoadOptions(
        url=url, concurrency=_numbers(concurrency, "concurrency", int),
        rate=_numbers(rate, "rate", float) if rate else [], arrival=arrival, max_in_flight=max_in_flight,
        sweep=sweep, sweep_max=sweep_max, requests=requests, duration_s=duration, workload=spec, seed=seed,
        model=model, api_key_env=api_key_env, slo=slo, workers=workers,
        tokenizer_path=tokenizer, engine=engine, name=name, sample_interval_s=sample_interval, cache=cache,
    )


def _cluster_options(executor: str, address: str | None, clock_skew: str | None) -> dict[int, float]:
    """--executor, --address and --inject-clock-skew checked together; the injected skews."""
    from truthput.errors import InputError

    if executor not in ("local", "ray"):
        raise InputError(f"--executor {executor!r}: expected 'local' or 'ray'")
    if executor == "local" and (address or clock_skew):
        raise InputError("--address and --inject-clock-skew are for --executor ray")
    skews: dict[int, float] = {}
    if clock_skew:
        k_text, _, secs = clock_skew.partition(":")
        try:
            skews[int(k_text)] = float(secs)
        except ValueError:
            raise InputError(f"--inject-clock-skew {clock_skew!r}: expected WORKER:SECONDS") from None
    return skews


def _exit_if_nothing_measured(result: Any) -> None:
    """Exit 1 when no request succeeded: a load that measured nothing is not a success; exit 4
    when requests succeeded but a level has no tok/s from any source (the measurement could not
    be made: no counter, no usage)."""
    records = [r for o in result.outcomes for r in o.trial.load.records]
    if not records or all(r.status != "ok" for r in records):
        last = next((r.error for r in reversed(records) if r.error), "no request was made")
        typer.echo(f"truthput: every request failed ({len(records)} requests); last: {last}", err=True)
        raise typer.Exit(1)
    missing = [(o.level, o.trial.results.headline()) for o in result.outcomes]
    missing = [(level, fig) for level, fig in missing if fig.value is None]
    if missing:
        level, fig = missing[0]
        typer.echo(f"truthput: no tok/s figure at level {level:g} ({len(missing)} of {len(result.outcomes)} "
                   f"trial(s)): {fig.note}", err=True)
        raise typer.Exit(4)


def register(app: typer.Typer) -> None:
    app.command()(load)
