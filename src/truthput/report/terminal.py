"""One clear terminal summary of a run (like hyperfine's): a table per variant x concurrency, the
verdict, failures, and warnings. Every column names its source; a simulated run says so on every figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from truthput.text import capped, percent
from truthput.experiment.levels import level_cell, level_header, level_label
from truthput.report.console import NARROW, fit_numbers, make_console
from truthput.store.db import Store

if TYPE_CHECKING:
    from truthput.analyze.tables import CellRow
    from truthput.analyze.summary import RunSummary
    from truthput.analyze.audit import Audit, AuditEntry


class HasCode(Protocol):
    """A validity flag as the views mark it (a figure's `Flag`, a cell's `CellFlag`)."""

    @property
    def code(self) -> str: ...


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None or x != x else fmt.format(x)


def interval_text(lo: float | None, hi: float | None, fmt: str = "{:.1f}") -> str:
    """' (lo..hi)' when both bounds are numbers, else ''."""
    if lo is None or hi is None or lo != lo or hi != hi:
        return ""

    def one(x: float) -> str:
        return capped(x, fmt) if "+" in fmt else fmt.format(x)  # a signed format is a percentage
    return f" ({one(lo)}..{one(hi)})"


def delta_text(c: CellRow) -> str:
    """A cell's comparison with the baseline, as the verdict decided it: '+12.3% (+5.0..+20.1)'."""
    d = c.delta_pct
    if c.baseline or d is None or d.value is None:
        return "baseline" if c.baseline else "-"
    return percent(d.value) + interval_text(d.lo, d.hi, "{:+.1f}")


def flag_mark(flags: Sequence[HasCode]) -> str:
    """' !code,code' after a flagged figure (the reasons are printed below the table)."""
    return (" !" + ",".join(dict.fromkeys(f.code for f in flags))) if flags else ""


