"""A stored run's variants as systemd units: the baseline's own unit with the variant's argv, so
a winner can be installed without retyping a flag."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from truthput.store.db import Store

if TYPE_CHECKING:
    from truthput.analyze.summary import RunSummary


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
    import tomllib

    from truthput.errors import InputError, StoreError
    from truthput.experiment.argv import ServerArgv
    from truthput.experiment.unit import consistency_warnings, guess_engine, parse_unit, render_unit, unwrap_shell
    from truthput.store.db import Store

    db = Store(store_path, read_only=True)
    try:
        row = db.run(run_id)
        full_id = row.id
        variants = {v.name: v for v in db.variants(full_id)}
    finally:
        db.close()
    if variant not in variants:
        names = ", ".join(variants) or "none"
        raise StoreError(f"{store_path}: run {full_id} has no variant {variant!r} (variants: {names})")
    stored = variants[variant]
    argv = stored.argv
    env = stored.env

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
            experiment = tomllib.loads(row.experiment_toml)
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


def verdict_on_variant(db: Store, run_id: str, variant: str | None) -> tuple[str, list[str]]:
    """(the variant to write, what the verdict said against it): `RunSummary.said_of`."""
    from truthput.errors import InputError
    from truthput.report.data import run_summary

    try:
        variant, warnings = run_summary(db, run_id).said_of(variant, where=f" in run {run_id}")
    except ValueError as exc:
        raise InputError(f"run {run_id}: {exc}; choose one with --variant NAME") from None
    return variant, warnings


def write_winner_units(db: Store, store_path: Path, run_id: str, folder: Path,
                       summary: RunSummary | None = None) -> list[Path]:
    """Each variant the verdict names the winner, as a systemd unit, when the baseline came from one."""
    from truthput.report.data import run_summary

    exp = db.experiment(run_id)[0]
    from_unit = exp is not None and exp.server.systemd_unit is not None
    winners = (summary or run_summary(db, run_id)).verdict.winners()
    if not winners or not from_unit:
        return []
    out = []
    folder.mkdir(parents=True, exist_ok=True)
    for name in winners:
        text, _warnings = export_variant_unit(store_path, run_id, name, description=None)
        path = folder / f"{run_id}-{name}.service"
        path.write_text(text)
        out.append(path)
    return out
