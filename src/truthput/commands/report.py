"""`truthput report RUN_ID`: the run's reports (HTML, markdown, CSV, JSON), or its terminal summary."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


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
        from truthput.errors import StoreError
        from truthput.store.db import Store

        if not store.exists():
            raise StoreError(f"{store}: no results store here (give --store PATH)")
        db = Store(store, read_only=True, full_check=check)
        try:
            rid = db.resolve_run(run_id)
            if values is not None:
                from truthput.report.runsummary import run_design, run_summary
                from truthput.report.values import write_values

                base, measure = run_design(db, rid)
                write_values(values, run_summary(db, rid).values, base, measure, bool(db.run(rid).simulated))
                typer.echo(f"values: {values}")
            if not any((html, md, csv_dir, json_path, values)):
                from truthput.report.data import roofline_for_run, roofline_lines
                from truthput.report.terminal import make_console, print_run

                con = make_console()
                if not db.run(rid).is_load:  # a load run has no [hardware]
                    for line in roofline_lines(roofline_for_run(db, rid)):
                        con.print(line, markup=False, highlight=False)
                print_run(db, rid, console=con, verbose=verbose)  # ends with the verdict
                return
            from truthput.report.data import build_report_data

            doc = build_report_data(db, rid)
        finally:
            db.close()
        written: list[Path] = []
        if html:
            from truthput.report.html import render_html

            html.parent.mkdir(parents=True, exist_ok=True)
            html.write_text(render_html(doc), encoding="utf-8")
            written.append(html)
        if md:
            from truthput.report.markdown import render_markdown

            md.parent.mkdir(parents=True, exist_ok=True)
            md.write_text(render_markdown(doc), encoding="utf-8")
            written.append(md)
        if json_path:
            from truthput.report.export import write_json

            written.append(write_json(doc, json_path))
        if csv_dir:
            from truthput.report.export import write_csv

            written += write_csv(doc, csv_dir)
        for p in written:
            typer.echo(f"report: {p}")
