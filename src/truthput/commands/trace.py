"""`truthput trace LOG`: a replayable trace (`--workload trace:FILE`, `prompt_source = "trace:FILE"`)
from a vLLM request log or a gateway's JSONL."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("trace")
    def trace_(
        log: Path = typer.Argument(..., help="A vLLM log (--enable-log-requests, VLLM_LOGGING_LEVEL=DEBUG; text or "
                                   "JSON) or a gateway's JSONL of requests (arrival time + body, usage where kept)."),
        output: Optional[Path] = typer.Option(None, "-o", "--output", help="Trace file to write (default: "
                                              "LOG's name + .trace.jsonl here; - prints it)."),
        force: bool = typer.Option(False, "--force", help="Overwrite the output file if it exists."),
    ) -> None:
        """Make a trace of the requests a server or gateway logged, timed from the first: replay it with
        `truthput load --workload trace:FILE` or `prompt_source = "trace:FILE"`."""
        from truthput.commands.units import write_or_print
        from truthput.load.traceconvert import convert_log

        converted = convert_log(log)
        target = output or Path(log.name.rsplit(".", 1)[0] + ".trace.jsonl")
        if write_or_print(None if str(target) == "-" else target, converted.jsonl(), force, ""):
            typer.echo(converted.line(str(target)))
        for note in converted.notes:
            typer.echo(f"truthput: note: {note}", err=True)
