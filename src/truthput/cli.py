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
    rich_markup_mode=None,  # help texts are plain: `[[claim]]` and `[slo]` are words, not markup
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"truthput {version('truthput')}")
        except PackageNotFoundError:
            typer.echo("truthput (not installed as a package)")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print truthput's version and exit."),
) -> None:
    """A/B-test LLM inference server configurations and report the throughput that is really there."""


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
    except Exception as exc:  # the environment failing under us: one line, never a traceback
        import errno
        import sqlite3

        full = (isinstance(exc, sqlite3.OperationalError) and ("full" in str(exc) or "disk I/O" in str(exc))) or (
            isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG))
        if full:
            print(f"truthput: error: could not write ({exc}: a full disk, a file-size limit or a failing disk); "
                  "every trial committed before this is kept: free space, then resume with "
                  "`truthput run --resume latest`", file=sys.stderr)
            sys.exit(1)
        if isinstance(exc, sqlite3.Error):
            print(f"truthput: error: results store: {type(exc).__name__}: {exc}", file=sys.stderr)
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
