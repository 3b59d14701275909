"""docs/cli.md names every command and every option of the CLI as it is (regenerate it with
scripts/make_cli_doc.py): a command or option added without its entry fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from truthput.cli import app

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _commands() -> list[tuple[str, Any]]:
    root: Any = typer.main.get_command(app)
    ctx = root.context_class(root)
    out = []
    for name in root.list_commands(ctx):
        cmd = root.get_command(ctx, name)
        if hasattr(cmd, "list_commands"):
            sub_ctx = cmd.context_class(cmd)
            out += [(f"{name} {s}", cmd.get_command(sub_ctx, s)) for s in cmd.list_commands(sub_ctx)]
        else:
            out.append((name, cmd))
    return out


def test_every_command_and_option_has_its_entry_in_docs_cli():
    doc = DOC.read_text()
    missing = []
    for name, cmd in _commands():
        head = f"`truthput {name}`"
        if head not in doc:
            missing.append(head)
            continue
        section = doc.split(head, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
        for p in cmd.params:
            if p.param_type_name == "option" and p.name != "help":
                for opt in p.opts:
                    if f"`{opt}`" not in section:
                        missing.append(f"{name} {opt}")
    assert not missing, f"docs/cli.md lacks {missing}: run scripts/make_cli_doc.py"
    assert len(_commands()) >= 15


def test_every_experiment_key_has_its_entry_and_meaning_in_docs_experiment():
    """docs/experiment.md is what scripts/make_experiment_doc.py writes from the model: a key added
    to the experiment file's model without a meaning, or a doc not regenerated, fails here; and
    every key of every table of the model (walked here, not from the script's list) has its row."""
    import sys

    from pydantic import BaseModel

    from truthput.experiment.file import Experiment

    sys.path.insert(0, str(DOC.parents[1] / "scripts"))
    from make_experiment_doc import entries, render

    doc = (DOC.parent / "experiment.md").read_text()
    assert doc == render(), "docs/experiment.md is stale: run scripts/make_experiment_doc.py"
    rows = {(t, k): m for t, k, _, _, m in entries()}
    assert not [key for key, meaning in rows.items() if not meaning.strip()]

    def keys(cls: type[BaseModel]) -> set[str]:
        out = set()
        for name, info in cls.model_fields.items():
            out.add(info.alias or name)
        return out

    documented = {k for _, k in rows}
    for name, info in Experiment.model_fields.items():
        section = info.annotation
        inner = [a for a in getattr(section, "__args__", (section,)) if isinstance(a, type)]
        for cls in inner:
            target = getattr(cls, "__args__", None)
            cls = target[0] if target else cls
            if isinstance(cls, type) and issubclass(cls, BaseModel):
                missing = keys(cls) - documented
                assert not missing, f"[{name}] keys without an entry in docs/experiment.md: {sorted(missing)}"
