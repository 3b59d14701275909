"""`truthput runs`: the runs a store holds, newest last: id, name, status, when, engine, variants, verdict."""

from __future__ import annotations

from typing import Any

import typer


def register(app: typer.Typer) -> None:
    @app.command("runs")
    def runs(
        store: str = typer.Option("truthput.db", "--store", help="Results store (SQLite)."),
        as_json: bool = typer.Option(False, "--json", help="Print the runs as JSON instead of a table."),
    ) -> None:
        """List the store's runs (id, name, status, started, engine, variants, the verdict's first line)."""
        import json

        from rich.table import Table
        from rich.text import Text

        from truthput.report.console import NARROW, make_console
        from truthput.store.db import Store

        from truthput.analyze.summary import StoredSummary

        db = Store(store, read_only=True)
        try:
            rows = [(r, [v.name for v in db.variants(r.id)], StoredSummary.from_json(r.summary_json))
                    for r in db.runs()]
        finally:
            db.close()
        def decision(record: Any, row: Any) -> str | None:
            """The run's decision: its stored verdict's decision lines (an older store: as its record
            kept them, or its first line)."""
            if record is not None:
                said = [cv.decision[0] for cv in record.verdict.per_concurrency if cv.decision and cv.metric == "tok/s"]
                return "; ".join(said) or None
            kept = row.summary if isinstance(row.summary, dict) else {}
            older = [cv["decision"][0] for cv in (kept.get("verdict") or {}).get("per_concurrency") or []
                     if cv.get("decision") and cv.get("metric") == "tok/s"]
            return "; ".join(older) or (kept.get("verdict_lines") or [None])[0]

        listed: list[dict[str, Any]] = [
            {"id": r.id, "name": r.name, "status": r.status, "created_at": r.created_at, "engine": r.engine,
             "simulated": bool(r.simulated), "variants": names, "verdict": decision(record, r)}
            for r, names, record in rows]
        if as_json:
            typer.echo(json.dumps(listed, indent=2))
            return
        con = make_console()
        if con.width < NARROW:  # a table of seven columns would break its words: a block per run
            con.print(Text(f"runs in {store}", style="bold"))
            for r in listed:
                engine = r["engine"] + (" (simulated)" if r["simulated"] and r["engine"] != "sim" else "")
                con.print(Text(f"{r['id']}  {r['status']}  {r['created_at'][:16].replace('T', ' ')}  {engine}",
                               style="bold"))
                con.print(Text(f"  {r['name']}: {', '.join(r['variants'])}"))
                if r["verdict"]:
                    con.print(Text(f"  {r['verdict']}"))
            return
        t = Table(title=f"runs in {store}")
        # an id is what a user copies into the next command: never cut (the other columns wrap)
        t.add_column("id", no_wrap=True, min_width=max((len(r["id"]) for r in listed), default=2))
        for col in ("name", "status", "started", "engine", "variants", "decision"):
            t.add_column(col, overflow="fold")
        for r in listed:
            engine = r["engine"] + (" (simulated)" if r["simulated"] and r["engine"] != "sim" else "")
            t.add_row(*(Text(str(x)) for x in (r["id"], r["name"], r["status"], r["created_at"][:16].replace("T", " "), engine,
                                              ", ".join(r["variants"]), r["verdict"] or "")))
        con.print(t)
