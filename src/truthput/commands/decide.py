"""`truthput decide VALUES`: the verdict recomputed from per-start values (a run's, or anyone's)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("decide")
    def decide_cmd(
        values: Path = typer.Argument(..., help="Per-start values: a JSON file from `truthput report RUN --values "
                                                "F.json`, or a CSV with columns metric, variant, concurrency, rate, "
                                                "round, trial, value."),
        baseline: Optional[str] = typer.Option(None, "--baseline", help="The baseline variant (a JSON file names it)."),
        experiment: Optional[Path] = typer.Option(None, "--experiment", help="Take the design ([measure]) from this "
                                                  "experiment file (default: the JSON file's, else the defaults)."),
        look: Optional[int] = typer.Option(None, "--look", help="Decide as at this look (starts per variant); "
                                           "default: all the starts given."),
    ) -> None:
        """Print the verdict the values give, with the run's design: the same function `run` uses."""
        from truthput.analyze.values import decide
        from truthput.errors import InputError
        from truthput.report.values import check_starts, read_values

        starts, named, measure, simulated = read_values(values)
        if experiment is not None:
            from truthput.experiment.file import load_experiment

            exp, _text = load_experiment(experiment)
            measure, named = exp.measure, named or exp.experiment.baseline
        base = baseline or named
        if not base:
            raise InputError(f"{values}: which variant is the baseline? give --baseline NAME")
        if look is not None:
            check_starts(values, starts, look)
            starts = [s for s in starts if s.round < look]
        verdict = decide(starts, base, measure, look=look, simulated=simulated)
        for line in verdict.lines():
            typer.echo(line)
