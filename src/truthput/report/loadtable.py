"""The terminal summary of `truthput load` (and its `--json`): throughput, rates, latency
percentiles, token totals, client health.

Why these: the server counter is the reference figure; req/s, prompt tok/s and the TTFT/TPOT/ITL/E2E
percentiles are what a `vllm bench serve` user reads; the client's token total must equal the
counter's delta (every finished request counted), and the self-check says whether the client
could have distorted the figures (client-bound).
"""

from __future__ import annotations

from typing import Any

from truthput.analyze.loadrows import LATENCY_METRICS, LATENCY_STATS, LoadRow, LoadSummary, TrialFlags
from truthput.report.console import fit_numbers, make_console


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_summary(summary: LoadSummary, store: str | None = None, con: Any = None, title: str | None = None) -> None:
    """A load run's tables and lines: `truthput load` as it ends, and `truthput report` of the stored run."""
    from rich.text import Text

    con = con or make_console(highlight=False)
    if summary.simulated:
        con.print("[bold yellow]SIMULATED[/bold yellow]: the server is the truthput simulator (a physics model); "
                  "no figure below is a measurement of real hardware.")
    if not summary.levels:  # nothing measured: say so, not an empty table
        con.print(Text(f"{title or 'truthput load ' + summary.url}: no level was measured (the load ended before its "
                       "first trial finished: see the error the command printed)", style="bold red"))
        return
    for said in summary.before_load:
        con.print(Text(f"before the load: {said}", style="yellow"))
    _print_throughput(con, summary, title)
    _print_latency(con, summary)
    for row in summary.levels:
        _print_row_lines(con, row, f"{row.level:g} {summary.unit}")
    if summary.sweep is not None:
        sw = summary.sweep
        if sw.saturation_level is None:
            con.print("sweep: no level gave a counter figure")
        else:
            state = "throughput stopped rising" if sw.saturated else "still rising at the last level tried"
            con.print(f"sweep: saturation point {sw.saturation_level:g} {summary.unit} at {_f(sw.saturation_tps)} "
                      f"tok/s ({state}; lowest level within {sw.tolerance:.0%} of the best)")
    for row in summary.levels:
        where = f"{row.level:g} {summary.unit}"
        print_trial_flags(con, where, row.said)
        for n in row.client_notes:
            con.print(Text(f"{where}: {n}", style="dim"))
        if row.integrity:
            con.print(Text(f"{where}: integrity {row.integrity}", style="red"))
        if row.status != "ok":
            con.print(Text(f"{where}: trial failed: {row.error}", style="red"))
    if store:
        con.print(f"[dim]stored in {store}[/dim]")


def _print_throughput(con: Any, summary: LoadSummary, title: str | None) -> None:
    from rich.table import Table
    from rich.text import Text

    from truthput.analyze.cells import headline_basis, source_label

    rows = summary.levels
    tag = ", simulated" if summary.simulated else ""
    basis = headline_basis(r.headline_source for r in rows if r.headline_tps is not None)
    t = Table(title=Text(title or f"truthput load {summary.url}" + (f"  (run {summary.run_id})" if summary.run_id
                                                                     else "")))
    t.add_column(summary.unit, justify="right")
    t.add_column(Text(f"output tok/s\n[{basis.label}{tag}]"), justify="right")
    t.add_column("req/s", justify="right")
    t.add_column("total tok/s\n(+ prompt)", justify="right")
    t.add_column("requests\n(failed)", justify="right")
    t.add_column("tokens:\nclient / counter", justify="right", no_wrap=True)
    if summary.goodput:
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
        tps = Text(_f(row.headline_tps))
        if row.headline_tps is not None and basis.marks(row.headline_source):
            tps.append(f" [{source_label(row.headline_source)}]", style="yellow")
        if row.flags:
            tps.append(" !" + ",".join(dict.fromkeys(f.code for f in row.flags)), style="bold red")
        cells: list[str | Text] = [f"{row.level:g}", tps, _f(row.requests_per_s, "{:.2f}"), _f(row.total_tps),
                                   f"{row.requests} ({row.failed})", tokens]
        if summary.goodput:
            gf = row.good_fraction
            cells.append(f"{_f(row.goodput_rps, '{:.2f}')} ({_f(None if gf is None else 100 * gf, '{:.0f}')} %)")
        cells.append("[red]client-bound[/red]" if row.client_bound else "ok")
        cells_by_row.append(cells)
    con.print(fit_numbers(t, cells_by_row, con.width))


