"""`truthput run` and `truthput plan`: the whole A/B experiment, or just its plan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:
    from truthput.experiment.file import Experiment
    from truthput.report.files import RunFiles
    from truthput.run.outcome import RunOutcome
    from truthput.run.plan import Plan

from truthput.commandline import (
    ADDRESS_HELP, ENGINE_HELP, EXECUTOR_HELP, STORE_HELP, make_executor, stop_signals, stop_task,
)


def checked_plan(exp: Experiment, engine: str | None, path: Path) -> Plan:
    """The plan, with a refusal naming the experiment file as well as the section or variant."""
    from truthput.errors import InputError
    from truthput.run.plan import build_plan

    try:
        return build_plan(exp, engine)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def simulate_on(exp: Experiment, engine: str | None, gpu: str | None, model: str | None) -> list[str]:
    """`--sim-gpu`/`--sim-model` applied to the experiment (run and plan alike); they shape the
    simulator only, so they need it to be the engine."""
    if not (gpu or model):
        return []
    from truthput.errors import InputError

    if (engine or exp.server.engine) != "sim":
        raise InputError("--sim-gpu / --sim-model shape the simulator: give --engine sim too")
    return exp.simulate_on(gpu, model)


def run(
    experiment: Optional[Path] = typer.Argument(None, help="Experiment file (TOML). Not needed with --resume."),
    engine: Optional[str] = typer.Option(None, "--engine", help=ENGINE_HELP),
    store: Path = typer.Option(Path("truthput.db"), "--store", help=STORE_HELP),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue an interrupted run (id or 'latest') without redoing finished trials."),
    reports: Optional[Path] = typer.Option(Path("reports"), "--reports", help="Folder for the HTML and markdown reports."),
    no_reports: bool = typer.Option(False, "--no-reports", help="Write no report or unit files (the store keeps "
                                    "everything: `truthput report RUN --html F` writes them later)."),
    sim_gpu: Optional[str] = typer.Option(None, "--sim-gpu", help="With the simulator: model this GPU (a catalog "
                                          "name), as many as the command's TP x PP, instead of the file's [hardware]."),
    sim_model: Optional[str] = typer.Option(None, "--sim-model", help="With the simulator: model this profile "
                                            "instead of the file's [model]."),
    executor: str = typer.Option("local", "--executor", help=EXECUTOR_HELP),
    address: Optional[str] = typer.Option(None, "--address", help=ADDRESS_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print how the data looked (noise, pooling, "
                                 "drift) under the verdict"),
) -> None:
    """Run every variant x load level, measure from server counters, print the verdict."""
    import asyncio
    import signal

    from truthput.errors import InputError
    from truthput.load.client import prepare_load_process
    from truthput.report.files import RunFiles
    from truthput.report.progress import make_progress
    from truthput.run.outcome import run_and_report
    from truthput.experiment.file import load_experiment, parse_experiment
    from truthput.store.db import Store

    overrides: list[str] = []
    if not resume and experiment is not None:
        # a bad file or an impossible plan fails before a store is created
        exp, text = load_experiment(experiment)
        overrides = simulate_on(exp, engine, sim_gpu, sim_model)
        planned = checked_plan(exp, engine, experiment)
        from truthput.run.plan import vocabulary_lines

        for line in vocabulary_lines(exp, planned.engine):  # what plan warns, run says too
            if line.startswith("flags not checked"):
                typer.echo(f"truthput: warning: {line}", err=True)
    elif resume and not store.exists():
        raise InputError(f"--resume {resume}: no results store at {store}")
    db = Store(store)
    if resume:
        run_id = db.resolve_run(resume)
        row = db.run(run_id)
        if row.status == "done":
            from truthput.report.terminal import print_run

            typer.echo(f"run {run_id} is complete (status done): nothing to resume; its summary follows")
            print_run(db, run_id)
            return
        exp = parse_experiment(row.experiment_toml, f"{row.experiment_path or 'stored experiment'} (run {run_id})")
        text, path = row.experiment_toml, row.experiment_path
        db.apply_sim_target(run_id, exp)
    elif experiment is None:
        raise InputError("give an experiment file (truthput run EXP.toml) or --resume RUN_ID")
    else:
        path = str(experiment)
        run_id = None
    placer = make_executor(executor, address)
    prepare_load_process()
    from truthput.engines.process import become_subreaper

    become_subreaper()  # a server's descendant that leaves its process group is still found at teardown
    progress = make_progress()
    files = None if no_reports or reports is None else RunFiles(reports)
    received: list[int] = []

    async def main() -> RunOutcome:
        # SIGTERM and SIGHUP (what `timeout`, `systemctl stop`, a closed terminal or a CI cancel
        # send) stop the run like Ctrl-C: the running task is cancelled, so every server this
        # run started is stopped and the run is marked interrupted.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        for sig in (*stop_signals(), signal.SIGINT):
            loop.add_signal_handler(sig, stop_task, task, sig, received)
        return await run_and_report(exp, text, path, db, store, engine=engine, resume=run_id, progress=progress,
                                    sim_target={"gpu": sim_gpu, "model": sim_model, "said": overrides}
                                    if overrides else None, executor=placer, write_files=files)

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C works even when inherited ignored
    try:
        outcome = asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        progress.close()
        latest = db.resolve_run("latest") if run_id is None else run_id
        why = f"stopped by {signal.Signals(received[0]).name}" if received and received[0] != signal.SIGINT \
            else "interrupted"
        typer.echo(f"truthput: {why}; finished trials are kept. Resume with: truthput run --resume {latest} "
                   f"--store {store}", err=True)
        raise typer.Exit(128 + received[0] if received else 130)
    progress.close()
    _print_outcome(db, outcome, verbose, files)
    if outcome.exit_status:
        raise typer.Exit(outcome.exit_status)


def _print_outcome(db: Any, outcome: RunOutcome, verbose: bool, files: RunFiles | None) -> None:
    """The audit and the roofline first, so the run ends with its table and verdict; then the files
    written, and a line for any variant that was never measured."""
    from truthput.report.data import roofline_for_run, roofline_lines
    from truthput.report.terminal import print_audit_matrix, print_run

    from truthput.analyze.audit import audit_of

    rid, summary = outcome.run_id, outcome.summary
    document = files.document if files is not None else None
    print_audit_matrix(files.audit if files is not None and files.audit is not None
                       else audit_of(db.trial_results(rid), bool(db.run(rid).simulated)))
    if summary.measured_nothing() is None:
        roof = document.roofline if document is not None else roofline_for_run(db, rid, summary)
        for line in roofline_lines(roof):
            typer.echo(line)
    print_run(db, rid, verbose=verbose, summary=summary)
    for p in outcome.files:
        typer.echo(f"{'winning unit' if p.suffix == '.service' else 'report'}: {p}")
    if outcome.problem():
        typer.echo(f"truthput: {outcome.problem()}", err=True)


def plan(
    experiment: Path = typer.Argument(..., help="Experiment file (TOML)."),
    engine: Optional[str] = typer.Option(None, "--engine", help=ENGINE_HELP),
    store: Path = typer.Option(Path("truthput.db"), "--store",
                               help="Results store whose earlier runs on this host give the expected noise "
                                    "(read only; not created)."),
    sim_gpu: Optional[str] = typer.Option(None, "--sim-gpu", help="As for run: the simulator's GPU."),
    sim_model: Optional[str] = typer.Option(None, "--sim-model", help="As for run: the simulator's model profile."),
    executor: str = typer.Option("local", "--executor", help=EXECUTOR_HELP + " With ray: check the cluster's "
                                 "nodes against the plan and name what cannot be placed."),
    address: Optional[str] = typer.Option(None, "--address", help=ADDRESS_HELP),
) -> None:
    """Print the trial plan, each variant's argv diff, the starts the stopping rule will likely
    need and a time estimate; runs nothing."""
    from truthput.report.console import make_console
    from rich.table import Table

    from truthput.experiment.file import load_experiment
    from truthput.experiment.levels import level_label
    from truthput.run.forecast import external_traffic, learned_estimate, starts_forecast
    from truthput.text import plural

    exp, _ = load_experiment(experiment)
    simulate_on(exp, engine, sim_gpu, sim_model)
    p = checked_plan(exp, engine, experiment)
    con = make_console()
    placer = make_executor(executor, address)
    placed = placer.prepare(exp, p)
    con.print(f"[bold]{exp.experiment.name}[/bold]: engine {p.engine}"
              + (" (embedded simulator: every figure will be SIMULATED)" if p.engine == "sim" else ""))
    import shlex

    con.print(f"base command: {shlex.join(exp.server.command) or '(none)'}", markup=False, highlight=False)
    t = Table(title="variants (argv diff vs the baseline's command)")
    t.add_column("variant")
    t.add_column("diff")
    t.add_column("speculation")
    for v in p.variants:
        name = v.name + (" (baseline)" if v.is_baseline else "")
        spec = "off" if not v.speculative else ", ".join(f"{k}={val}" for k, val in v.speculative.items())
        t.add_row(name, "\n".join(v.diff_text), spec)
    con.print(t)
    wl = exp.workload
    window = f"{wl.duration_s:g} s window" if wl.duration_s else f"{wl.requests} requests"
    con.print(f"order of server starts: {' '.join(f'{n}#{i + 1}' for n, i in p.order)}")
    for line in placed:
        con.print(line, markup=False, highlight=False)
    if wl.replays_trace:
        from truthput.load.workload import Workload

        replay = Workload.of_experiment(exp, 0).trace
        window = f"its {len(replay.requests)} requests over {replay.offsets[-1]:.1f} s"
        levels = (f"the {replay.format} trace {wl.prompt_source[len('trace:'):]} replayed at its recorded times"
                  + (f" x{wl.trace.speedup:g}" if wl.trace.speedup != 1 else "") + f" ({level_label(p.levels[0])})")
    elif wl.mode == "open":
        cap = f", at most {wl.max_in_flight} in flight" if wl.max_in_flight else ""
        levels = f"an open loop ({wl.arrival} arrivals{cap}) at {', '.join(level_label(x) for x in p.levels)}"
    else:
        levels = f"concurrency {', '.join(map(str, p.levels))}"
    con.print(f"per start: {levels}; each level {wl.warmup_s:g} s warm-up + {plural(p.repeats, 'trial')} x {window}")
    trials = len(p.order) * len(p.levels) * p.repeats
    m = exp.measure
    import socket

    learned = learned_estimate(store, p, socket.gethostname())
    said = (f"estimated time {learned[0] / 60:.1f} min (learned from {learned[1]} earlier starts of these servers "
            f"in {store}; the model alone says {p.estimate_s / 60:.1f} min)") if learned else \
        f"estimated time {p.estimate_s / 60:.1f} min"
    con.print(f"{len(p.order)} server starts, {trials} timed trials; {said}"
              + (f"; the stopping rule may add starts up to {m.planned_max_starts} per variant"
                 f" (at most {p.max_estimate_s / 60:.1f} min)" if m.sequential and m.planned_max_starts > m.starts
                 else ""))
    for line in starts_forecast(exp, p, store, learned[0] / max(1, len(p.order)) if learned else None):
        con.print(line, markup=False)
    from truthput.run.plan import address_warnings, max_num_seqs_warnings, rows_warnings, vocabulary_lines

    for line in vocabulary_lines(exp, p.engine):
        con.print(("warning: " if line.startswith("flags not checked") else "") + line, markup=False,
                  style="yellow" if line.startswith("flags not checked") else None)
    for line in [*max_num_seqs_warnings(exp, p), *address_warnings(exp), *external_traffic(exp, p),
                 *rows_warnings(exp, p)]:
        con.print("warning: " + line, markup=False, style="yellow")
    if len(p.variants) == 1:
        con.print("note: one variant, nothing to compare: a run measures it alone (figures, no verdict); "
                  "add a [[variant]] that changes a flag to compare", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(plan)
