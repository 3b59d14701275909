"""`truthput tune EXP.toml`: search the [tune] space on the simulator, decide on the real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer


def rank_agreement_text(rho: float | None, pairs: int) -> str:
    """Spearman's rho between the simulator's and the server's ranking, with what it means for
    trusting the simulator's screen of the configurations the server never ran."""
    if rho is None:
        return (f"simulator vs server ranking: too few configurations measured on both ({pairs}) for a rank "
                "correlation; the screen's order is unchecked")
    if pairs < 5:
        reading = "too few configurations to read much into it"
    elif rho >= 0.8:
        reading = "the simulator ranks them as the server does: its screen can be trusted to pick candidates"
    elif rho >= 0.4:
        reading = "the simulator's order roughly holds: its screen finds good candidates, not the exact best"
    else:
        reading = ("the simulator's order does not hold on this server: its screen is close to a random pick here; "
                   "calibrate it on a run of this server (truthput sim calibrate) before trusting it")
    return f"simulator vs server ranking: Spearman's rho {rho:.2f} over {pairs} configurations: {reading}"


def register(app: typer.Typer) -> None:
    from truthput.commandline import ADDRESS_HELP, ENGINE_HELP, EXECUTOR_HELP, STORE_HELP

    @app.command()
    def tune(
        experiment: Path = typer.Argument(..., help="Experiment file (TOML) with a [tune] section."),
        engine: Optional[str] = typer.Option(None, "--engine", help=ENGINE_HELP),
        store: Path = typer.Option(Path("truthput.db"), "--store", help=STORE_HELP + " The optuna studies go beside "
                                   "it (NAME.optuna.db)."),
        reports: Optional[Path] = typer.Option(Path("reports"), "--reports", help="Folder for the tune report, "
                                               "tune.json and the chosen unit."),
        executor: str = typer.Option("local", "--executor", help=EXECUTOR_HELP + " With ray, a round's candidates "
                                     "are measured in parallel on several nodes."),
        address: Optional[str] = typer.Option(None, "--address", help=ADDRESS_HELP),
    ) -> None:
        """Rank the space on the simulator (virtual time), measure the best candidates beside the
        baseline on the server, and name the configuration the statistics decide is fastest.
        Run the same command again to continue a killed search (nothing finished is redone)."""
        import asyncio
        import json
        import signal

        from truthput.commandline import make_executor, stop_signals, stop_task
        from truthput.engines.process import become_subreaper
        from truthput.load.client import prepare_load_process
        from truthput.report.progress import make_progress
        from truthput.report.tune import figure_text, render_tune_html
        from truthput.experiment.file import load_experiment
        from truthput.store.db import Store
        from truthput.tune.driver import outcome_document, study_storage_path
        from truthput.tune.driver import tune as run_tune

        exp, text = load_experiment(experiment)
        if exp.tune is None:
            from truthput.errors import InputError

            raise InputError(f"{experiment}: no [tune] section: give the space as [[tune.param]] flag = \"--max-num-seqs\", "
                            "values = [16, 32, 64] (or low/high/step)")
        placer = make_executor(executor, address)
        prepare_load_process()
        become_subreaper()
        db = Store(store)
        progress = make_progress()
        received: list[int] = []

        def say(line: str) -> None:
            typer.echo(f"tune: {line}")

        async def main() -> Any:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            for sig in (*stop_signals(), signal.SIGINT):
                loop.add_signal_handler(sig, stop_task, task, sig, received)
            return await run_tune(exp, text, str(experiment), db, store, engine, progress, say, executor=placer)

        try:
            outcome = asyncio.run(main())
        except (KeyboardInterrupt, asyncio.CancelledError):
            progress.close()
            typer.echo(f"truthput: tune stopped; finished work is kept (studies in {study_storage_path(store)}, rounds "
                       f"in {store}). Run the same command again to continue.", err=True)
            raise typer.Exit(128 + received[0] if received else 130)
        progress.close()
        kind = engine or exp.server.engine
        doc = outcome_document(outcome, exp.tune, kind == "sim")
        typer.echo("")
        typer.echo(f"tune {outcome.name}: {outcome.screened} configurations screened on the simulator "
                   f"({outcome.screen_failed} would not start), {outcome.screen_cpu_s:.1f} CPU-s; objective: "
                   f"{doc.figure} at {doc.level}")
        for r in doc.measured:
            server = "failed: " + r.server_failure if r.server_failure else (
                f"{figure_text(r.server)} {doc.figure} over {r.server_starts} start(s)" if r.server
                else "no data")
            sim = figure_text(r.simulated) if r.simulated else "n/a"
            typer.echo(f"  {r.config}: simulator {sim}, server {server}")
        typer.echo(rank_agreement_text(doc.rank_correlation, doc.rank_pairs))
        typer.echo(f"server time: {doc.server_starts} starts, {doc.server_minutes:.1f} server-minutes; "
                   f"stopped: {doc.stop_reason}")
        if outcome.chosen_variant == exp.experiment.baseline:
            typer.echo(f"outcome: keep the baseline ({doc.chosen}): {(doc.chosen_line or '').split(': keep the baseline')[0]}")
        else:
            typer.echo(f"chosen: {doc.chosen}")
            typer.echo(f"  {doc.chosen_line}")
        if reports is not None:
            reports.mkdir(parents=True, exist_ok=True)
            html = reports / f"{outcome.name}.html"
            html.write_text(render_tune_html(doc), encoding="utf-8")
            (reports / f"{outcome.name}.json").write_text(json.dumps(doc.to_dict(), indent=1), encoding="utf-8")
            typer.echo(f"report: {html}")
            if outcome.chosen_run and outcome.chosen_variant and outcome.chosen_variant != exp.experiment.baseline:
                from truthput.report.units import export_variant_unit

                text_unit, warnings = export_variant_unit(store, outcome.chosen_run, outcome.chosen_variant)
                unit_path = reports / f"{outcome.name}-chosen.service"
                unit_path.write_text(text_unit, encoding="utf-8")
                typer.echo(f"chosen unit: {unit_path}")
                for w in warnings:
                    typer.echo(f"  note: {w}")
