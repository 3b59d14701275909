"""Every documented key and option does something: a key of the experiment file that no code reads,
or a command-line option its command never uses, fails here.

What "read" means (a static check, by the code's own syntax tree):
- an experiment key (a field of any model reachable from `Experiment`) is read where code outside
  experiment/file.py names it — an attribute (`exp.slo.e2e_ms`) or a string (`getattr`, a dumped
  section's key) — or where a property or method of its model that reads it (`self.target`) is
  itself named outside. A common name (`name`, `seed`) is found somewhere whether or not its own
  section's is read: the check bites on names of their own, the kind a new key mostly has.
- an option is read where its command's function body uses the parameter (or the option has a
  `callback`, which reads it).
Each check is shown to bite on a planted key (the negative controls below)."""

from __future__ import annotations

import ast
import inspect
import pathlib
import textwrap
import typing
from collections.abc import Callable, Iterator

import typer
from pydantic import BaseModel, Field

import truthput
from truthput.experiment.file import Experiment

SRC = pathlib.Path(truthput.__file__).parent
DEFINED_IN = SRC / "experiment" / "file.py"


def _models(model: type[BaseModel], seen: dict[type[BaseModel], None] | None = None) -> list[type[BaseModel]]:
    seen = {} if seen is None else seen
    if model not in seen:
        seen[model] = None
        for f in model.model_fields.values():
            for t in _types(f.annotation):
                if isinstance(t, type) and issubclass(t, BaseModel):
                    _models(t, seen)
    return list(seen)


def _types(ann: object) -> Iterator[object]:
    yield ann
    for a in typing.get_args(ann):
        yield from _types(a)


def names_read(paths: list[pathlib.Path]) -> set[str]:
    """Every attribute and string constant the files name."""
    out: set[str] = set()
    for p in paths:
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Attribute):
                out.add(n.attr)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                out.add(n.value)
    return out


def _members_reading(model: type[BaseModel]) -> dict[str, set[str]]:
    """For each property or method the model defines itself: the `self.` attributes it reads."""
    out: dict[str, set[str]] = {}
    for name, member in vars(model).items():
        fn = member.fget if isinstance(member, property) else member
        if not callable(fn) or name.startswith("__"):
            continue
        fn = getattr(fn, "__func__", fn)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError):
            continue
        out[name] = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Name) and n.value.id == "self"}
    return out


def unread_keys(root: type[BaseModel], reads: set[str]) -> list[str]:
    """Keys (Model.field) of `root`'s schema that nothing in `reads` names, directly or through a
    member of their model that is named."""
    out = []
    for model in _models(root):
        via = {f for member, fields in _members_reading(model).items() if member in reads for f in fields}
        for name, field in model.model_fields.items():
            if not {name, field.alias or name} & (reads | via):
                out.append(f"{model.__name__}.{field.alias or name}")
    return out


def _commands(app: typer.Typer, prefix: str = "") -> Iterator[tuple[str, Callable[..., object]]]:
    for c in app.registered_commands:
        assert c.callback is not None
        yield prefix + (c.name or c.callback.__name__), c.callback
    for g in app.registered_groups:
        assert g.typer_instance is not None
        yield from _commands(g.typer_instance, f"{prefix}{g.name} ")
    if app.registered_callback is not None and app.registered_callback.callback is not None:
        yield prefix.strip() or "truthput", app.registered_callback.callback


def unused_options(app: typer.Typer) -> list[str]:
    """`command: parameter` for each option or argument its command's body never uses."""
    out = []
    for name, fn in _commands(app):
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
        assert isinstance(tree, ast.FunctionDef)
        used = {n.id for stmt in tree.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        for param in inspect.signature(fn).parameters.values():
            if param.name not in used and getattr(param.default, "callback", None) is None:
                out.append(f"{name}: {param.name}")
    return out


def _product_files() -> list[pathlib.Path]:
    return [p for p in SRC.rglob("*.py") if p != DEFINED_IN]


def test_every_experiment_key_is_read_by_some_code() -> None:
    assert unread_keys(Experiment, names_read(_product_files())) == []


def test_every_command_line_option_is_used_by_its_command() -> None:
    from truthput.cli import app

    assert unused_options(app) == []


def test_a_planted_key_that_nothing_reads_is_found() -> None:
    class PlantedSection(BaseModel):
        quantile_of_nothing_read: float = 0.5
        """Documented, validated, and read by no code."""
        kept: int = Field(1, alias="kept_alias")

    class PlantedExperiment(Experiment):
        planted: PlantedSection = Field(default_factory=PlantedSection)

    reads = names_read(_product_files()) | {"planted", "kept"}
    assert unread_keys(PlantedExperiment, reads) == ["PlantedSection.quantile_of_nothing_read"]
    # the real schema's keys, less one that is read today, are found missing too
    assert "SloSection.e2e_ms" in unread_keys(Experiment, reads - {"e2e_ms"})


def test_a_planted_option_its_command_never_uses_is_found() -> None:
    app = typer.Typer()

    @app.command("planted")
    def planted(used: int = typer.Option(1, "--used"), ignored: int = typer.Option(2, "--ignored")) -> None:
        print(used)

    assert unused_options(app) == ["planted: ignored"]
