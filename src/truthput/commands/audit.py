"""`truthput audit RUN_ID`: every counting method against the server counter, and why each is off."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("audit")
    def audit(
        run_id: str = typer.Argument("latest", help="Run id (or a unique prefix), or 'latest'."),
        store: str = typer.Option("truthput.db", "--store", help="Results store (SQLite)."),
        as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON instead of a table."),
    ) -> None:
        """Show each counting method's tok/s, its error vs the counter and the cause, per variant x concurrency."""
        import json
        from pathlib import Path

        from rich.console import Console

        from truthput.analyze.audit import audit_rows, render_audit
        from truthput.errors import StoreError
        from truthput.store.db import Store

        if not Path(store).exists():
            raise StoreError(f"{store}: no results store here (give --store PATH)")
        db = Store(store)
        try:
            rid = db.resolve_run(run_id)
            run = db.run(rid)
            simulated = bool(run["simulated"])
            rows = audit_rows(db.trial_results(rid), simulated=simulated)
        finally:
            db.close()
        if not rows:
            raise StoreError(f"{store}: run {rid} has no finished trial with measurements")
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        title = f"audit of run {rid}" + (" -- SIMULATED: no figure here is a measurement" if simulated else "")
        Console().print(render_audit(rows, title, simulated))
