"""Write docs/cli.md from the CLI itself: every command, its help, every option with its default.

Run:  .venv/bin/python scripts/make_cli_doc.py   (tests/test_docs.py fails when a command or an
option has no entry, so regenerate after changing the CLI).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from truthput.cli import app

OUT = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _param(p: Any) -> str:
    if p.param_type_name == "argument":
        name = f"`{(p.metavar or p.name).upper()}`" + ("" if p.required else " (optional)")
        return f"- {name}: {getattr(p, 'help', '') or ''}".rstrip()
    names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
    default = "" if p.default in (None, False, ()) or p.is_flag and not p.default else f" (default: `{p.default}`)"
    return f"- {names}: {(p.help or '').strip()}{default}"


def render() -> str:
    root: Any = typer.main.get_command(app)
    ctx = root.context_class(root)
    lines = ["# truthput commands", "",
             "Generated from the CLI by `scripts/make_cli_doc.py`; `truthput COMMAND --help` says the same.",
             "Exit codes: 0 done; 1 nothing was measured; 2 bad input (a file, a flag, a name: one line says",
             "what and where); 3 a server could not start, or a variant never measured; 4 a measurement",
             "could not be made; 130 or 128+signal when stopped.", ""]
    for name in sorted(root.list_commands(ctx)):
        cmd = root.get_command(ctx, name)
        assert cmd is not None
        lines += [f"## `truthput {name}`", "", (cmd.help or "").strip().split("\n\n")[0], ""]
        if hasattr(cmd, "list_commands"):
            sub_ctx = cmd.context_class(cmd)
            for sub in sorted(cmd.list_commands(sub_ctx)):
                sc = cmd.get_command(sub_ctx, sub)
                assert sc is not None
                lines += [f"### `truthput {name} {sub}`", "", (sc.help or "").strip().split("\n\n")[0], ""]
                lines += [_param(p) for p in sc.params if p.name != "help"] + [""]
        else:
            lines += [_param(p) for p in cmd.params if p.name != "help"] + [""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)