def print_run(store: Store, run_id: str, console: Any = None, verbose: bool = False,
              summary: RunSummary | None = None) -> None:
    """The run's table, then the verdict: each level's decision first, then each comparison; how the
    data looked (noise, pooling, drift) only with `verbose`. `summary`: the run's, where the caller
    has it (else recomputed from the stored trials)."""
    from rich.table import Table
    from rich.text import Text

    from truthput.analyze.cells import source_label
    from truthput.analyze.tables import cell_rows
    from truthput.report.columns import CELL_FIGURES, FigureColumn
    from truthput.report.data import run_summary

    con = console or make_console()
    run_id = store.resolve_run(run_id)
    run = store.run(run_id)
    sim = bool(run.simulated)
    # a narrow terminal's headers leave the tag to the SIMULATED line above the table
    tag = ", simulated" if sim and con.width >= NARROW else ""
    if run.is_load:  # load's own view, which says SIMULATED itself
        _print_load_run(store, run_id, run.status, con)
        return
    if sim:
        con.print("[bold yellow]SIMULATED[/bold yellow]: every figure below comes from the embedded simulator "
                  "(a physics model), not from a measurement of real hardware.")
    summary = summary or run_summary(store, run_id)
    rows = cell_rows(summary, sim)
    nothing = summary.measured_nothing()
    if nothing is not None:
        con.print(Text(f"run {run_id} ({run.status}): " + nothing[0], style="bold red"))
        for line in nothing[1:]:
            con.print(Text(line))
        return
    level = f"{summary.verdict.confidence:.0%}"
    basis = summary.headline_basis()

    def tokps(c: CellRow) -> Text:
        if not c.ok or c.tokps is None:
            return Text(c.status, style="red")
        out = Text(_f(c.tokps.value))
        if basis.marks(c.tokps.provenance):
            out.append(f" [{source_label(c.tokps.provenance)}]", style="yellow")
        out.append(interval_text(c.tokps.lo, c.tokps.hi))
        return out + Text(flag_mark(c.tokps.flags or []), style="bold red")

    def figures(col: FigureColumn) -> Callable[[CellRow], Text]:
        return lambda c: Text(col.text(c)) + Text(flag_mark(col.flags(c)), style="bold red")

    columns: list[tuple[Any, Callable[[CellRow], Any]]] = [
        ("variant", lambda c: c.variant + (" *" if c.baseline else "")),
        (level_header(c.key for c in rows), lambda c: level_cell(c.key)),
        (Text(f"output tok/s (95% CI)\n[{basis.label}{tag}]"), tokps),
        *((Text(f"{col.header}\n[{col.source}{tag}]"), figures(col))
          for col in (c.for_terminal() for c in CELL_FIGURES) if col.terminal == "column"),
        (Text(f"vs baseline\n({level} CI, as the verdict)\n[ratio of headline figures]"), delta_text),
        ("starts x trials", lambda c: "-" if not c.n_starts else f"{c.n_starts} x {(c.n_trials or 0) / c.n_starts:g}"),
    ]
    t = Table(title=Text(f"run {run_id} ({run.status})"))
    for header, _render in columns:
        t.add_column(header, justify="left" if header in ("variant", "starts x trials") else "right",
                     no_wrap=header == "variant")  # a name and its baseline mark stay on one line
    con.print(fit_numbers(t, [[render(c) for _h, render in columns] for c in rows], con.width))
    for col in CELL_FIGURES:  # a line under the table where it has no room for the column
        said = [f"{c.variant} {level_label(c.key)} {col.text(c)}" for c in rows if col.shown(c)]
        if col.terminal == "line" and said:
            shares = _workload_shares(store, run_id) if "prefix_cache_hit_rate" in col.keys else None
            con.print(Text(f"{col.header} [{col.source}{tag}]: " + ", ".join(said)
                           + (f" (the workload shares by design: {shares})" if shares else ""), style="dim"))
    for line in summary.flag_lines():
        con.print(Text("! flagged", style="bold red") + Text(f" {line}"))
    noisy = [(c.variant, c.label, w) for c in summary.cells for w in c.noise]
    for v, label, w in noisy[:8]:
        con.print(Text("noise", style="yellow") + Text(f" {v} {label}: {w}"))
    con.print(f"* baseline. Output tok/s = {basis.definition}. Per-stream rates leave out TTFT and the gaps "
              "between requests, so at c=1 a per-stream rate can exceed the aggregate.")
    verdict = summary.verdict
    if verdict.per_concurrency or verdict.decision_lines():
        con.print("[bold]Verdict[/bold]")
        for line in verdict.decision_lines():
            con.print(Text(f"  {line}", style="bold"))
        for line in verdict.comparison_lines():
            con.print(Text(f"    {line}"))
        diagnostics = verdict.diagnostic_lines()
        if verbose:
            for line in diagnostics:
                con.print(Text(f"  {line}", style="dim"))
        elif diagnostics:
            con.print(Text(f"  ({len(diagnostics)} lines on how the data looked: noise, pooling, drift; "
                           "--verbose shows them, and the report's method section has them)", style="dim"))
    stopping = summary.stopping
    if stopping:
        used = stopping.starts_used
        fixed = stopping.fixed_design_starts
        line = f"stopping rule ({stopping.method} alpha spending): " + (
            f"{used} server starts per variant" if used is not None else "stopped before any comparison")
        if fixed:
            line += f"; a fixed design would have needed {fixed} for the same precision"
        con.print(Text(line))
    for w in summary.warnings():
        con.print(Text("warning", style="yellow") + Text(f": {w}"))


def _print_load_run(store: Store, run_id: str, status: str, con: Any) -> None:
    """A `truthput load` run: what `load` printed, from the summary it stored (a run stored before
    load summaries had one: its rows rebuilt from its trials); no variants, so no verdict."""
    from truthput.report.data import load_summary_of
    from truthput.report.loadtable import print_summary

    print_summary(load_summary_of(store, run_id), con=con,
                  title=f"run {run_id} ({status}): truthput load of a running server")
    con.print("a load run measures one server at each level: nothing is compared, so there is no verdict "
              "(truthput run compares configurations)")


