"""`truthput sim serve ...` and `truthput sim calibrate ...`.

`serve` passes every argument through untouched (vLLM's flags plus --sim-*), so the simulator
parses exactly the argv a real vLLM would; `--help` after `serve` shows the full flag list.
`calibrate` fits the simulator's free constants to the server-counter figures of runs in the store
(or to points given by hand) and writes a profile that `[sim] profile = ...` / `--sim-profile` uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import typer

if TYPE_CHECKING:
    from truthput.store.db import Store

_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _trial_chunks(store: Store, trial_id: int, default_prompt: float) -> list[tuple[float, int, float, float, float]]:
    """(arrival time, request, prompt tokens, tokens before, tokens in chunk) of every chunk that
    carried tokens. Token counts come from the running usage the server streams
    (continuous_usage_stats); without it each text chunk counts as one token."""
    from truthput.store.db import decode_chunks

    out = []
    for row in store.requests(trial_id):
        prompt = float(row.prompt_tokens or default_prompt)
        before = 0.0
        for t, running, text in zip(*decode_chunks(row.chunks_json)):
            now = float(running) if running is not None and running >= 0 else (before + 1.0 if text else before)
            if now > before:
                out.append((float(t), int(row.idx), prompt, before, now - before))
                before = now
    return out


def _mean_length(value, what: str) -> float | None:
    """The workload's mean length (an int or a distribution table), for steady-state predictions."""
    from truthput.load.workload import _as_dist

    try:
        return _as_dist(value, what).expected
    except Exception:  # a length the workload module cannot read: predictions then need input=/output=
        return None


class StorePoints(NamedTuple):
    """What calibration reads from the store: the points, the runs' (gpu, model) pairs, each
    variant's mean (input, output) lengths, simulated runs' per-start noise, and the trials left
    out with the reason (never silently)."""

    points: list
    hardware: set
    lengths: dict
    sim_noise: dict
    skipped: list


STALL_MARK = "could not keep up"  # the simulator's WARNING when the host starved it of CPU


def _counter_before_and_inside(res: Any) -> tuple[float | None, float | None]:
    """Counter increase from `pre` to `window_start`, and inside the window (summed over the
    in-window samples between window_start and window_end)."""
    rows = res.scrape_intervals.rows
    before = next((r.counter for r in rows if r.start_phase == "pre" and r.end_phase == "window_start"), None)
    inside: float | None = None
    opened = False
    for r in rows:
        if r.start_phase == "window_start":
            opened, inside = True, 0.0
        if opened:
            if r.counter is None or inside is None:
                return before, None
            inside += r.counter
            if r.end_phase == "window_end":
                return before, inside
    return before, None


def _served_model_dir(store: Store, rid: str) -> str | None:
    """The model directory the run's baseline served (its --model or positional model), when it
    holds a config.json: a profile can be built from it (config.json and the safetensors sizes)."""
    import os

    from truthput.experiment.argv import ServerArgv

    for v in store.variants(rid):
        argv = ServerArgv.parse(v.argv)
        candidates = [argv.get("--model"), *argv.positionals]
        for c in candidates:
            if isinstance(c, str) and os.path.isfile(os.path.join(c, "config.json")):
                return c
    return None


def _front_cpu_s(res, window_s: float) -> float | None:
    """CPU seconds the server's front end (the process truthput started) used in the window."""
    front = res.interference.server_front_cores
    cores = front.number() if front is not None else None
    return cores * window_s if cores is not None else None


def _draft_tokens_per_step(window) -> float | None:
    """Draft tokens the server verified per sequence-step in the window, from its counters: draft
    tokens over sequence-steps (those that drafted and those that did not). None without them."""
    if window is None or window.draft_tokens is None or window.drafts is None or window.undrafted_steps is None:
        return None
    steps = window.drafts.number() + window.undrafted_steps.number()
    return window.draft_tokens.number() / steps if steps > 0 else None


