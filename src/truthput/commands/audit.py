"""`truthput audit RUN_ID`: every counting method against each cell's headline, and why each is off."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("audit")
    def audit(
        run_id: str = typer.Argument("latest", help="Run id (or a unique prefix), or 'latest'."),
        store: str = typer.Option("truthput.db", "--store", help="Results store (SQLite)."),
        as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON instead of a table."),
    ) -> None:
        """Show each counting method's tok/s, its error vs the cell's headline figure and the cause, per variant x concurrency."""
        import json

        from truthput.report.console import make_console
        from truthput.report.terminal import render_audit

        from truthput.analyze.audit import audit_of
        from truthput.errors import StoreError
        from truthput.experiment.levels import level_label
        from truthput.store.db import Store

        db = Store(store, read_only=True)
        try:
            rid = db.resolve_run(run_id)
            run = db.run(rid)
            simulated = bool(run.simulated)
            audit = audit_of(db.trial_results(rid), simulated)
            rows, checks = audit.rows, audit.integrity
            before = [e.message for e in db.events(rid) if e.kind == "other_traffic"]
        finally:
            db.close()
        if not rows:
            raise StoreError(f"{store}: run {rid} has no finished trial with measurements")
        if as_json:
            typer.echo(json.dumps({"run": rid, "simulated": simulated, "methods": [r.model_dump(mode="json") for r in rows],
                                   "integrity": [c.to_dict() for c in checks]}, indent=2))
            return
        title = f"audit of run {rid}: every counting method vs {audit.against}" + (" -- SIMULATED: no figure here is a measurement" if simulated else "")
        console = make_console()
        for said in before:
            console.print(f"warning: before the load: {said}", markup=False, style="yellow")
        console.print(render_audit(rows, title, simulated, console.width))
        for c in checks:
            head = f"{c.variant} {level_label(c.level)}: counter == usage identity held in {c.identity_held}/{c.trials} trial(s)"
            if c.identity_unchecked:
                head += f", {c.identity_unchecked} unchecked (no counter)"
            if c.prefix_cache_hit_rate is not None:
                head += f"; prefix-cache hits {c.prefix_cache_hit_rate:.0%} [server counter]"
            head += "".join(f"; {said}" for said in c.cache)
            console.print(head, markup=False)
            for line in c.identity_failed + c.spec_checks_failed + c.flags + c.warnings:
                console.print(f"  ! {line}", markup=False)
