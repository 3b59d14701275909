"""`truthput sim serve ...` and `truthput sim calibrate ...`: thin wrappers over truthput.sim.

`serve` passes every argument through untouched (vLLM's flags plus --sim-*), so the simulator
parses exactly the argv a real vLLM would; `--help` after `serve` shows the full flag list.
"""

from __future__ import annotations

import typer

_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def register(app: typer.Typer) -> None:
    sim_app = typer.Typer(name="sim", help="The embedded vLLM SIMULATOR (speeds from the physics model).",
                          no_args_is_help=True, add_completion=False)

    @sim_app.command("serve", context_settings=_PASSTHROUGH, add_help_option=False)
    def serve(ctx: typer.Context) -> None:
        """Serve a simulated vLLM: accepts vLLM's serve flags plus --sim-gpu/--sim-model/--sim-profile/--noise/--seed."""
        from truthput.sim.server import serve as sim_serve

        raise typer.Exit(sim_serve(list(ctx.args)))

    @sim_app.command("calibrate", context_settings=_PASSTHROUGH, add_help_option=False)
    def calibrate(ctx: typer.Context) -> None:
        """Fit the simulator's efficiency profile to measurements (truthput.sim.calibrate)."""
        from truthput.sim.__main__ import main as sim_main

        raise typer.Exit(sim_main(["calibrate", *ctx.args]))

    app.add_typer(sim_app, name="sim")
