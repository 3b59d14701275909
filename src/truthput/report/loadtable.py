"""The short terminal summary of `truthput load`: counter throughput, token totals, client health.

Why these three: the server counter is the reference figure; the client's token total must equal
the counter's delta (every finished request counted), and the self-check says whether the client
could have distorted the figures (client-bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from truthput.pipeline.load import LoadOptions, LoadRun


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


@dataclass(frozen=True)
class LoadRow:
    """One `load` trial as its table shows it."""

    level: float
    mode: str
    counter_tps: float | None
    headline_tps: float | None
    headline_source: str
    simulated: bool
    flags: list[str]
    per_stream_flags: list[str]
    counter_set_aside: list[str]
    status: str
    error: str | None
    requests: int
    failed: int
    client_tokens: int
    counter_tokens: float | None
    tokens_equal: bool
    goodput_rps: float | None
    good_fraction: float | None
    client_bound: bool
    client_reason: str | None
    cpu_util: float | None
    lag_p99_ms: float | None


def summary_rows(run: LoadRun) -> list[LoadRow]:
    """One row per trial with the figures the table shows (also handy for tests and scripts)."""
    from truthput.analyze.cells import headline

    rows = []
    for o in run.outcomes:
        res = o.results
        gp = res.goodput
        sc = res.client.selfcheck
        counter = o.counter_tokens
        h = headline(res)
        rows.append(LoadRow(
            level=o.level, mode=o.mode, counter_tps=o.counter_tps,
            headline_tps=h.number(), headline_source=h.source, simulated=res.simulated,
            flags=[f"{f.code}: {f.reason}" for f in h.flags],
            per_stream_flags=[f"{f.code}: {f.reason}" for f in res.per_stream.decode_tps_median.flags],
            counter_set_aside=[f"{f.code}: {f.reason}" for f in res.throughput.counter_window.flags]
            if h is not res.throughput.counter_window else [],
            status=o.trial.status, error=o.trial.error,
            requests=len(o.load.records), failed=sum(1 for r in o.load.records if r.status != "ok"),
            client_tokens=o.client_tokens, counter_tokens=counter,
            tokens_equal=counter is not None and int(round(counter)) == o.client_tokens,
            goodput_rps=gp.goodput_rps.number() if gp is not None and gp.goodput_rps is not None else None,
            good_fraction=gp.good_fraction.number() if gp is not None and gp.good_fraction is not None else None,
            client_bound=bool(sc and sc.client_bound), client_reason=sc.reason if sc else None,
            cpu_util=sc.cpu_util if sc else None, lag_p99_ms=sc.loop_lag_p99_ms if sc else None,
        ))
    return rows


def print_summary(run: LoadRun, opts: LoadOptions, store: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from truthput.analyze.cells import source_label

    con = Console(highlight=False)
    unit = "req/s" if opts.rate else "streams"
    tag = ", simulated" if run.simulated else ""
    if run.simulated:
        con.print("[bold yellow]SIMULATED[/bold yellow]: the server is the truthput simulator (a physics model); "
                  "no figure below is a measurement of real hardware.")
    t = Table(title=Text(f"truthput load {opts.url}" + (f"  (run {run.run_id})" if run.run_id else "")))
    t.add_column(unit, justify="right")
    t.add_column(Text(f"tok/s\n[server counter{tag}]"), justify="right")
    t.add_column("requests (failed)", justify="right")
    t.add_column("tokens: client / counter", justify="right")
    if opts.slo.any:
        t.add_column("goodput req/s (good %)", justify="right")
    t.add_column("client", justify="left")
    for row in summary_rows(run):
        tokens = f"{row.client_tokens} / {_f(row.counter_tokens, '{:.0f}')}"
        tokens += " [green]equal[/green]" if row.tokens_equal else " [red]DIFFER[/red]"
        client = (f"[red]client-bound[/red]: {row.client_reason}" if row.client_bound
                  else f"ok (CPU {_f(row.cpu_util, '{:.2f}')} core, lag p99 {_f(row.lag_p99_ms)} ms)")
        tps = Text(_f(row.headline_tps))
        if row.headline_tps is not None and row.headline_source != "server_counter":
            tps.append(f" [{source_label(row.headline_source)}]", style="yellow")
        if row.flags:
            tps.append(" !" + ",".join(dict.fromkeys(f.split(":", 1)[0] for f in row.flags)), style="bold red")
        cells: list[str | Text] = [f"{row.level:g}", tps, f"{row.requests} ({row.failed})", tokens]
        if opts.slo.any:
            gf = row.good_fraction
            cells.append(f"{_f(row.goodput_rps, '{:.2f}')} ({_f(None if gf is None else 100 * gf, '{:.0f}')} %)")
        cells.append(client)
        t.add_row(*cells)
    con.print(t)
    if run.sweep is not None:
        sat = run.sweep.saturation()
        if sat is None:
            con.print("sweep: no level gave a counter figure")
        else:
            state = "throughput stopped rising" if run.sweep.saturated else "still rising at the last level tried"
            con.print(f"sweep: saturation point {sat.level:g} {unit} at {_f(sat.throughput)} tok/s ({state}; "
                      f"lowest level within {run.sweep.tolerance:.0%} of the best)")
    for row in summary_rows(run):
        for f in row.flags:
            con.print(Text("! flagged", style="bold red") + Text(f" {row.level:g} {unit}: tok/s: {f}"))
        for f in row.per_stream_flags:
            con.print(Text("! flagged", style="bold red") + Text(f" {row.level:g} {unit}: per stream: {f}"))
        for f in row.counter_set_aside:
            con.print(Text(f"{row.level:g} {unit}: counter set aside for usage placed in time: {f}", style="yellow"))
    for o in run.outcomes:
        for n in o.results.client.notes:
            con.print(Text(f"{o.level:g} {unit}: {n}", style="dim"))
        integ = o.results.integrity
        if integ.holds is False:
            con.print(Text(f"{o.level:g} {unit}: integrity {integ.message}", style="red"))
        if o.trial.status != "ok":
            con.print(Text(f"{o.level:g} {unit}: trial failed: {o.trial.error}", style="red"))
    if store:
        con.print(f"[dim]stored in {store}[/dim]")
