"""`truthput import UNIT.service` and `truthput unit RUN_ID --variant NAME`: systemd units in and out.

`import` turns the unit a user already runs into an experiment file whose baseline is exactly its
ExecStart=; `unit` writes a measured variant back as a unit with the same sections, so the winner
can be installed without retyping a flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def default_import_path(unit_path: Path) -> Path:
    """`gwen.service` -> `gwen.toml` in the current folder."""
    return Path(unit_path.name.rsplit(".", 1)[0] + ".toml")


def write_or_print(path: Path | None, text: str, force: bool, other: str) -> bool:
    """`text` to `path` (None: to stdout, and False); an existing file only with --force."""
    from truthput.errors import InputError

    if path is None:
        typer.echo(text, nl=False)
        return False
    if path.exists() and not force:
        raise InputError(f"{path}: already exists; use --force to overwrite{other}")
    path.write_text(text, encoding="utf-8")
    return True


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_(
        unit_file: Path = typer.Argument(..., help="A systemd unit (e.g. vllm.service) whose ExecStart= runs the "
                                         "server, or a shell script with a `vllm serve ...` (or llama-server) line."),
        output: Optional[Path] = typer.Option(None, "-o", "--output", help="Experiment file to write (default: UNIT.toml here)."),
        force: bool = typer.Option(False, "--force", help="Overwrite the output file if it exists."),
    ) -> None:
        """Make an experiment file whose baseline is the unit's ExecStart= or the script's server line (warns where
        the unit contradicts itself)."""
        from truthput.errors import InputError
        from truthput.experiment.unit import consistency_warnings, import_unit, parse_unit, read_server_definition

        toml_text = import_unit(str(unit_file))
        unit = parse_unit(read_server_definition(str(unit_file)), str(unit_file))
        unknown = [v for v in unit.unresolved_variables() if v not in unit.address_variables()]
        if unknown and not unit.environment_files():
            # nothing the unit or script says gives them a value: refuse to guess what the server runs
            said = ", ".join(f"${v}" for v in unknown)
            raise InputError(f"{unit_file}: the server's command uses {said}, which the "
                             f"{'script' if unit_file.suffix != '.service' else 'unit'} never sets: set "
                             f"{'it' if len(unknown) == 1 else 'them'} there (NAME=value before the command, or "
                             "Environment= in a unit), or write the value into the command")
        for warning in consistency_warnings(unit) + unit.notes():
            typer.echo(f"truthput: warning: {warning}", err=True)
        target = output or default_import_path(unit_file)
        if write_or_print(None if str(target) == "-" else target, toml_text, force, " or -o to choose another file"):
            typer.echo(f"wrote {target}: baseline = the unit's ExecStart=; add [[variant]] tables, then "
                       f"`truthput run {target}`")

    @app.command("unit")
    def unit_(
        run_id: str = typer.Argument(..., help="Run id (or a unique prefix, or 'latest')."),
        variant: Optional[str] = typer.Option(None, "--variant", help="The variant to write as a unit (default: the "
                                              "verdict's winner)."),
        store: Path = typer.Option(Path("truthput.db"), "--store", help="Results store (SQLite)."),
        output: Optional[Path] = typer.Option(None, "-o", "--output", help="Unit file to write (default: print it)."),
        experiment_mode: bool = typer.Option(False, "--experiment-mode", help="Restart=no and no RestartSec= (a crash is a result, not a restart loop)."),
        description: Optional[str] = typer.Option(None, "--description", help="Replace the unit's Description=."),
        template: Optional[Path] = typer.Option(None, "--template", help="Unit to take the other sections from, when the run's experiment carries none."),
        force: bool = typer.Option(False, "--force", help="Overwrite the output file if it exists."),
    ) -> None:
        """Write a measured variant back as a systemd unit with the original unit's sections."""
        from truthput.report.units import export_variant_unit, verdict_on_variant
        from truthput.store.db import Store

        db = Store(store, read_only=True)
        try:
            rid = db.resolve_run(run_id)
            variant, said = verdict_on_variant(db, rid, variant)
        finally:
            db.close()
        typer.echo(f"truthput: writing {variant} of run {rid}", err=True)
        text, warnings = export_variant_unit(store, rid, variant, experiment_mode, description, template)
        for warning in said + warnings:
            typer.echo(f"truthput: warning: {warning}", err=True)
        if write_or_print(output, text, force, ""):
            typer.echo(f"wrote {output}")
