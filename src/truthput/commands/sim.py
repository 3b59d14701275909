"""`truthput sim serve ...` and `truthput sim calibrate ...`.

`serve` passes every argument through untouched (vLLM's flags plus --sim-*), so the simulator
parses exactly the argv a real vLLM would; `--help` after `serve` shows the full flag list.
`calibrate` fits the simulator's free constants to the server-counter figures of runs in the store
(or to points given by hand) and writes a profile that `[sim] profile = ...` / `--sim-profile` uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def calibration_points(store, run_ids: list[str]):
    """One point per (run, variant, concurrency): median counter tok/s of its ok trials.

    tp, KV dtype and speculation come from the variant's stored argv; the acceptance length from the
    spec-decode counters of the same trials; context from the workload (input + half the output).
    """
    import json
    import statistics

    from truthput.measure.figures import counter_tokps, fig
    from truthput.sim.calibrate import CalibrationPoint
    from truthput.spec.argv import ServerArgv, speculative_settings
    from truthput.spec.experiment import parse_experiment

    points = []
    hw = set()
    for rid in run_ids:
        rid = store.resolve_run(rid)
        run = store.run(rid)
        exp = parse_experiment(run["experiment_toml"], f"run {rid}")
        if exp.hardware is None or exp.model is None:
            from truthput.errors import SpecError

            raise SpecError(f"run {rid}: its experiment has no [hardware]/[model]; calibration needs both")
        hw.add((exp.hardware.gpu, exp.model.ref))
        wl = exp.workload
        ctx = (wl.input_tokens if isinstance(wl.input_tokens, int) else 512) + \
              (wl.output_tokens if isinstance(wl.output_tokens, int) else 256) / 2
        argv = {v["name"]: ServerArgv.parse(json.loads(v["argv_json"])) for v in store.variants(rid)}
        cells: dict[tuple[str, int], list[tuple[float, float | None]]] = {}
        for t in store.trial_results(rid):
            tokps = counter_tokps(t["results"])
            if t["status"] != "ok" or tokps is None:
                continue
            acc = fig(t["results"], "spec_decode", "window", "mean_acceptance_length")
            cells.setdefault((t["variant"], t["concurrency"]), []).append((tokps, acc))
        for (variant, conc), vals in sorted(cells.items()):
            a = argv[variant]
            tp = int(a.get("--tensor-parallel-size") or 1)
            kv = 1.0 if str(a.get("--kv-cache-dtype") or "auto").startswith("fp8") else 2.0
            spec = speculative_settings(a) or {}
            k = int(spec.get("num_speculative_tokens") or 0)
            accs = [x for _, x in vals if isinstance(x, (int, float))]
            points.append(CalibrationPoint(
                tp=tp, concurrency=conc, spec_k=k, spec_method=spec.get("method"),
                acceptance_length=statistics.median(accs) if (k and accs) else None,
                context_tokens=ctx, measured_tokps=statistics.median(v for v, _ in vals), kv_dtype_bytes=kv))
    return points, hw


def register(app: typer.Typer) -> None:
    sim_app = typer.Typer(name="sim", help="The embedded vLLM SIMULATOR (speeds from the physics model).",
                          no_args_is_help=True, add_completion=False)

    @sim_app.command("serve", context_settings=_PASSTHROUGH, add_help_option=False)
    def serve(ctx: typer.Context) -> None:
        """Serve a simulated vLLM: accepts vLLM's serve flags plus --sim-gpu/--sim-model/--sim-profile/--noise/--seed."""
        from truthput.sim.server import serve as sim_serve

        raise typer.Exit(sim_serve(list(ctx.args)))

    @sim_app.command("calibrate")
    def calibrate(
        run_ids: Optional[list[str]] = typer.Argument(None, help="Runs whose counter figures to fit (ids or 'latest')."),
        store: Path = typer.Option(Path("truthput.db"), "--store", help="Results store (SQLite)."),
        point: Optional[list[str]] = typer.Option(None, "--point", help="A measured point by hand: tp=2,concurrency=8,spec_k=1,spec_method=mtp,acceptance=1.95,context=2048,tokps=339.9,kv=1"),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU (catalog name); default: the runs' [hardware]."),
        model: Optional[str] = typer.Option(None, "--model", help="Model profile or directory; default: the runs' [model]."),
        free: str = typer.Option("step_overhead_s,bw_frac,flops_frac,tp_latency_s", "--free", help="Constants to fit."),
        predict: Optional[list[str]] = typer.Option(None, "--predict", help="Configs to predict with a band (same form as --point, tokps optional)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Write the profile JSON here (for [sim] profile / --sim-profile)."),
        seed_case: bool = typer.Option(False, "--seed-case", help="Print the seed case: calibrate on 66.9 tok/s at 1 stream, predict 8 streams."),
    ) -> None:
        """Fit the simulator's free constants (step overhead, achieved bandwidth/FLOP fractions, TP latency)."""
        from rich.console import Console

        from truthput.errors import SpecError
        from truthput.sim.calibrate import fit, parse_point, seed_case_report

        con = Console()
        if seed_case:
            con.print(seed_case_report(), highlight=False, markup=False)
            return
        points = [parse_point(p) for p in (point or [])]
        simulated_runs = []
        if run_ids:
            from truthput.store.db import Store

            db = Store(store)
            pts, hw = calibration_points(db, list(run_ids))
            points += pts
            simulated_runs = [r for r in run_ids if db.run(r)["simulated"]]
            if len(hw) > 1 and not (gpu and model):
                raise SpecError(f"runs differ in hardware/model {sorted(hw)}: give --gpu and --model")
            if hw and not gpu:
                gpu = next(iter(hw))[0]
            if hw and not model:
                model = next(iter(hw))[1]
        if not points:
            raise SpecError("calibrate: give RUN_ID(s) with counter figures, or --point")
        if not gpu or not model:
            raise SpecError("calibrate: give --gpu and --model (or runs whose experiments have [hardware]/[model])")
        result = fit(points, gpu, model, free=tuple(f for f in free.split(",") if f))
        if simulated_runs:
            con.print(f"[yellow]note[/yellow]: {', '.join(simulated_runs)} are SIMULATED runs: the fit recovers the "
                      "simulator's own constants (a self-test), not your hardware's.")
        con.print(f"{len(points)} points (server-counter tok/s) on {result.gpu.name} / {result.model.name}")
        eff = result.efficiency
        for name in result.fitted:
            con.print(f"  {name} = {getattr(eff, name):.6g} ± {result.std[name]:.2g}  [model, fitted]")
        for name, why in result.dropped.items():
            con.print(f"  {name} = {getattr(eff, name)!r}  [prior; not fitted: {why}]")
        for note in result.notes:
            con.print(f"  note: {note}")
        con.print(f"  residual noise: {result.noise_log:.3f} in log tok/s ({result.noise_basis})")
        for text in predict or []:
            cfg = parse_point(text if "tokps=" in text else text + ",tokps=0")
            value, lo, hi = result.predict(cfg)
            con.print(f"  predicted tp={cfg.tp} c={cfg.concurrency} k={cfg.spec_k}: {value:.1f} tok/s "
                      f"(95% band {lo:.1f}..{hi:.1f}) [model]")
        if out:
            con.print(f"profile written to {result.save_profile(out)}")

    app.add_typer(sim_app, name="sim")