def _print_latency(con: Any, summary: LoadSummary) -> None:
    from rich.table import Table

    lat = Table(title="latency, ms (client clock; TPOT and ITL per token, not per chunk)")
    lat.add_column(summary.unit, justify="right")
    lat.add_column("")
    for q in LATENCY_STATS:
        lat.add_column(q, justify="right")
    for row in summary.levels:
        for i, m in enumerate(LATENCY_METRICS):
            lat.add_row(f"{row.level:g}" if i == 0 else "", m.upper(),
                        *[_f(row.latency_ms.get(m, {}).get(q), "{:.2f}") for q in LATENCY_STATS],
                        end_section=i == len(LATENCY_METRICS) - 1)
    con.print(lat)  # short figures in short columns: fits 80 columns as it is


def _print_row_lines(con: Any, row: LoadRow, where: str) -> None:
    """A level's lines under the tables: missing figures, the client's health, cache, replay, speculation."""
    from rich.text import Text

    for m, why in row.latency_missing.items():
        con.print(Text(f"{where}: no {m.upper()} figures: {why}", style="yellow"))
    if row.client_bound:
        con.print(Text(f"{where}: client-bound: {row.client_reason}", style="red"))
    else:
        con.print(Text(f"{where}: client ok (CPU {_f(row.cpu_util, '{:.2f}')} core, event-loop lag "
                       f"p99 {_f(row.lag_p99_ms)} ms)", style="dim"))
    if row.counter_missing and row.counter_tps is not None:
        con.print(Text(f"{where}: the server counter's total over the load (its first to its last scrape) is "
                       f"missing, so truthput's own tokens are not checked against it: {row.counter_missing}",
                       style="yellow"))
    elif row.counter_missing:
        con.print(Text(f"{where}: no server counter figure: {row.counter_missing}", style="yellow"))
    if row.client_tokens is None:
        con.print(Text(f"{where}: the server sent no usage counts: client tokens unknown", style="yellow"))
    if row.prefix_cache is not None and row.prefix_cache.value is not None:
        con.print(Text(f"{where}: prefix cache [server counter]: {100 * row.prefix_cache.value:.0f}% of the "
                       f"prompt tokens looked up were cached ({row.prefix_cache.note})", style="dim"))
    if (r := row.replay) is not None:
        con.print(Text(f"{where}: trace replay [client clock]: {r.sent} of {r.scheduled} requests sent, "
                       f"late p50 {_f(r.lateness_p50_ms)} / p99 {_f(r.lateness_p99_ms)} / max "
                       f"{_f(r.lateness_max_ms)} ms; {_f(r.achieved_rate, '{:.2f}')} req/s of the "
                       f"{_f(r.requested_rate, '{:.2f}')} scheduled", style="dim"))
    if row.acceptance is not None and row.acceptance.value is not None:
        length = row.acceptance_length.value if row.acceptance_length is not None else None
        con.print(Text(f"{where}: speculation [server counter]: {100 * row.acceptance.value:.0f}% of the drafted "
                       f"tokens accepted, {_f(length, '{:.2f}')} tokens a step", style="dim"))


def print_trial_flags(con: Any, label: str, said: TrialFlags) -> None:
    """Why a load trial's figures are flagged, which counter was set aside and why, and what else
    the trial saw."""
    from rich.text import Text

    for f in said.headline:
        con.print(Text("! flagged", style="bold red") + Text(f" {label}: tok/s: {f.code}: {f.reason}"))
    for f in said.per_stream:
        con.print(Text("! flagged", style="bold red") + Text(f" {label}: per stream: {f.code}: {f.reason}"))
    for f in said.counter_set_aside:
        con.print(Text(f"{label}: counter set aside for usage placed in time: {f.code}: {f.reason}", style="yellow"))
    for w in said.warnings:
        con.print(Text(f"{label}: {w}", style="yellow"))
