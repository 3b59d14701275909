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
