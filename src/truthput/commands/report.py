"""`truthput report RUN_ID`: the run's reports (HTML, markdown, CSV, JSON), or its terminal summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:
    from truthput.analyze.summary import RunSummary
    from truthput.store.db import Store


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        run_id: str = typer.Argument("latest", help="Run id (or a unique prefix), or 'latest'."),
        store: Path = typer.Option(Path("truthput.db"), "--store", help="Results store (SQLite)."),
        html: Optional[Path] = typer.Option(None, "--html", help="Write the self-contained HTML report here."),
        md: Optional[Path] = typer.Option(None, "--md", help="Write the markdown report (verdict, main tables) here."),
        csv_dir: Optional[Path] = typer.Option(None, "--csv", help="Write one CSV per table into this folder."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write the JSON document (schema truthput-report/1) here."),
        check: bool = typer.Option(False, "--check", help="Run SQLite's full integrity check on the store first (every open runs the quick one)."),
        values: Optional[Path] = typer.Option(None, "--values", help="Write the per-start values the verdict was "
                                              "decided from (.json: with the baseline and design; .csv: one row per "
                                              "trial); `truthput decide FILE` recomputes the verdict."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Terminal summary: also how the data looked "
                                     "(noise, pooling, drift) under the verdict"),
    ) -> None:
        """Write the run's reports; with no output option, print the terminal summary and write nothing."""
        from truthput.store.db import Store

        from truthput.report.files import ReportTargets, write_reports
        from truthput.report.data import run_summary

        targets = ReportTargets(html=html, md=md, json=json_path, csv_dir=csv_dir)
        db = Store(store, read_only=True, full_check=check)
        try:
            rid = db.resolve_run(run_id)
            summary = run_summary(db, rid)
            if values is not None:
                from truthput.store.summary import run_design
                from truthput.report.values import write_values

                base, measure = run_design(db, rid)
                write_values(values, summary.values, base, measure, bool(db.run(rid).simulated))
                typer.echo(f"values: {values}")
            if not targets.any():
                if values is None:
                    _print_terminal(db, rid, summary, verbose)
                return
            from truthput.report.data import build_report_data

            doc = build_report_data(db, rid, summary)
        finally:
            db.close()
        written = write_reports(doc, targets)
        for p in written:
            typer.echo(f"report: {p}")


def _print_terminal(db: Store, rid: str, summary: RunSummary, verbose: bool) -> None:
    """The terminal summary: the roofline (a run's, not a load run's: it has no [hardware]), then the
    run's table, ending with the verdict."""
    from truthput.report.data import roofline_for_run, roofline_lines
    from truthput.report.console import make_console
    from truthput.report.terminal import print_run

    con = make_console()
    if not db.run(rid).is_load and summary.measured_nothing() is None:
        for line in roofline_lines(roofline_for_run(db, rid, summary)):
            con.print(line, markup=False, highlight=False)
    print_run(db, rid, console=con, verbose=verbose, summary=summary)
