"""`truthput roofline`: the physics floor of a GPU x model x TP config, and where measurements sit."""

from __future__ import annotations

from typing import Any, Optional

import typer

from truthput.hardware.dtypes import KV_DTYPE_BYTES


def parse_kv_dtype(text: str) -> float:
    """vLLM's --kv-cache-dtype names (or a byte count) -> bytes per KV element."""
    from truthput.errors import InputError

    key = text.strip().lower()
    if key in KV_DTYPE_BYTES:
        return KV_DTYPE_BYTES[key]
    try:
        value = float(key)
    except ValueError:
        raise InputError(f"--kv-dtype {text!r}: expected one of {', '.join(KV_DTYPE_BYTES)} or bytes per element") from None
    if value <= 0:
        raise InputError(f"--kv-dtype {text!r}: bytes per element must be positive")
    return value


def parse_number_list(text: str, option: str, cast: type = float) -> list[Any]:
    from truthput.errors import InputError

    try:
        values = [cast(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise InputError(f"{option} {text!r}: expected a comma-separated list of numbers") from None
    if not values:
        raise InputError(f"{option} {text!r}: empty list")
    return values


def register(app: typer.Typer) -> None:
    @app.command()
    def roofline(
        gpu: str = typer.Option(..., "--gpu", help="GPU name from the catalog, e.g. 'RTX 3090', 'H100 SXM'."),
        gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs serving the model (defaults to --tp)."),
        model: str = typer.Option(..., "--model", help="Named profile (e.g. qwen3.6-27b-5.5bit) or a model directory."),
        tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel degree (defaults to --gpus, else 1)."),
        kv_dtype: str = typer.Option("auto", "--kv-dtype", help="KV cache dtype: auto/bf16/fp16/fp8 or bytes."),
        context: int = typer.Option(2048, "--context", help="Context tokens held by each stream."),
        concurrency: str = typer.Option("1", "--concurrency", help="Comma-separated stream counts, e.g. 1,8."),
        spec_tokens: int = typer.Option(0, "--spec-tokens", help="Speculative tokens per step (k)."),
        acceptance_length: Optional[float] = typer.Option(None, "--acceptance-length", help="Measured mean acceptance length (1 + accepted/drafts)."),
        measured: Optional[str] = typer.Option(None, "--measured", help="Measured aggregate tok/s per concurrency level (server counter), comma-separated."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """Per-step lower bounds (weights, KV, compute, all-reduce) and throughput ceilings. Model figures, not measurements."""
        import json

        from truthput.report.console import make_console
        from rich.table import Table

        from truthput.analyze.roofline import place, roofline as build
        from truthput.errors import InputError
        from truthput.hardware.gpus import get_gpu
        from truthput.hardware.models import get_model

        card = get_gpu(gpu)
        profile = get_model(model)
        tp = tp if tp is not None else (gpus or 1)
        n_gpus = tp if gpus is None else gpus
        if n_gpus != tp:
            raise InputError(f"--gpus {n_gpus} with --tp {tp}: only one tensor-parallel replica (gpus == tp) is modelled")
        levels = parse_number_list(concurrency, "--concurrency", int)
        measured_values = parse_number_list(measured, "--measured") if measured else None
        if measured_values is not None and len(measured_values) != len(levels):
            raise InputError(f"--measured has {len(measured_values)} values for {len(levels)} --concurrency levels")
        kv_bytes = parse_kv_dtype(kv_dtype)

        results = []
        for i, level in enumerate(levels):
            roof = build(card, profile, tp, kv_bytes, context, level, spec_tokens, acceptance_length)
            placement = (place(roof, measured_values[i], model_bits=profile.bits_per_weight)
                         if measured_values else None)
            results.append((roof, placement))

        if as_json:
            typer.echo(json.dumps([{"roofline": r.to_dict(), "placement": p.to_dict() if p else None}
                                   for r, p in results], indent=2))
            return

        console = make_console()
        console.print(f"[bold]Roofline[/bold] {profile.name} on {tp}x {card.name} (TP={tp}), KV {kv_dtype}, "
                      f"{context} context tokens per stream, spec tokens {spec_tokens}. "
                      f"All figures: source [italic]model[/italic] (peak datasheet numbers), not measurements.")
        table = Table(show_lines=False)
        table.add_column("figure")
        for roof, _ in results:
            table.add_column(f"{roof.concurrency} stream{'s' if roof.concurrency > 1 else ''}", justify="right")
        first = results[0][0]
        for key, bound in first.bounds.items():
            label = f"floor: {key}{' (+)' if bound.additive else ''} ms/step"
            table.add_row(label, *[f"{r.bounds[key].seconds_per_step * 1e3:.2f}" for r, _ in results])
        table.add_row("weight passes/s", *[f"{r.weight_passes_per_s:.1f}" for r, _ in results])
        for key, ceil in first.ceilings.items():
            table.add_row(f"ceiling: {key} tok/s (per stream)",
                          *[f"{r.ceilings[key].aggregate_tokps:.1f} ({r.ceilings[key].per_stream_tokps:.1f})"
                            for r, _ in results])
        placed = [p for _, p in results if p is not None]
        if placed:
            table.add_row("measured tok/s (as given)", *[f"{p.measured_tokps:.1f}" for p in placed])
            table.add_row("tokens/step/stream used", *[f"{p.tokens_per_step_per_stream:g}" for p in placed])
            table.add_row("measured ms/step", *[f"{p.measured_step_s * 1e3:.1f}" for p in placed])
            table.add_row("% of tightest ceiling", *[f"{p.fraction_of_ceiling * 100:.0f}%" for p in placed])
            table.add_row("% of weight-streaming ceiling", *[f"{p.fraction_of_weight_streaming * 100:.0f}%" for p in placed])
            table.add_row("unexplained ms/step", *[f"{p.unexplained_step_s * 1e3:.1f}" for p in placed])
        console.print(table)
        for roof, p in results:
            if p is not None:
                console.print(f"{roof.concurrency} stream(s): {p.sentence}")
        for note in first.notes:
            console.print(f"[dim]note: {note}[/dim]")
        console.print("[dim](+) adds to the step; the others overlap inside max(weights + KV, compute). "
                      f"Sources: {'; '.join(card.sources)}; {card.interconnect.source}; {profile.source}[/dim]")
