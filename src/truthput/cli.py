"""The `truthput` command line.

Each sub-command lives in `truthput.commands.<name>` and exposes `register(app)`. Command modules
import heavy libraries (scipy, jinja2, the simulator) inside their functions, never at module level,
so `truthput load` starts fast and `--help` is instant.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

import truthput.commands as _commands_pkg

app = typer.Typer(
    name="truthput",
    help="A/B-test LLM inference server configurations and report the throughput that is really there.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    for info in sorted(pkgutil.iter_modules(_commands_pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"truthput.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_all()


def main() -> None:
    """Console entry point: clear one-line errors, non-zero exit codes."""
    from truthput.errors import TruthputError

    try:
        app()
    except TruthputError as exc:
        print(f"truthput: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("truthput: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
