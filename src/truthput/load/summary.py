"""The short terminal summary of `truthput load`: counter throughput, token totals, client health.

Why these three: the server counter is the reference figure; the client's token total must equal
the counter's delta (every finished request counted), and the self-check says whether the client
could have distorted the figures (client-bound).
"""

from __future__ import annotations

from typing import Any

from truthput.load.drive import LoadOptions, LoadRun


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def summary_rows(run: LoadRun) -> list[dict[str, Any]]:
    """One dict per trial with the figures the table shows (also handy for tests and scripts)."""
    rows = []
    for o in run.outcomes:
        res = o.results
        gp = res.get("goodput", {})
        sc = (res.get("client") or {}).get("selfcheck") or {}
        counter = o.counter_tokens
        rows.append({
            "level": o.level, "mode": o.mode, "counter_tps": o.counter_tps,
            "requests": len(o.load.records), "failed": sum(1 for r in o.load.records if r.status != "ok"),
            "client_tokens": o.client_tokens, "counter_tokens": counter,
            "tokens_equal": counter is not None and int(round(counter)) == o.client_tokens,
            "goodput_rps": (gp.get("goodput_rps") or {}).get("value"),
            "good_fraction": (gp.get("good_fraction") or {}).get("value"),
            "client_bound": bool(sc.get("client_bound")), "client_reason": sc.get("reason"),
            "cpu_util": sc.get("cpu_util"), "lag_p99_ms": sc.get("loop_lag_p99_ms"),
        })
    return rows


def print_summary(run: LoadRun, opts: LoadOptions, store: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False)
    unit = "req/s" if opts.rate else "streams"
    t = Table(title=f"truthput load {opts.url}" + (f"  (run {run.run_id})" if run.run_id else ""))
    t.add_column(unit, justify="right")
    t.add_column("tok/s (server counter)", justify="right")
    t.add_column("requests (failed)", justify="right")
    t.add_column("tokens: client / counter", justify="right")
    if opts.slo.any:
        t.add_column("goodput req/s (good %)", justify="right")
    t.add_column("client", justify="left")
    for row in summary_rows(run):
        tokens = f"{row['client_tokens']} / {_f(row['counter_tokens'], '{:.0f}')}"
        tokens += " [green]equal[/green]" if row["tokens_equal"] else " [red]DIFFER[/red]"
        client = (f"[red]client-bound[/red]: {row['client_reason']}" if row["client_bound"]
                  else f"ok (CPU {_f(row['cpu_util'], '{:.2f}')} core, lag p99 {_f(row['lag_p99_ms'])} ms)")
        cells = [f"{row['level']:g}", _f(row["counter_tps"]), f"{row['requests']} ({row['failed']})", tokens]
        if opts.slo.any:
            gf = row["good_fraction"]
            cells.append(f"{_f(row['goodput_rps'], '{:.2f}')} ({_f(None if gf is None else 100 * gf, '{:.0f}')} %)")
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
    for o in run.outcomes:
        for n in o.results.get("client", {}).get("notes", []):
            con.print(f"[dim]{o.level:g} {unit}: {n}[/dim]")
        integ = o.results.get("integrity", {})
        if integ.get("holds") is False:
            con.print(f"[red]{o.level:g} {unit}: integrity {integ.get('message')}[/red]")
    if store:
        con.print(f"[dim]stored in {store}[/dim]")