def calibration_points(store: Store, run_ids: list[str], gpu: str | None = None, model: str | None = None) -> StorePoints:
    """One point per ok trial: its server-counter tok/s over the steady-state window, and the
    engine steps that produced it.

    The steps (decode seqs, their context, prefill tokens) are rebuilt from the trial's streamed
    chunks (calibrate.observed_steps), so the model prices exactly the work the window held:
    decodes, the prefills of requests that started in it, the steps a finished stream sat out.
    tp, KV dtype and speculation come from the variant's stored argv; the acceptance length (tokens
    per engine step: generated / (generated - accepted) in the window) from the counters (used for
    predictions, not for pricing observed steps), and so are the draft tokens verified per
    sequence-step (the rows each observed step multiplied).
    A simulated trial during which the simulator logged that the host CPU could not keep up is
    left out: its window measures the host, not the physics. A run without [hardware]/[model]
    takes `gpu`/`model` (the command's --gpu/--model), and a missing [model] the model directory
    the run served, when it has a config.json.
    """
    from truthput.errors import InputError
    from truthput.hardware.dtypes import kv_dtype_bytes
    from truthput.sim.calibrate import CalibrationPoint, observed_steps
    from truthput.experiment.argv import ServerArgv, speculative_settings, whole_number
    from truthput.experiment.file import parse_experiment

    points = []
    hw = set()
    lengths: dict[str, tuple[float | None, float | None]] = {}
    sim_noise: dict[str, float] = {}
    skipped: list[tuple[str, str]] = []
    for rid in run_ids:
        rid = store.resolve_run(rid)
        run = store.run(rid)
        exp = parse_experiment(run.experiment_toml, f"run {rid}")
        run_gpu = exp.hardware.gpu if exp.hardware is not None else gpu
        run_model = exp.model.ref if exp.model is not None else (model or _served_model_dir(store, rid))
        if run_gpu is None or run_model is None:
            missing = " and ".join(x for x, v in (("[hardware] (or --gpu)", run_gpu), ("[model] (or --model)", run_model))
                                   if v is None)
            raise InputError(f"run {rid}: no {missing}; calibration needs the hardware and the model")
        hw.add((run_gpu, run_model))
        if run.simulated:
            sim_noise[rid] = float(exp.sim.noise) if exp.sim is not None else 0.0
        wl = exp.workload
        inp, outp = _mean_length(wl.input_tokens, "input_tokens"), _mean_length(wl.output_tokens, "output_tokens")
        argv = {v.name: ServerArgv.parse(v.argv) for v in store.variants(rid)}
        stalls: dict[int, list[float]] = {}
        if run.simulated:
            for st in store.starts(rid):
                stalls[st.id] = [float(line.t_mono) for line in store.logs(st.id) if STALL_MARK in line.line]
        for t in store.trial_results(rid):
            res = t.results
            tokps = res.throughput.counter_window.number()
            window_s = res.throughput.counter_window.extra("seconds")
            if not t.ok or tokps is None or not window_s:
                continue
            label = f"{rid}/{t.variant}/c{t.concurrency}/s{t.start_index}t{t.trial_index}"
            lag = 2.0 * float(exp.sim.log_stats_interval_s)  # the warning comes with the next stats line
            if t.start_id is not None and any(t.t0_mono <= x <= (t.t_end or t.t0_mono) + lag
                                              for x in stalls.get(t.start_id, [])):
                skipped.append((label, "the simulator logged that the host CPU could not keep up"))
                continue
            a = argv[t.variant]
            tp_text = a.get("--tensor-parallel-size")
            tp = (whole_number(tp_text) or 1) if isinstance(tp_text, str) else 1
            kv = kv_dtype_bytes(str(a.get("--kv-cache-dtype") or "auto"))
            spec = speculative_settings(a) or {}
            k = int(spec.get("num_speculative_tokens") or 0)
            chunks = _trial_chunks(store, t.id, inp or 0.0)
            start, end = res.window.start, res.window.end
            sent = {int(r.idx): float(r.t_start) for r in store.requests(t.id)}
            before, inside = _counter_before_and_inside(res)
            cut = (before, before + inside) if before is not None and inside is not None else None
            steps, tokens, edges, idle = (observed_steps(chunks, (start, end), sent, cut) if start and end
                                          else ([], 0.0, 0.0, 0.0))
            head, following = None, None
            if isinstance(edges, tuple):
                head, tail, following = edges
            else:
                tail = edges
            spec_window = res.spec_decode.window if res.spec_decode is not None else None
            acc = (spec_window.mean_acceptance_length.number()
                   if spec_window is not None and spec_window.mean_acceptance_length is not None else None)
            accepted = (spec_window.accepted_tokens.number()
                        if spec_window is not None and spec_window.accepted_tokens is not None else None)
            if k and accepted is not None and inside and inside > accepted:
                # tokens per engine step, every step counted: each step emits one token of its own
                # plus the drafts it accepted, so steps = generated - accepted. The mean acceptance
                # length (1 + accepted / drafts) counts only the steps that drafted: above this
                # wherever the proposer found nothing to propose (n-gram outside repeated text).
                acc = inside / (inside - accepted)
            if k and acc is None:
                decoded = [c[4] for c in chunks if c[3] > 0]
                acc = sum(decoded) / len(decoded) if decoded else None
            drafted = _draft_tokens_per_step(spec_window) if k else None
            lengths[t.variant] = (inp, outp)
            points.append(CalibrationPoint(
                tp=tp, concurrency=t.concurrency, spec_k=k, spec_method=spec.get("method"),
                acceptance_length=float(acc) if k and acc else None,
                context_tokens=(inp or 512.0) + (outp or 256.0) / 2, measured_tokps=tokps, kv_dtype_bytes=kv,
                input_tokens=inp, output_tokens=outp,
                steps=tuple(steps) if steps else None, window_s=window_s if steps else None,
                tail_s=tail if steps else 0.0, idle_s=idle if steps else 0.0,
                head_s=head if steps else None, following_step=following if steps else None,
                label=label,
                group=f"{rid}/start{t.start_id}",
                front_cpu_s=_front_cpu_s(res, window_s) if not run.simulated else None,
                draft_tokens_per_step=drafted))
    return StorePoints(points, hw, lengths, sim_noise, skipped)


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
    from truthput.report.terminal import make_console

    from truthput.errors import InputError
    from truthput.sim.calibrate import fit, parse_point

    con = make_console()
    points = [parse_point(p) for p in (point or [])]
    simulated_runs = []
    lengths: dict = {}
    sim_noise: dict = {}
    if run_ids:
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
    from truthput.report.terminal import make_console
    from truthput.sim.speculation import NgramCounters, fit_repetition

    con = make_console()
    if run_id:
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


