"""The simulator's inputs read from stored runs: calibration points (each ok trial's counter figure
with the engine steps its window held, rebuilt from the streamed chunks) and the n-gram counters
of a run's speculative variant.

Why here: the core never imports the simulator, so the reading of stored runs into the
simulator's own types lives beside it, and `truthput sim calibrate` / `fit-ngram` only call it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from truthput.store.db import Store


def trial_chunks(store: Store, trial_id: int, default_prompt: float) -> list[tuple[float, int, float, float, float]]:
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


def draft_tokens_per_step(window) -> float | None:
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
            chunks = trial_chunks(store, t.id, inp or 0.0)
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
            acc = _tokens_per_step(spec_window, inside, chunks) if k else None
            drafted = draft_tokens_per_step(spec_window) if k else None
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


def _tokens_per_step(spec_window: Any, inside: float | None, chunks: list[tuple[float, int, float, float, float]],
                     ) -> float | None:
    """Tokens a sequence emitted per engine step in the window, with speculation: generated /
    (generated - accepted) from the counters, every step counted (each emits one token of its own
    plus the drafts it accepted). The mean acceptance length (1 + accepted / drafts) counts only the
    steps that drafted: above this wherever the proposer found nothing to propose (n-gram outside
    repeated text); it stands where the counters give no accepted tokens, else the chunks' mean."""
    acc = (spec_window.mean_acceptance_length.number()
           if spec_window is not None and spec_window.mean_acceptance_length is not None else None)
    accepted = (spec_window.accepted_tokens.number()
                if spec_window is not None and spec_window.accepted_tokens is not None else None)
    if accepted is not None and inside and inside > accepted:
        return float(inside / (inside - accepted))
    if acc is None:
        decoded = [c[4] for c in chunks if c[3] > 0]
        return sum(decoded) / len(decoded) if decoded else None
    return float(acc)


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
