"""The terminal summary of `truthput load` (and its `--json`): throughput, rates, latency
percentiles, token totals, client health.

Why these: the server counter is the reference figure; req/s, prompt tok/s and the TTFT/TPOT/ITL/E2E
percentiles are what a `vllm bench serve` user reads; the client's token total must equal the
counter's delta (every finished request counted), and the self-check says whether the client
could have distorted the figures (client-bound).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from truthput.analyze.loadrows import LATENCY_METRICS, LATENCY_STATS, TrialFlags

if TYPE_CHECKING:
    from truthput.run.load import LoadOptions, LoadRun


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_summary(run: LoadRun, opts: LoadOptions, store: str | None = None) -> None:
    from rich.table import Table
    from rich.text import Text

    from truthput.analyze.cells import source_label
    from truthput.report.terminal import fit_numbers, make_console

    con = make_console(highlight=False)
    unit = "req/s" if opts.rate else "streams"
    tag = ", simulated" if run.simulated else ""
    if run.simulated:
        con.print("[bold yellow]SIMULATED[/bold yellow]: the server is the truthput simulator (a physics model); "
                  "no figure below is a measurement of real hardware.")
    from truthput.analyze.cells import headline_basis

    rows = run.rows()
    basis = headline_basis(r.headline_source for r in rows if r.headline_tps is not None)
    t = Table(title=Text(f"truthput load {opts.url}" + (f"  (run {run.run_id})" if run.run_id else "")))
    t.add_column(unit, justify="right")
    t.add_column(Text(f"output tok/s\n[{basis.label}{tag}]"), justify="right")
    t.add_column("req/s", justify="right")
    t.add_column("total tok/s\n(+ prompt)", justify="right")
    t.add_column("requests\n(failed)", justify="right")
    t.add_column("tokens:\nclient / counter", justify="right", no_wrap=True)
    if opts.slo.any:
        t.add_column("goodput req/s\n(good %)", justify="right")
    t.add_column("client", justify="left")
    cells_by_row: list[list[Any]] = []
    for row in rows:
        client_tokens = "-" if row.client_tokens is None else str(row.client_tokens)
        tokens = f"{client_tokens} / {_f(row.counter_tokens, '{:.0f}')}"
        if row.tokens_equal:
            tokens += " [green]equal[/green]"
        elif row.counter_tokens is not None and row.client_tokens is not None:
            tokens += " [red]DIFFER[/red]"
        client = "[red]client-bound[/red]" if row.client_bound else "ok"
        tps = Text(_f(row.headline_tps))
        if row.headline_tps is not None and basis.marks(row.headline_source):
            tps.append(f" [{source_label(row.headline_source)}]", style="yellow")
        if row.flags:
            tps.append(" !" + ",".join(dict.fromkeys(f.split(":", 1)[0] for f in row.flags)), style="bold red")
        cells: list[str | Text] = [f"{row.level:g}", tps, _f(row.requests_per_s, "{:.2f}"), _f(row.total_tps),
                                   f"{row.requests} ({row.failed})", tokens]
        if opts.slo.any:
            gf = row.good_fraction
            cells.append(f"{_f(row.goodput_rps, '{:.2f}')} ({_f(None if gf is None else 100 * gf, '{:.0f}')} %)")
        cells.append(client)
        cells_by_row.append(cells)
    con.print(fit_numbers(t, cells_by_row, con.width))
    lat = Table(title="latency, ms (client clock; TPOT and ITL per token, not per chunk)")
    lat.add_column(unit, justify="right")
    lat.add_column("")
    for q in LATENCY_STATS:
        lat.add_column(q, justify="right")
    for row in rows:
        for i, m in enumerate(LATENCY_METRICS):
            lat.add_row(f"{row.level:g}" if i == 0 else "", m.upper(),
                        *[_f(row.latency_ms[m][q], "{:.2f}") for q in LATENCY_STATS],
                        end_section=i == len(LATENCY_METRICS) - 1)
    con.print(lat)  # short figures in short columns: fits 80 columns as it is
    for row in rows:
        for m, why in row.latency_missing.items():
            con.print(Text(f"{row.level:g} {unit}: no {m.upper()} figures: {why}", style="yellow"))
    for row in rows:
        if row.client_bound:
            con.print(Text(f"{row.level:g} {unit}: client-bound: {row.client_reason}", style="red"))
        else:
            con.print(Text(f"{row.level:g} {unit}: client ok (CPU {_f(row.cpu_util, '{:.2f}')} core, event-loop lag "
                           f"p99 {_f(row.lag_p99_ms)} ms)", style="dim"))
        if row.counter_missing:
            con.print(Text(f"{row.level:g} {unit}: no server counter figure: {row.counter_missing}", style="yellow"))
        if row.client_tokens is None:
            con.print(Text(f"{row.level:g} {unit}: the server sent no usage counts: client tokens unknown", style="yellow"))
    if run.sweep is not None:
        sat = run.sweep.saturation()
        if sat is None:
            con.print("sweep: no level gave a counter figure")
        else:
            state = "throughput stopped rising" if run.sweep.saturated else "still rising at the last level tried"
            con.print(f"sweep: saturation point {sat.level:g} {unit} at {_f(sat.throughput)} tok/s ({state}; "
                      f"lowest level within {run.sweep.tolerance:.0%} of the best)")
    for row in rows:
        print_trial_flags(con, f"{row.level:g} {unit}",
                          TrialFlags(row.flags, row.per_stream_flags, row.counter_set_aside, row.warnings))
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


def print_trial_flags(con: Any, label: str, said: TrialFlags) -> None:
    """Why a load trial's figures are flagged, which counter was set aside and why, and what else
    the trial saw: the lines `load` prints under its table and `report` under a stored load run's."""
    from rich.text import Text

    for f in said.headline:
        con.print(Text("! flagged", style="bold red") + Text(f" {label}: tok/s: {f}"))
    for f in said.per_stream:
        con.print(Text("! flagged", style="bold red") + Text(f" {label}: per stream: {f}"))
    for f in said.counter_set_aside:
        con.print(Text(f"{label}: counter set aside for usage placed in time: {f}", style="yellow"))
    for w in said.warnings:
        con.print(Text(f"{label}: {w}", style="yellow"))


def summary_json(run: LoadRun, opts: LoadOptions) -> dict[str, Any]:
    """`truthput load --json`: the rows the table prints, every figure with its unit in the key."""
    doc: dict[str, Any] = {"url": opts.url, "run_id": run.run_id, "simulated": run.simulated,
                           "unit": "req/s" if opts.rate else "streams",
                           "levels": [row.as_json() for row in run.rows()]}
    if run.sweep is not None:
        sat = run.sweep.saturation()
        doc["sweep"] = {"saturation_level": sat.level if sat else None,
                        "saturation_tps": sat.throughput if sat else None, "saturated": run.sweep.saturated}
    return doc
