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


def export_variant_unit(
    store_path: Path,
    run_id: str,
    variant: str,
    experiment_mode: bool = False,
    description: Optional[str] = None,
    template: Optional[Path] = None,
) -> tuple[str, list[str]]:
    """The unit text for one variant of a stored run, and warnings about it.

    The variant's stored argv is what was launched, with the runner's host/port; the unit gets the
    listen address of the original unit back (or none, when the original had none).
    """
    import json
    import tomllib

    from truthput.errors import InputError, StoreError
    from truthput.experiment.argv import ServerArgv
    from truthput.experiment.unit import consistency_warnings, guess_engine, parse_unit, render_unit, unwrap_shell
    from truthput.store.db import Store

    if not store_path.exists():
        raise StoreError(f"{store_path}: no results store here (give --store PATH)")
    db = Store(store_path, read_only=True)
    try:
        row = db.run(run_id)
        full_id = row["id"]
        variants = {v["name"]: v for v in db.variants(full_id)}
    finally:
        db.close()
    if variant not in variants:
        names = ", ".join(variants) or "none"
        raise StoreError(f"{store_path}: run {full_id} has no variant {variant!r} (variants: {names})")
    stored = variants[variant]
    argv = json.loads(stored["argv_json"])
    env = json.loads(stored["env_json"] or "{}")

    base_command: list[str] | None = None
    notes: list[str] = []
    unit_text: str | None
    unit_path: str | None
    if template is not None:
        try:
            unit_text, unit_path = template.read_text(encoding="utf-8"), str(template)
        except OSError as exc:
            raise InputError(f"{template}: cannot read unit file: {exc.strerror}") from None
    else:
        where = f"run {full_id}'s experiment"
        try:
            experiment = tomllib.loads(row["experiment_toml"])
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{where}: not valid TOML: {exc}") from None
        ref = experiment.get("server", {}).get("systemd_unit") or {}
        unit_text, unit_path = ref.get("text"), ref.get("path")
        if not unit_text and unit_path and Path(unit_path).exists():
            unit_text = Path(unit_path).read_text(encoding="utf-8")
        if not unit_text:
            # no unit to start from (the experiment gave a command): a minimal one, said so
            base_command = [str(w) for w in experiment.get("server", {}).get("command") or []]
            if not base_command:
                raise InputError(f"{where} has neither a [server.systemd_unit] nor a command; give --template "
                                "UNIT.service")
            unit_text = (f"[Unit]\nDescription={experiment.get('experiment', {}).get('name', 'truthput')}: "
                         f"{variant} (written by truthput)\nAfter=network.target\n\n[Service]\nType=simple\n"
                         "Restart=on-failure\n\n[Install]\nWantedBy=multi-user.target\n")
            notes.append(f"{where} came from a command, not a unit: this is a minimal unit (add User=, "
                         "WorkingDirectory= and the like, or give --template UNIT.service)")
    unit = parse_unit(unit_text, unit_path)

    if base_command is not None:
        original_argv = base_command
    else:
        original_argv, _, _ = unwrap_shell(unit.exec_start_argv(), unit.where)
    engine = guess_engine(argv)
    original = ServerArgv.parse(original_argv, engine=engine)
    server = ServerArgv.parse(argv, engine=engine)
    for name in ("--host", "--port"):
        server = server.with_set({name: original.get(name)}) if original.has(name) else server.without([name])
    text = render_unit(unit, server.to_argv(), env=env, experiment_mode=experiment_mode, description=description)
    warnings = notes + consistency_warnings(parse_unit(text, unit_path))
    return text, warnings


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_(
        unit_file: Path = typer.Argument(..., help="A systemd unit (e.g. vllm.service) whose ExecStart= runs the server."),
        output: Optional[Path] = typer.Option(None, "-o", "--output", help="Experiment file to write (default: UNIT.toml here)."),
        force: bool = typer.Option(False, "--force", help="Overwrite the output file if it exists."),
    ) -> None:
        """Make an experiment file whose baseline is the unit's ExecStart= (warns where the unit contradicts itself)."""
        from truthput.errors import InputError
        from truthput.experiment.unit import consistency_warnings, import_unit, parse_unit

        toml_text = import_unit(str(unit_file))
        unit = parse_unit(unit_file.read_text(encoding="utf-8"), str(unit_file))
        for warning in consistency_warnings(unit) + unit.notes():
            typer.echo(f"truthput: warning: {warning}", err=True)
        target = output or default_import_path(unit_file)
        if str(target) == "-":
            typer.echo(toml_text, nl=False)
            return
        if target.exists() and not force:
            raise InputError(f"{target}: already exists; use --force to overwrite or -o to choose another file")
        target.write_text(toml_text, encoding="utf-8")
        typer.echo(f"wrote {target}: baseline = the unit's ExecStart=; add [[variant]] tables, then `truthput run {target}`")

    @app.command("unit")
    def unit_(
        run_id: str = typer.Argument(..., help="Run id (or a unique prefix, or 'latest')."),
        variant: str = typer.Option(..., "--variant", help="The variant to write as a unit."),
        store: Path = typer.Option(Path("truthput.db"), "--store", help="Results store (SQLite)."),
        output: Optional[Path] = typer.Option(None, "-o", "--output", help="Unit file to write (default: print it)."),
        experiment_mode: bool = typer.Option(False, "--experiment-mode", help="Restart=no and no RestartSec= (a crash is a result, not a restart loop)."),
        description: Optional[str] = typer.Option(None, "--description", help="Replace the unit's Description=."),
        template: Optional[Path] = typer.Option(None, "--template", help="Unit to take the other sections from, when the run's experiment carries none."),
        force: bool = typer.Option(False, "--force", help="Overwrite the output file if it exists."),
    ) -> None:
        """Write a measured variant back as a systemd unit with the original unit's sections."""
        from truthput.errors import InputError

        text, warnings = export_variant_unit(store, run_id, variant, experiment_mode, description, template)
        for warning in warnings:
            typer.echo(f"truthput: warning: {warning}", err=True)
        if output is None:
            typer.echo(text, nl=False)
            return
        if output.exists() and not force:
            raise InputError(f"{output}: already exists; use --force to overwrite")
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {output}")