def print_audit_matrix(audit: Audit, console: Any = None) -> None:
    """The audit in one table: each counting method's error vs the cell's headline, per cell.

    Rows are methods, columns are variant@concurrency, each cell its error and its own cause
    (causes differ between cells: a method can agree in one and be off by a window in another).
    `truthput audit RUN_ID` prints the long form with tok/s and notes.
    """
    from rich.table import Table
    from rich.text import Text

    con = console or make_console()
    rows, sim = audit.rows, audit.simulated
    if not rows:
        return
    cells = list(dict.fromkeys((r.variant, r.key) for r in rows))
    methods: list[str] = list(dict.fromkeys(r.method for r in rows))
    by = {(r.method, r.variant, r.key): r for r in rows}
    t = Table(title=f"Audit: every counting method vs {audit.against} (error %, cause)"
              + (", simulated" if sim else ""))
    t.add_column("method")
    for v, c in cells:
        t.add_column(Text(f"{v}\n{level_label(c)}"), justify="right")
    table_rows: list[list[Any]] = []
    for m in methods:
        vals = []
        for v, c in cells:
            r = by.get((m, v, c))
            if r is None:
                vals.append("-")
                continue
            if r.cause == "reference":
                text = "ref"
            elif r.error_pct_vs_counter is None:
                text = "missing"
            else:
                text = f"{percent(r.error_pct_vs_counter)} {r.cause}"
            vals.append(text + (" !" + " !".join(r.flags) if r.flags else ""))
        table_rows.append([m, *vals])
    con.print(fit_numbers(t, table_rows, con.width))
    integ = audit.integrity
    held = sum(r.identity_held for r in integ)
    total = sum(r.trials for r in integ)
    failed = [m for r in integ for m in r.identity_failed]
    spec_failed = [m for r in integ for m in r.spec_checks_failed]
    con.print(Text(f"Whole-trial identity (counter delta == sum of usage.completion_tokens): held in {held} of "
                   f"{total} trial{'s' if total != 1 else ''}") + (Text("; ") + Text("failed", style="red") +
                                                                   Text(f": {failed[0]}") if failed else Text("")))
    if spec_failed:
        con.print(Text("spec-decode checks failed", style="red") + Text(f": {spec_failed[0]}"))
    hits = [f"{r.variant} {level_label(r.level)} {r.prefix_cache_hit_rate:.0%}" for r in integ
            if r.prefix_cache_hit_rate is not None]
    if hits:
        con.print(Text(f"prefix-cache hits [server counter{', simulated' if sim else ''}]: " + ", ".join(hits)
                       + "".join(f"; {c}" for c in sorted({c for r in integ for c in r.cache}))))
    warnings = sorted({w for r in integ for w in r.warnings})
    for w in warnings[:5]:
        con.print(Text("warning", style="yellow") + Text(f": {w}"))


def render_audit(rows: Sequence[AuditEntry], title: str, simulated: bool = False, width: int = 160) -> Any:
    """A rich Table of the audit rows (simulated figures say so on every figure), laid out for
    `width` columns: figures and flags wrap at their spaces, never cut."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title), show_lines=False)
    header = level_header(r.key for r in rows)
    for col in ("variant", header, "method", "tok/s", "vs headline", "cause", "trials"):
        table.add_column(col, justify="right" if col in (header, "tok/s", "vs headline", "trials") else "left")
    tag = " (simulated)" if simulated else ""
    cells: list[list[Any]] = []
    for r in rows:
        tok = "missing" if r.tokps is None else f"{r.tokps:.1f}{tag}"
        err = "-" if r.error_pct_vs_counter is None else f"{percent(r.error_pct_vs_counter)}{tag}"
        style = {"reference": "bold", "agrees": "green", "missing data": "dim"}.get(r.cause, "yellow")
        cause = Text(r.cause, style=style)
        if r.flags:
            cause.append(" !" + " !".join(r.flags), style="bold red")
        cells.append([Text(r.variant), level_cell(r.key), Text(r.method), tok, err, cause, str(r.n_trials)])
    return fit_numbers(table, cells, width)


def _workload_shares(store: Store, run_id: str) -> str | None:
    """What the run's workload shares by design, from its stored experiment."""
    from truthput.report.data import workload_shares

    return workload_shares(store.experiment(run_id)[0])
