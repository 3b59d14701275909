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


def _trial_chunks(store, trial_id: int, default_prompt: float) -> list[tuple[float, int, float, float, float]]:
    """(arrival time, request, prompt tokens, tokens before, tokens in chunk) of every chunk that
    carried tokens. Token counts come from the running usage the server streams
    (continuous_usage_stats); without it each text chunk counts as one token."""
    import json

    out = []
    for row in store.requests(trial_id):
        prompt = float(row["prompt_tokens"] or default_prompt)
        before = 0.0
        for t, running, text in json.loads(row["chunks_json"]):
            now = float(running) if running is not None else (before + 1.0 if text else before)
            if now > before:
                out.append((float(t), int(row["idx"]), prompt, before, now - before))
                before = now
    return out


def calibration_points(store, run_ids: list[str]):
    """One point per ok trial: its server-counter tok/s over the steady-state window, and the
    engine steps that produced it.

    The steps (decode seqs, their context, prefill tokens) are rebuilt from the trial's streamed
    chunks (calibrate.observed_steps), so the model prices exactly the work the window held:
    decodes, the prefills of requests that started in it, the steps a finished stream sat out.
    tp, KV dtype and speculation come from the variant's stored argv; the acceptance length from
    the spec-decode counters of the trial (used for predictions, not for pricing observed steps).
    Returns (points, {(gpu, model)}, {variant: workload (input, output) lengths}).
    """
    import json

    from truthput.errors import SpecError
    from truthput.measure.figures import counter_tokps, fig
    from truthput.sim.calibrate import CalibrationPoint, observed_steps
    from truthput.spec.argv import ServerArgv, speculative_settings
    from truthput.spec.experiment import parse_experiment

    points = []
    hw = set()
    lengths: dict[str, tuple[float | None, float | None]] = {}
    for rid in run_ids:
        rid = store.resolve_run(rid)
        run = store.run(rid)
        exp = parse_experiment(run["experiment_toml"], f"run {rid}")
        if exp.hardware is None or exp.model is None:
            raise SpecError(f"run {rid}: its experiment has no [hardware]/[model]; calibration needs both")
        hw.add((exp.hardware.gpu, exp.model.ref))
        wl = exp.workload
        inp = float(wl.input_tokens) if isinstance(wl.input_tokens, int) else None
        outp = float(wl.output_tokens) if isinstance(wl.output_tokens, int) else None
        argv = {v["name"]: ServerArgv.parse(json.loads(v["argv_json"])) for v in store.variants(rid)}
        rows = {row["id"]: row for row in store.trials(rid)}
        for t in store.trial_results(rid):
            tokps = counter_tokps(t["results"])
            window_s = fig(t["results"], "throughput", "counter_window", "seconds")
            if t["status"] != "ok" or tokps is None or not window_s:
                continue
            row = rows[t["id"]]
            a = argv[t["variant"]]
            tp = int(a.get("--tensor-parallel-size") or 1)
            kv = 1.0 if str(a.get("--kv-cache-dtype") or "auto").startswith("fp8") else 2.0
            spec = speculative_settings(a) or {}
            k = int(spec.get("num_speculative_tokens") or 0)
            chunks = _trial_chunks(store, row["id"], inp or 0.0)
            start = fig(t["results"], "window", "start")
            end = fig(t["results"], "window", "end")
            steps, tokens, tail = observed_steps(chunks, (start, end)) if start and end else ([], 0.0, 0.0)
            acc = fig(t["results"], "spec_decode", "window", "mean_acceptance_length")
            if k and not isinstance(acc, (int, float)):
                decoded = [c[4] for c in chunks if c[3] > 0]
                acc = sum(decoded) / len(decoded) if decoded else None
            lengths[t["variant"]] = (inp, outp)
            points.append(CalibrationPoint(
                tp=tp, concurrency=t["concurrency"], spec_k=k, spec_method=spec.get("method"),
                acceptance_length=float(acc) if k and acc else None,
                context_tokens=(inp or 512.0) + (outp or 256.0) / 2, measured_tokps=tokps, kv_dtype_bytes=kv,
                input_tokens=inp, output_tokens=outp,
                steps=tuple(steps) if steps else None, window_s=window_s if steps else None,
                tail_s=tail if steps else 0.0,
                label=f"{rid}/{t['variant']}/c{t['concurrency']}/s{row['start_index']}t{row['trial_index']}"))
    return points, hw, lengths


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
            pts, hw, _lengths = calibration_points(db, list(run_ids))
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
