"""`truthput compare RUN_A RUN_B`: the cells two runs share, side by side, with B/A ratios and intervals."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:
    from truthput.report.document import CompareDocument, Figure


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare(
        run_a: str = typer.Argument(..., help="Run A (id, unique prefix or 'latest'), e.g. before an upgrade."),
        run_b: str = typer.Argument(..., help="Run B, e.g. after the upgrade."),
        store: Path = typer.Option(Path("truthput.db"), "--store", help="Results store of run A (SQLite)."),
        store_b: Optional[Path] = typer.Option(None, "--store-b", help="Results store of run B (default: --store)."),
        as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
        fail_if_slower: Optional[str] = typer.Option(
            None, "--fail-if-slower", metavar="PCT",
            help="Exit 1 when B is decided slower than A by more than PCT (e.g. 3%) in any shared cell (for CI)."),
    ) -> None:
        """Per shared variant x load level: A and B tok/s (server counter) and B/A with a corrected interval."""
        import json

        from truthput.report.data import compare_runs
        from truthput.store.db import Store

        threshold = parse_percent(fail_if_slower, "--fail-if-slower") if fail_if_slower is not None else None
        db_a = Store(store, read_only=True)
        db_b = Store(store_b, read_only=True) if store_b and store_b.resolve() != store.resolve() else db_a
        try:
            result = compare_runs(db_a, run_a, db_b, run_b)
        finally:
            db_a.close()
            if db_b is not db_a:
                db_b.close()
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2))
            _gate(result, threshold)
            return
        _print(result)
        _gate(result, threshold)


def _print(result: CompareDocument) -> None:
    from rich.table import Table
    from rich.text import Text

    from truthput.text import capped, percent

    from truthput.analyze.cells import source_label
    from truthput.experiment.levels import row_header, row_level
    from truthput.report.console import make_console

    con = make_console()
    for tag, h in (("A", result.a), ("B", result.b)):
        sim = " [bold yellow]SIMULATED[/bold yellow]" if h.simulated else ""
        ver = ", ".join(h.engine_versions) or "engine version not reported"
        con.print(f"{tag}: {h.id} ({h.store}) engine {h.engine} {ver}{sim}", highlight=False)
    t = Table(title="B vs A, output tok/s \\[headline: server counter, else usage placed in time]")
    for col in ("variant", row_header(result.rows), "A tok/s (95% CI)", "B tok/s (95% CI)", "B/A (CI)", "decided",
                "same argv"):
        t.add_column(col, justify="left" if col in ("variant", "same argv") else "right")

    def cell(f: Figure) -> Text:
        s = f"{f.value or 0.0:.1f}"
        if f.provenance != "server_counter":
            s += f" [{source_label(f.provenance)}]"
        s += f" ({f.lo:.1f}..{f.hi:.1f})" if f.lo is not None and f.hi is not None else ""
        text = Text(s)
        if f.flags:
            text.append(" !" + ",".join(f.flag_codes), style="bold red")
        return text

    for r in result.rows:
        q = r.ratio
        ratio = percent(q.pct or 0.0)
        ratio += f" ({capped(q.pct_lo, '{:+.1f}')}..{capped(q.pct_hi, '{:+.1f}')})" \
            if q.pct_lo is not None and q.pct_hi is not None \
            else " (no interval)"
        if q.significant:
            ratio = f"[bold]{ratio}[/bold]"
        t.add_row(Text(r.variant), row_level(r), cell(r.a), cell(r.b), ratio,
                  q.outcome or "", "yes" if r.same_argv else "[yellow]no[/yellow]")
    con.print(t)
    if result.rows:
        con.print(f"[dim]{result.rows[0].ratio.correction}; server starts are the unit of replication[/dim]")
    for note in result.notes:
        con.print(Text(note, style="yellow"))
    for name, keys in (("only in A", result.only_a), ("only in B", result.only_b)):
        if keys:
            con.print(f"{name}: " + ", ".join(f"{v} {label}" for v, label in keys), highlight=False)


def parse_percent(text: str, option: str) -> float:
    """'3%' or '3' -> 0.03; a clear error for anything else."""
    from truthput.errors import InputError

    raw = text.strip().rstrip("%").strip()
    try:
        value = float(raw) / 100.0
    except ValueError:
        raise InputError(f"{option} {text!r}: expected a percentage such as 3%") from None
    if not 0.0 <= value < 1.0:
        raise InputError(f"{option} {text!r}: expected a percentage from 0% to below 100%")
    return value


def _gate(result: CompareDocument, threshold: float | None) -> None:
    if threshold is None:
        return
    slower = result.slower_cells(threshold)
    if slower:
        typer.echo(f"truthput: B is slower than A by more than {threshold:.0%} in: {'; '.join(slower)}", err=True)
        raise typer.Exit(1)