def ngram_counters_of_run(store: Store, run_id: str, variant: str | None):
    """(counters, k, lookup window, mean prompt tokens, mean output tokens) summed over the ok
    trials of a run's n-gram variant, from the spec-decode counter deltas each trial recorded."""
    from truthput.errors import InputError
    from truthput.sim.speculation import NgramCounters, lookup_window

    rid = store.resolve_run(run_id)
    trials = [t for t in store.trial_results(rid) if t.ok and t.results.speculative
              and "ngram" in str(t.results.speculative.get("method", "")).lower()]
    names = sorted({t.variant for t in trials})
    if variant is None and len(names) > 1:
        raise InputError(f"run {rid} has several n-gram variants {names}: give --variant")
    if variant is not None:
        trials = [t for t in trials if t.variant == variant]
    if not trials:
        raise InputError(f"run {rid}: no ok trial of an n-gram variant{' ' + repr(variant) if variant else ''}")
    drafts = accepted = emitted = 0.0
    for t in trials:
        sd = t.results.spec_decode
        iv = sd.trial if sd is not None else None
        if iv is None or iv.drafts is None or iv.accepted_tokens is None or iv.undrafted_steps is None:
            continue
        d, a, u = iv.drafts.value, iv.accepted_tokens.value, iv.undrafted_steps.value
        if d is None or a is None or u is None:
            continue
        drafts, accepted, emitted = drafts + d, accepted + a, emitted + d + a + u
    spec = trials[0].results.speculative or {}
    k = int(spec.get("num_speculative_tokens") or 0)
    prompts, outputs = [], []
    for t in trials:
        for row in store.requests(t.id):
            if row.prompt_tokens:
                prompts.append(float(row.prompt_tokens))
            if row.completion_tokens:
                outputs.append(float(row.completion_tokens))
    mean = (lambda xs: sum(xs) / len(xs) if xs else None)
    return (NgramCounters(int(emitted), int(drafts), 0, int(accepted)), k, lookup_window(spec),
            mean(prompts), mean(outputs))
