"""`truthput sim serve ...` and `truthput sim calibrate ...`.

`serve` passes every argument through untouched (vLLM's flags plus --sim-*), so the simulator
parses exactly the argv a real vLLM would; `--help` after `serve` shows the full flag list.
`calibrate` fits the simulator's free constants to the server-counter figures of runs in the store
(or to points given by hand) and writes a profile that `[sim] profile = ...` / `--sim-profile` uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def serve(ctx: typer.Context) -> None:
    """Serve a simulated vLLM: accepts vLLM's serve flags plus --sim-gpu/--sim-model/--sim-profile/--noise/--seed."""
    from truthput.sim.server import serve as sim_serve

    raise typer.Exit(sim_serve(list(ctx.args)))

def calibrate(
    run_ids: Optional[list[str]] = typer.Argument(None, help="Runs whose counter figures to fit (ids or 'latest')."),
    store: Path = typer.Option(Path("truthput.db"), "--store", help="Results store (SQLite)."),
    point: Optional[list[str]] = typer.Option(None, "--point", help="A measured point by hand: tp=2,concurrency=8,spec_k=1,spec_method=mtp,acceptance=1.95,context=2048,tokps=339.9,kv=1 (add input=,output= for a closed loop's prompt/output lengths)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU (catalog name); default: the runs' \\[hardware]."),
    model: Optional[str] = typer.Option(None, "--model", help="Model profile or directory; default: the runs' \\[model]."),
    free: str = typer.Option("step_overhead_s,bw_frac,flops_frac,tp_latency_s", "--free", help="Constants to fit."),
    predict: Optional[list[str]] = typer.Option(None, "--predict", help="A config to predict with its 95% band, same keys as --point without tokps, e.g. tp=2,concurrency=16,spec_k=1,spec_method=mtp,acceptance=1.9 (input/output default to the runs' workload). Repeatable."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the profile JSON here (for \\[sim] profile / --sim-profile); its metadata keeps the fit's covariance and every --predict with its band."),
    start_spread: Optional[float] = typer.Option(None, "--start-spread", help="Relative spread of throughput from one server start to the next (default: the simulator's noise for simulated runs, else 0.02): trials of one start share it, so the fit weighs start-to-start differences less."),
    keep_outliers: bool = typer.Option(False, "--keep-outliers", help="Fit every trial, even windows far off the others (host stalls); by default they are left out and listed."),
) -> None:
    """Fit the simulator's free constants to measured runs; predict other configs with a band.

    \b
    What it fits: per-step overhead, achieved bandwidth and FLOP fractions, TP all-reduce
    latency: the constants of the physics model (truthput.hardware.physics) no datasheet gives.
    What it fits them to: each ok trial's server-counter tok/s over its timed window, against
    the model's price of the engine steps that window held (decodes, the prefills of requests
    that started in it, steps a finished stream sat out), rebuilt from the streamed chunks.
    Constants the runs cannot pin down are kept at their priors or reported with a wide band.
    \b
    How to use it:
      1. truthput run exp.toml --store runs.db       (real engine; vary tp / spec / concurrency)
      2. truthput sim calibrate latest --store runs.db --out fitted.json \\
           --predict tp=2,concurrency=16,spec_k=1,spec_method=mtp,acceptance=1.9
         prints each constant +- its band, and each prediction as tok/s with a 95% band [model]
      3. in an experiment: \\[server] engine = "sim" and \\[sim] profile = "fitted.json": the
         simulator now serves at the fitted speeds, so a config you have not run can be tried;
         its figures are SIMULATED, and the band from step 2 says how far to trust them.
    """
    from truthput.report.console import make_console

    from truthput.errors import InputError
    from truthput.sim.calibrate import fit, parse_point

    con = make_console()
    points = [parse_point(p) for p in (point or [])]
    simulated_runs = []
    lengths: dict[str, Any] = {}
    sim_noise: dict[str, Any] = {}
    if run_ids:
        from truthput.sim.runs import calibration_points
        from truthput.store.db import Store

        db = Store(store)
        pts, hw, lengths, sim_noise, skipped = calibration_points(db, list(run_ids), gpu, model)
        for label, why in skipped:
            con.print(f"  left out {label}: {why}", highlight=False)
        points += pts
        simulated_runs = [r for r in run_ids if db.run(db.resolve_run(r)).simulated]
        if len(hw) > 1 and not (gpu and model):
            raise InputError(f"runs differ in hardware/model {sorted(hw)}: give --gpu and --model")
        if hw and not gpu:
            gpu = next(iter(hw))[0]
        if hw and not model:
            model = next(iter(hw))[1]
    if not points:
        raise InputError("calibrate: give RUN_ID(s) with counter figures, or --point")
    if not gpu or not model:
        raise InputError("calibrate: give --gpu and --model (or runs whose experiments have [hardware]/[model])")
    if start_spread is None:
        start_spread = max(sim_noise.values()) if sim_noise and len(sim_noise) == len(run_ids or []) else 0.02
    result = fit(points, gpu, model, free=tuple(f for f in free.split(",") if f),
                 reject_outliers=bool(run_ids) and not keep_outliers, start_sigma=start_spread)
    if simulated_runs:
        con.print(f"[yellow]note[/yellow]: {', '.join(simulated_runs)} are SIMULATED runs: the fit recovers the "
                  "simulator's own constants (a self-test), not your hardware's.")
    con.print(f"{len(result.points)} points (server-counter tok/s) on {result.gpu.name} / {result.model.name}")
    eff = result.efficiency
    pinned = result.identified(0.05)
    for name in result.fitted:
        status = "" if pinned[name] else "  [yellow]weakly identified by these runs[/yellow]"
        con.print(f"  {name} = {getattr(eff, name):.6g} ± {result.band_95(name):.1%} (95%)  "
                  f"\\[model, fitted]{status}")
    for name, why in result.dropped.items():
        con.print(f"  {name} = {getattr(eff, name)!r}  \\[prior; not fitted: {why}]")
    for note in result.notes:
        con.print(f"  note: {note}", highlight=False, markup=False)
    con.print(f"  residual noise: {result.noise_log:.3f} in log tok/s ({result.noise_basis})")
    configs = []
    uniform = set(lengths.values())
    for text in predict or []:
        cfg = parse_point(text if "tokps=" in text else text + ",tokps=1")
        if cfg.output_tokens is None and len(uniform) == 1:
            inp, outp = next(iter(uniform))
            if outp is not None:
                from dataclasses import replace

                cfg = replace(cfg, input_tokens=inp, output_tokens=outp)
        configs.append(cfg)
        value, lo, hi = result.predict(cfg)
        loop = (f", closed loop {cfg.input_tokens:g} in / {cfg.output_tokens:g} out"
                if cfg.output_tokens is not None else ", steady decode")
        con.print(f"  predicted tp={cfg.tp} c={cfg.concurrency} k={cfg.spec_k}{loop}: {value:.1f} tok/s "
                  f"(95% band {lo:.1f}..{hi:.1f}) \\[model]", highlight=False)
    if out:
        con.print(f"profile written to {result.save_profile(out, configs)}")

def fit_ngram(
    run_id: Optional[str] = typer.Argument(None, help="A run with an n-gram variant (id or 'latest'); or give the counters by hand."),
    store: Path = typer.Option(Path("truthput.db"), "--store", help="Results store (SQLite)."),
    variant: Optional[str] = typer.Option(None, "--variant", help="The n-gram variant (default: the run's only one)."),
    drafts: Optional[float] = typer.Option(None, "--drafts", help="By hand: vllm:spec_decode_num_drafts_total over the load."),
    accepted: Optional[float] = typer.Option(None, "--accepted", help="By hand: vllm:spec_decode_num_accepted_tokens_total over the load."),
    generated: Optional[float] = typer.Option(None, "--generated", help="By hand: vllm:generation_tokens_total over the load."),
    spec_tokens: int = typer.Option(3, "--spec-tokens", help="By hand: num_speculative_tokens (k)."),
    lookup: str = typer.Option("5,5", "--lookup", help="By hand: prompt_lookup_min,prompt_lookup_max."),
    prompt_tokens: Optional[float] = typer.Option(None, "--prompt-tokens", help="Mean prompt tokens (default: the run's)."),
    output_tokens: Optional[float] = typer.Option(None, "--output-tokens", help="Mean output tokens (default: the run's)."),
    temperature: float = typer.Option(0.0, "--temperature", help="The load's sampling temperature (truthput's default: 0)."),
    vocab: int = typer.Option(32000, "--vocab", help="The model's vocabulary size."),
) -> None:
    """Fit the simulator's text repetition to a real run's n-gram counters.

    \b
    n-gram speculation drafts only where the text repeats; the simulator's text copies a share
    of its tokens in spans (--sim-repetition, --sim-copy-span; in an experiment \\[sim]
    repetition and copy_span). This finds the pair whose replay gives the run's drafts per
    generated token and mean acceptance length, so an n-gram A/B on the simulator finds what
    the real engine found. Both figures are [server counter]; the fit is [model].
    """
    from truthput.errors import InputError
    from truthput.report.console import make_console
    from truthput.sim.speculation import NgramCounters, fit_repetition

    con = make_console()
    if run_id:
        from truthput.sim.runs import ngram_counters_of_run
        from truthput.store.db import Store

        counters, spec_tokens, window, p_mean, o_mean = ngram_counters_of_run(Store(store, read_only=True), run_id, variant)
    else:
        if drafts is None or accepted is None or generated is None:
            raise InputError("fit-ngram: give a RUN_ID, or --drafts, --accepted and --generated")
        counters = NgramCounters(int(generated), int(drafts), 0, int(accepted))
        try:
            lo, hi = (int(v) for v in lookup.split(","))
        except ValueError:
            raise InputError(f"--lookup {lookup!r}: expected MIN,MAX (e.g. 2,4)") from None
        window, p_mean, o_mean = (lo, hi), None, None
    p_mean = prompt_tokens if prompt_tokens is not None else p_mean
    o_mean = output_tokens if output_tokens is not None else o_mean
    if p_mean is None or o_mean is None:
        raise InputError("fit-ngram: give --prompt-tokens and --output-tokens (the load's mean lengths)")
    if counters.generated <= 0:
        raise InputError("fit-ngram: no generated tokens in the counters")
    rep, got = fit_repetition(counters.drafts_per_token, counters.mean_acceptance_length, spec_tokens, window,
                              int(round(p_mean)), max(2, int(round(o_mean))), temperature, vocab)
    con.print(f"measured \\[server counter]: {counters.drafts_per_token:.3f} drafts per generated token, mean "
              f"acceptance length {counters.mean_acceptance_length:.2f} (k={spec_tokens}, lookup "
              f"{window[0]}..{window[1]}, {p_mean:.0f} prompt / {o_mean:.0f} output tokens, temperature "
              f"{temperature:g})", highlight=False)
    con.print(f"replayed \\[model]: {got.drafts_per_token:.3f} drafts per token, mean acceptance length "
              f"{got.mean_acceptance_length:.2f}", highlight=False)
    con.print(f"simulator flags: --sim-repetition {rep.share:g} --sim-copy-span {rep.span:g}", highlight=False)
    con.print(f"in an experiment: \\[sim] repetition = {rep.share:g}, copy_span = {rep.span:g}", highlight=False)


def register(app: typer.Typer) -> None:
    sim_app = typer.Typer(name="sim", help="The embedded vLLM SIMULATOR (speeds from the physics model).",
                          no_args_is_help=True, add_completion=False, rich_markup_mode=None)

    sim_app.command("serve", context_settings=_PASSTHROUGH, add_help_option=False)(serve)
    sim_app.command("calibrate")(calibrate)
    sim_app.command("fit-ngram")(fit_ngram)
    app.add_typer(sim_app, name="sim")
