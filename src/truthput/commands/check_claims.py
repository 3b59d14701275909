"""`truthput check-claims CLAIMS.toml [RUN_ID]`: physics and (optionally) a run judge each claim."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("check-claims")
    def check_claims_cmd(
        claims_file: str = typer.Argument(..., help="TOML file with [[claim]] entries (and an optional [bounds] table)."),
        run_id: str = typer.Argument(None, help="Run id (or 'latest') to check against; physics only when omitted."),
        store: str = typer.Option("truthput.db", "--store", help="Results store (SQLite)."),
        as_json: bool = typer.Option(False, "--json", help="Print the verdicts as JSON."),
    ) -> None:
        """Say for each claim: plausible, contradicted, impossible or untestable -- and why."""
        import json

        from truthput.report.console import make_console
        from rich.table import Table

        from truthput.analyze.claims import check_claims
        from truthput.experiment.claims import load_claims_file

        claims, bounds = load_claims_file(claims_file)
        measurements = None
        simulated = False
        title = f"claims in {claims_file}: physics only"
        if run_id:
            from truthput.store.db import Store

            db = Store(store, read_only=True)
            try:
                rid = db.resolve_run(run_id)
                simulated = bool(db.run(rid).simulated)
                measurements = db.trial_results(rid)
                from truthput.report.data import roofline_for_run

                ceilings = roofline_for_run(db, rid).no_spec_ceilings()
                if ceilings and not (bounds or {}).get("ceiling_tps"):
                    bounds = {**(bounds or {}), "ceiling_tps": ceilings}
            finally:
                db.close()
            title = f"claims in {claims_file} vs run {rid}" + (" (SIMULATED run)" if simulated else "")
        results = check_claims(claims, measurements, bounds, simulated=simulated)
        if as_json:
            typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
            return
        table = Table(title=title, show_lines=True)
        table.add_column("claim", max_width=40)
        table.add_column("verdict")
        table.add_column("why", max_width=90)
        colour = {"plausible": "green", "contradicted": "yellow", "impossible": "bold red", "untestable": "dim"}
        for r in results:
            c = colour.get(r.verdict, "white")
            table.add_row(r.text, f"[{c}]{r.verdict}[/{c}]", r.reason)
        make_console().print(table)
