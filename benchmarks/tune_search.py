"""Benchmark: real trials a search needs to reach the best configuration, with and without the simulator.

The "real" server is a stand-in: the simulator in virtual time with a model-form difference hidden
from the tuner -- an extra CPU cost per running sequence per step (a batch-dependent term the
tuner's physics has at zero) and a different speculative acceptance process (a faster decay over
draft positions than the tuner's default) -- plus 3% noise per server start. The tuner's own
simulator is the default one. The space is the seed case's (Qwen 27B at 5.5 bits on 2x RTX 3090,
TP=2): MTP draft tokens x --max-num-seqs x --max-num-batched-tokens x --tensor-parallel-size, at a fixed
concurrency; the noise-free best is found by evaluating every configuration on the stand-in.

One real trial = one server start measured once. For each method and seed: the real trials until a
configuration within 2% of the noise-free best has been measured (a search cannot know it reached it;
this is what it cost to get there), and server-minutes at a stated cost per trial. Methods: grid (the
file's order), random (without replacement), plain optuna TPE on real trials, and truthput tune's
search (`truthput.tune.search.SimFirst`: the whole space ranked on the simulator, the best
unmeasured candidates measured two at a time, every real trial refitting the correction).

Run: .venv/bin/python benchmarks/tune_search.py [--seeds 5] [--hidden-per-seq-s 0.0015]

The window is long (240 s after a 20 s warm-up, virtual) because in a closed loop of equal
requests the streams move in step. A window comparable to one request cycle catches it at a phase
that small timing differences move, and makes the landscape jagged.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from truthput.experiment.file import TuneSection, load_experiment
from truthput.load.virtual import VirtualLoad
from truthput.tune.screen import batch_lines, run_batch, screen, to_evaluation
from truthput.tune.search import Evaluation, SimFirst, objective_value
from truthput.tune.space import Space

ROOT = Path(__file__).resolve().parents[1]
SPACE = {
    "param": [
        {"flag": "--spec-tokens", "values": ["off", 1, 2, 3, 4, 5, 6]},
        {"flag": "--max-num-seqs", "values": [4, 12, 24, 96]},
        {"flag": "--max-num-batched-tokens", "values": [512, 2048, 4096, 8192]},
        {"flag": "--tensor-parallel-size", "values": [1, 2]},
    ],
    "level": 64,
}
LOAD = VirtualLoad(concurrency=64, input_tokens=1024, output_tokens=256, duration_s=240.0, warmup_s=20.0)
HIDDEN_PER_SEQ_S = 0.0015  # the stand-in's extra CPU cost per running sequence per step
HIDDEN_ACCEPTANCE = "0.7,0.3,0.2,0.1,0.1"  # the stand-in's acceptance per draft position
REAL_NOISE = 0.03
REPLICATES = 4  # noisy starts per configuration on the stand-in (a trial takes the next one)
TRIAL_MINUTES = 3.0  # server-minutes per real trial: a 27B start (~2 min) + warm-up + a 30-60 s window
CAP = 150
TOLERANCE = 0.02


def stand_in_argv(profile: Path) -> list[str]:
    return ["--sim-profile", str(profile), "--sim-acceptance", HIDDEN_ACCEPTANCE]


def evaluate_stand_in(exp, space: Space, configs, profile: Path, noise: float, starts: int, seed: int):
    lines = batch_lines(exp, space, configs, LOAD, starts, seed, stand_in_argv(profile))
    for line in lines:  # the stand-in's own noise, not the experiment's
        argv = line["argv"]
        argv[argv.index("--noise") + 1] = repr(noise)
    return [to_evaluation(c, r, "stand-in") for c, r in zip(configs, run_batch(lines))]


def trials_to_reach(order_values, good: set[str]) -> int:
    for i, key in enumerate(order_values, 1):
        if key in good:
            return i
    return CAP + 1


def run_grid(space, grid, good) -> int:
    return trials_to_reach([space.key(c) for c in grid][:CAP], good)


def run_random(space, grid, good, seed) -> int:
    order = list(grid)
    random.Random(seed).shuffle(order)
    return trials_to_reach([space.key(c) for c in order][:CAP], good)


class StandIn:
    """A real trial on the stand-in: the next noisy replicate of that configuration."""

    def __init__(self, space, replicates: dict[str, list[Evaluation]]) -> None:
        self.space = space
        self.replicates = replicates
        self.used: dict[str, int] = {}

    def trial(self, config) -> Evaluation:
        key = self.space.key(config)
        i = self.used.get(key, 0)
        self.used[key] = i + 1
        reps = self.replicates[key]
        return reps[i % len(reps)]


def run_tpe(space, tune, replicates, good, seed) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = space.distributions()
    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    real = StandIn(space, replicates)
    for i in range(1, CAP + 1):
        t = study.ask(dists)
        config = {f: t.params[f] for f in space.flags}
        e = real.trial(config)
        t.set_constraint("failed to start", 0.0 if e.ok else 1.0)
        study.tell(t, objective_value(e, tune))
        if space.key(config) in good:
            return i
    return CAP + 1


def run_sim_first(space, tune, sim_evals, replicates, good, baseline, per_round=2) -> tuple[int, int, float | None]:
    """Trials to reach, trials when the search stops by itself, rank correlation at the end."""
    search = SimFirst(space, tune)
    for e in sim_evals:
        search.add_sim(e)
    real = StandIn(space, replicates)
    trials = 1
    search.add_real(real.trial(baseline))  # the incumbent, measured as every tune does
    reached = trials if space.key(baseline) in good else None
    stopped = None
    while trials < CAP:
        if stopped is None and search.done():
            stopped = trials
            if reached is not None:
                break
        cands = search.next_candidates(per_round)
        if not cands:
            break
        for c in cands:
            trials += 1
            search.add_real(real.trial(c.config))
            if reached is None and space.key(c.config) in good:
                reached = trials
    rho, _ = search.rank_agreement()
    return (reached or CAP + 1), (stopped or trials), rho


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--hidden-per-seq-s", type=float, default=HIDDEN_PER_SEQ_S,
                    help="the stand-in's extra CPU cost per running sequence per step (the tuner's is 0)")
    args = ap.parse_args(argv)
    t_start = time.time()
    exp, _ = load_experiment(ROOT / "examples" / "quickstart.toml")
    tune = TuneSection.model_validate(SPACE)
    space = Space.of(tune)
    grid = space.grid()
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "hidden.json"
        profile.write_text(json.dumps({"format": "truthput-sim-profile/1",
                                       "efficiency": {"per_seq_overhead_s": args.hidden_per_seq_s},
                                       "metadata": {"note": "the stand-in's hidden batch-dependent cost"}}))
        t0 = time.time()
        truth = evaluate_stand_in(exp, space, grid, profile, 0.0, 1, 0)
        t_truth = time.time() - t0
        t0 = time.time()
        reps = evaluate_stand_in(exp, space, grid, profile, REAL_NOISE, REPLICATES, 1000)
        t_reps = time.time() - t0
    t0 = time.time()
    exp.sim.noise = 0.0
    sim_evals = screen(exp, space, grid, LOAD, starts=1, seed=0)
    t_screen = time.time() - t0
    replicates = {}
    for e in reps:
        key = space.key(e.config)
        replicates[key] = [Evaluation(e.config, "stand-in", e.ok, [v], e.ttft_p99_s, e.itl_p99_s, e.failure, e.reason, 1)
                           for v in (e.values or [0.0])] if e.ok else [e]
    values = sorted(((objective_value(e, tune), space.key(e.config)) for e in truth), reverse=True)
    best, second = values[0][0], values[1][0]
    good = {k for v, k in values if v >= best * (1 - TOLERANCE)}
    failed = sum(1 for e in truth if not e.ok)
    sims = {space.key(e.config): objective_value(e, tune) for e in sim_evals}
    from truthput.tune.search import spearman

    keys = [k for _, k in values]
    rho_all = spearman([sims[k] for k in keys], [v for v, _ in values])
    print(f"space: {len(grid)} configurations ({failed} fail to start on the stand-in), concurrency {LOAD.concurrency}, "
          f"{LOAD.input_tokens} in / {LOAD.output_tokens} out tokens")
    print(f"noise-free best on the stand-in: {values[0][1]} at {best:.1f} tok/s; runner-up {values[1][1]} at "
          f"{second:.1f} ({(best / second - 1):.1%} behind); configurations within 2%: {len(good)}")
    sim_best = max(sims, key=lambda k: sims[k])
    truth_of = {k: v for v, k in values}
    print(f"the tuner's simulator ranks best: {sim_best} (on the stand-in {truth_of[sim_best]:.1f} tok/s, "
          f"{truth_of[sim_best] / best - 1:+.1%} from the best); rank correlation over the space {rho_all:.2f}")
    print(f"virtual-time cost: stand-in truth {len(grid)} configs in {t_truth:.1f} s; tuner's screen {t_screen:.1f} s; "
          f"{REPLICATES} noisy starts each in {t_reps:.1f} s")
    baseline = {"--spec-tokens": 3, "--max-num-seqs": 96, "--max-num-batched-tokens": 8192, "--tensor-parallel-size": 2}
    results: dict[str, list[int]] = {"grid": [], "random": [], "optuna TPE (real trials only)": [],
                                     "truthput tune (simulator first)": []}
    stops, rhos = [], []
    for seed in range(args.seeds):
        results["grid"].append(run_grid(space, grid, good))
        results["random"].append(run_random(space, grid, good, seed))
        results["optuna TPE (real trials only)"].append(run_tpe(space, tune, rotate(replicates, seed), good, seed))
        reached, stopped, rho = run_sim_first(space, tune, sim_evals, rotate(replicates, seed), good, baseline)
        results["truthput tune (simulator first)"].append(reached)
        stops.append(stopped)
        rhos.append(rho)
    print()
    print(f"| method | real trials to reach within 2% of the best (median of {args.seeds} seeds) | per seed | "
          f"server-minutes (median, {TRIAL_MINUTES:g} min per trial) |")
    print("|---|---:|---|---:|")
    for name, vals in results.items():
        med = statistics.median(vals)
        shown = ", ".join(str(v) if v <= CAP else f">{CAP}" for v in vals)
        print(f"| {name} | {med:g}{'+' if med > CAP else ''} | {shown} | {med * TRIAL_MINUTES:g} |")
    tpe = statistics.median(results["optuna TPE (real trials only)"])
    ours = statistics.median(results["truthput tune (simulator first)"])
    print()
    print(f"truthput tune / plain TPE real trials: {ours / tpe:.2f} (target <= 0.33)")
    print(f"truthput tune stops by itself after a median of {statistics.median(stops):g} real trials; rank correlation "
          f"simulator vs stand-in over the configurations it measured: median "
          f"{statistics.median([r for r in rhos if r is not None]) if any(r is not None for r in rhos) else float('nan'):.2f}")
    print(f"benchmark wall time {time.time() - t_start:.0f} s")
    return 0


def rotate(replicates: dict[str, list[Evaluation]], seed: int) -> dict[str, list[Evaluation]]:
    """Each seed sees the noisy starts in another order."""
    out = {}
    for k, reps in replicates.items():
        r = seed % len(reps)
        out[k] = reps[r:] + reps[:r]
    return out


if __name__ == "__main__":
    sys.exit(main())
