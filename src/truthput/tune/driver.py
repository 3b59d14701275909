"""`truthput tune`: screen the space on the simulator, then decide among the best on the real server.

1. Screen: every configuration of the space (or `screen` of them, proposed by optuna's TPE, or
   NSGA-II for a Pareto objective) is evaluated on the simulator in virtual time. Each evaluation is
   a trial of the optuna study `<name>/simulator`; one that cannot start (out of memory, an invalid
   combination) is a result with objective 0 and a violated constraint, so TPE learns the region.
2. Rounds on the real server: the best unmeasured candidates by corrected prediction, beside the
   baseline, as one ordinary experiment run (the same trial pipeline, interleaved starts, sequential
   stopping, Hochberg-adjusted verdict). Each measured configuration becomes a trial of the study
   `<name>/server`, and the correction the simulator's ranking gets is refitted from them.
3. Stop when the rounds or the budget are spent, or when no unmeasured configuration could still
   beat the best one measured; the choice is the configuration the verdict decided faster than the
   baseline by the most (the baseline, when none was).

The studies live in optuna's own storage, a SQLite file beside the results store
(`truthput.db` -> `truthput.optuna.db`); the rounds are runs of the results store. Killed at any
point, the same command continues: screened configurations are not evaluated again, a round's run
resumes without redoing its finished trials.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Callable

from truthput.errors import InputError
from truthput.experiment.argv import ServerArgv
from truthput.experiment.engines import metric_family
from truthput.analyze.summary import RunSummary
from truthput.experiment.file import Experiment, TuneSection, VariantSection, parse_experiment
from truthput.tune.screen import screen, screen_load
from truthput.experiment.levels import Level, Rate, is_rate
from truthput.experiment.levels import level_label
from truthput.tune.search import (Evaluation, SimFirst, objective_figure, objective_metric, objective_value,
                                  pareto_front, screen_field)
from truthput.tune.space import DEFAULT, Space
from truthput.report.document import TuneDocument
from truthput.store.db import Store
from truthput.store.rows import RunRow

BATCH = 32  # configurations per optuna ask/tell batch when the space is sampled, not listed


def study_storage_path(store_path: Path) -> Path:
    """optuna's storage beside the results store (its schema has a `trials` table of its own)."""
    return store_path.with_name(store_path.stem + ".optuna.db")


def tune_name(exp: Experiment) -> str:
    """The search's identity: the experiment's name and a digest of what defines it (the space,
    the objective, the baseline command, the load), so a changed space starts a new study."""
    assert exp.tune is not None
    doc = {"tune": exp.tune.model_dump(mode="json", by_alias=True), "command": exp.server.command,
           "workload": exp.workload.model_dump(mode="json"), "engine": exp.server.engine}
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:8]
    return f"{exp.experiment.name}-tune-{digest}"


def objective_level(exp: Experiment) -> Level:
    """Where the objective is measured: an offered rate for goodput, else a concurrency."""
    tune = exp.tune
    assert tune is not None
    if tune.objective == "goodput":
        return Rate(tune.rate if tune.rate is not None else max(exp.workload.rates or [1.0]))
    if tune.level is not None:
        return tune.level
    if exp.workload.mode == "open":
        raise InputError("[tune] searches tok/s at a closed-loop concurrency: give [tune] level = N (or objective = "
                        "'goodput' at a rate)")
    return max(exp.workload.concurrency)


@dataclass
class RoundResult:
    index: int
    run_id: str
    candidates: list[dict[str, Any]]
    lines: list[str] = field(default_factory=list)
    winner: str | None = None


@dataclass
class TuneOutcome:
    name: str
    screened: int
    screen_failed: int
    screen_cpu_s: float
    rounds: list[RoundResult]
    search: SimFirst
    chosen: dict[str, Any] | None
    chosen_line: str
    chosen_run: str | None
    chosen_variant: str | None
    server_s: float
    starts: int
    rho: float | None
    rho_n: int
    front: list[Evaluation]
    stop_reason: str
    level: Level = 1


def screening_experiment(exp: Experiment) -> Experiment:
    """The experiment as the screen runs it: noise off, so it ranks the model's figures, not one
    start's draw."""
    out = exp.model_copy(deep=True)
    out.sim.noise = 0.0
    return out


def _load_evaluations(study: Any) -> list[Evaluation]:
    out = []
    for t in study.get_trials(deepcopy=False):
        raw = t.user_attrs.get("evaluation")
        if raw:
            out.append(Evaluation.from_dict(json.loads(raw)))
    return out


def _record(study: Any, space: Space, e: Evaluation, tune: TuneSection, attrs: dict[str, Any] | None = None) -> None:
    import optuna

    dists = space.distributions()
    values: Any
    if tune.objective == "pareto":
        values = [objective_value(e, tune), (e.itl_p99_s or 1e9) if e.ok else 1e9]
    else:
        values = [objective_value(e, tune)]
    trial = optuna.trial.create_trial(
        params={f: e.config[f] for f in space.flags}, distributions=dists, values=values,
        user_attrs={"evaluation": json.dumps(e.to_dict()), "key": space.key(e.config), **(attrs or {})},
        system_attrs={"constraints": [0.0 if e.ok else 1.0]})
    study.add_trial(trial)


def _study(storage: Any, name: str, tune: TuneSection, seed: int) -> Any:
    import optuna

    if tune.objective == "pareto":
        sampler: Any = optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.create_study(storage=storage, study_name=name, directions=["maximize", "minimize"],
                                   sampler=sampler, load_if_exists=True)
    sampler = optuna.samplers.TPESampler(seed=seed)
    return optuna.create_study(storage=storage, study_name=name, direction="maximize", sampler=sampler,
                               load_if_exists=True)


def run_screen(exp: Experiment, space: Space, study: Any, say: Callable[[str], None]) -> tuple[list[Evaluation], float]:
    """The simulator's evaluations of the space (those already in the study are not redone)."""
    import time

    tune = exp.tune
    assert tune is not None
    done = _load_evaluations(study)
    seen = {space.key(e.config) for e in done}
    sim_exp = screening_experiment(exp)
    load = screen_load(exp, objective_level(exp))
    def cpu_s() -> float:
        # the batches run in `sim batch` subprocesses: their CPU is counted once each has exited
        t = os.times()
        return time.process_time() + t.children_user + t.children_system

    t0 = cpu_s()
    wall0 = time.time()
    size = space.size()
    if size is not None and size <= tune.screen:
        todo = [c for c in space.grid() if space.key(c) not in seen]
        if todo:
            say(f"screening {len(todo)} of {size} configurations on the simulator (virtual time)")
        for i in range(0, len(todo), 4 * BATCH):
            chunk = todo[i:i + 4 * BATCH]
            for e in screen(sim_exp, space, chunk, load, starts=tune.screen_starts, seed=tune.seed,
                            figure=screen_field(tune)):
                _record(study, space, e, tune)
                done.append(e)
    else:
        left = tune.screen - len(done)
        if left > 0:
            say(f"screening {left} configurations sampled by optuna from a space of "
                f"{size if size is not None else 'continuous'} on the simulator (virtual time)")
        dists = space.distributions()
        while left > 0:
            n = min(BATCH, left)
            trials = [study.ask(dists) for _ in range(n)]
            configs = [{f: t.params[f] for f in space.flags} for t in trials]
            for t, e in zip(trials, screen(sim_exp, space, configs, load, starts=tune.screen_starts,
                                                          seed=tune.seed, figure=screen_field(tune))):
                t.set_user_attr("evaluation", json.dumps(e.to_dict()))
                t.set_user_attr("key", space.key(e.config))
                t.set_constraint("failed to start", 0.0 if e.ok else 1.0)
                if tune.objective == "pareto":
                    study.tell(t, [objective_value(e, tune), (e.itl_p99_s or 1e9) if e.ok else 1e9])
                else:
                    study.tell(t, objective_value(e, tune))
                done.append(e)
            left -= n
    cpu = cpu_s() - t0
    if time.time() - wall0 > 0.5:
        say(f"screened in {time.time() - wall0:.1f} s")
    return done, cpu


def round_experiment(exp: Experiment, text: str, name: str, index: int, variants: list[Any]) -> tuple[Experiment, str]:
    """One round as an ordinary experiment: the baseline and the candidates at the objective's level."""
    import tomli_w

    doc = tomllib.loads(text)
    doc.pop("tune", None)
    doc.setdefault("experiment", {})["name"] = f"{name}-round{index}"
    doc["variant"] = [v.model_dump(exclude_defaults=True) for v in variants]
    level = objective_level(exp)
    wl = doc.setdefault("workload", {})
    if is_rate(level):
        wl["rates"] = [float(level)]
        wl.pop("concurrency", None)
    else:
        wl["concurrency"] = [level]
        for key in ("rates", "arrival", "max_in_flight"):  # an open loop's shape
            wl.pop(key, None)
    # decided on the objective alone: a latency the objective does not trade is a constraint,
    # checked against its limit, and a verdict on it would only hold the round open for more starts
    tune = exp.tune
    assert tune is not None
    doc.setdefault("measure", {})["verdicts"] = [objective_metric(tune)] + (["itl_p99"] if tune.objective == "pareto"
                                                                            else [])
    out = tomli_w.dumps(doc)
    return parse_experiment(out, f"{name} round {index}"), out


def _real_evaluation(summary: Any, trials: list[Any], variant: str, config: dict[str, Any], level: Level,
                     server_s: float, metric: str = "tok/s") -> Evaluation:
    """A measured configuration from its round's cells: per-start means of the objective's metric,
    p99 latencies, failure."""
    if variant in summary.failed:
        reason = summary.failed[variant]
        kind = "oom" if "memory" in reason.lower() or "oom" in reason.lower() else "failed"
        return Evaluation(config, "server_counter", False, failure=kind, reason=reason, server_s=server_s)
    cell = next((c for c in summary.cells if c.variant == variant and c.level == level), None)
    series = cell.series(metric)[0] if cell is not None else []
    if cell is None or not series:
        return Evaluation(config, "server_counter", False, failure="no data", reason=cell.status if cell else "no cell",
                          server_s=server_s)
    # the verdict's scale: per-start means of the log (a start with a zero -- no request met the
    # SLOs -- scores zero)
    per_start = [math.exp(sum(math.log(v) for v in s) / len(s)) if min(s) > 0 else 0.0 for s in series if s]

    def p99(name: str) -> float | None:
        vals = sorted(v for t in trials if t.variant == variant and t.status == "ok"
                      for v in [t.results.latency.metric(name).at("p99") if t.results.latency.metric(name) else None]
                      if v is not None)
        return vals[len(vals) // 2] if vals else None

    return Evaluation(config, "server_counter", True, values=per_start, ttft_p99_s=p99("ttft"), itl_p99_s=p99("itl"),
                      starts=len(per_start), server_s=server_s)


def _server_seconds(store: Store, run_id: str) -> dict[str, float]:
    """Seconds each variant's servers ran (start to stop), summed over its starts."""
    out: dict[str, float] = {}
    for st in store.starts(run_id):
        if st.started_at and st.stopped_at:
            out[st.variant] = out.get(st.variant, 0.0) + max(0.0, st.stopped_at - st.started_at)
    return out


def _round_run(store: Store, exp_name: str) -> RunRow | None:
    """The newest run of this round's experiment in the store (the round to resume or read)."""
    rows = [r for r in store.runs() if r.name == exp_name]
    return rows[-1] if rows else None


async def tune(exp: Experiment, text: str, path: str | None, store: Store, store_path: Path, engine: str | None,
               progress: Any, say: Callable[[str], None], executor: Any = None) -> TuneOutcome:
    """Screen, then measure rounds of candidates until a stop rule holds; see the module docstring."""
    import optuna

    from truthput.report.data import run_summary
    from truthput.report.tune import figure_text
    from truthput.run.loop import execute

    tune_cfg = exp.tune
    if tune_cfg is None:
        raise InputError(f"{path or 'experiment'}: no [tune] section (the space: [[tune.param]] flag = ..., values = [...])")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = Space.of(tune_cfg)
    base = ServerArgv.parse(exp.server.command, engine=metric_family(engine or exp.server.engine))
    baseline_name = exp.experiment.baseline
    baseline_variant = _baseline_variant(exp)
    baseline_config = _config_of(space, base)
    name = tune_name(exp)
    level = objective_level(exp)
    storage = optuna.storages.RDBStorage(f"sqlite:///{study_storage_path(store_path)}")
    sim_study = _study(storage, f"{name}/simulator", tune_cfg, tune_cfg.seed)
    real_study = _study(storage, f"{name}/server", tune_cfg, tune_cfg.seed)
    if sim_study.trials:
        say(f"continuing the search {name} ({len(sim_study.trials)} configurations already screened, "
            f"{len(real_study.trials)} measured on the server)")
    _check_energy_source(exp, engine, executor)
    evals, cpu = run_screen(exp, space, sim_study, say)
    _check_power_model(exp, evals)
    search = SimFirst(space, tune_cfg)
    for e in evals:
        search.add_sim(e)
    # the baseline on the simulator too (it may lie outside the space): a pair for the correction
    # and for the rank agreement, never a candidate
    search.add_sim(screen(screening_experiment(exp), space, [baseline_config], screen_load(exp, level), starts=tune_cfg.screen_starts,
                          seed=tune_cfg.seed, figure=screen_field(tune_cfg))[0])
    search.incumbent = space.key(baseline_config)
    # the server's measurements are read back from the rounds' runs (the results store is the record;
    # the server study mirrors them for optuna's tools)
    failed = sum(1 for e in evals if not e.ok)
    rounds: list[RoundResult] = []
    starts_used = 0
    server_s = 0.0
    stop_reason = f"{tune_cfg.rounds} round(s) done"
    m = exp.measure
    per_variant = max(m.starts, 1)
    for index in range(1, tune_cfg.rounds + 1):
        round_name = f"{name}-round{index}"
        row = _round_run(store, round_name)
        if row is not None:
            stored = parse_experiment(row.experiment_toml, round_name)
            configs = [dict(v.tune_config) for v in stored.variant if v.name != baseline_name and v.tune_config]
            cands = {space.key(c): c for c in configs}
            round_exp, round_text = stored, row.experiment_toml
            run_id: str | None = row.id if row.status != "done" else None
            done_id = row.id if row.status == "done" else None
        else:
            if search.real and search.done():
                stop_reason = "no unmeasured configuration can beat the best measured one (corrected prediction)"
                break
            k, spent = _round_size(tune_cfg, starts_used, server_s, per_variant)
            if spent:
                stop_reason = spent
                break
            picked = search.next_candidates(k)
            if not picked:
                stop_reason = "every feasible configuration the simulator ranks has been measured"
                break
            cands = {space.key(c.config): c.config for c in picked}
            variants = [baseline_variant or _plain_baseline(baseline_name)]
            for c in picked:
                v = space.variant(base, c.config)
                v.tune_config = dict(c.config)
                variants.append(v)
            round_exp, round_text = round_experiment(exp, text, name, index, variants)
            say(f"round {index}: measuring on the server, beside the baseline: "
                + "; ".join(f"{space.label(c.config)} (simulator {figure_text(c.simulated)}, corrected "
                            f"{figure_text(c.predicted)} {objective_figure(tune_cfg)})" for c in picked))
            run_id, done_id = None, None
        summary = None
        if done_id is None:
            ran = await execute(round_exp, round_text, path, store, engine=engine, resume=run_id,
                                progress=progress, executor=executor)
            done_id, summary = ran.run_id, ran.summary
        summary = summary or run_summary(store, done_id)
        secs = _server_seconds(store, done_id)
        starts_used += len(store.starts(done_id))
        server_s += sum(secs.values())
        names = {v.name: dict(v.tune_config) for v in round_exp.variant if v.tune_config}
        rounds.append(_record_round(store, search, real_study, space, tune_cfg, index, done_id,
                                    {**names, baseline_name: baseline_config}, baseline_name, summary, secs,
                                    list(cands.values()), level))
    chosen, line, chosen_run, chosen_variant = _choose(store, rounds, search, space, baseline_name, baseline_config,
                                                       level, tune_cfg)
    rho, n = search.rank_agreement()
    front = pareto_front(list(search.real.values()), tune_cfg) if tune_cfg.objective == "pareto" else []
    return TuneOutcome(name, len(evals), failed, cpu, rounds, search, chosen, line, chosen_run, chosen_variant,
                       server_s, starts_used, rho, n, front, stop_reason, level)


def _record_round(store: Store, search: SimFirst, study: Any, space: Space, tune_cfg: TuneSection, index: int,
                  run_id: str, names: dict[str, dict[str, Any]], baseline_name: str, summary: RunSummary,
                  secs: dict[str, float], configs: list[dict[str, Any]], level: Level) -> RoundResult:
    """A measured round into the search and the server study; what it decided on the objective."""
    metric = objective_metric(tune_cfg)
    trials = store.trial_results(run_id)
    _add_round(search, study, space, tune_cfg, index, run_id, names, baseline_name,
               lambda vname, config: _real_evaluation(summary, trials, vname, config, level, secs.get(vname, 0.0),
                                                      metric))
    winner = next((cv.winner for cv in summary.verdict.per_concurrency if cv.metric == metric and cv.level == level),
                  None)
    return RoundResult(index, run_id, configs,
                       [ln for cv in summary.verdict.per_concurrency if cv.metric == metric for ln in cv.lines], winner)


def _baseline_variant(exp: Experiment) -> VariantSection | None:
    """The baseline's own [[variant]], if it has one: the command as it is (the space applies to it)."""
    name = exp.experiment.baseline
    variant = next((v for v in exp.variant if v.name == name), None)
    if variant is not None and (variant.set or variant.remove):
        raise InputError(f"[tune]: the baseline variant {name!r} must be the command as it is (no set/remove): "
                         "the space is applied to the command")
    return variant


def _check_power_model(exp: Experiment, evals: Sequence[Evaluation]) -> None:
    """tok/s per watt needs the simulator's power model of the experiment's GPU."""
    assert exp.tune is not None
    if exp.tune.objective == "tokps_per_watt" and evals and not any(e.values for e in evals if e.ok):
        gpu = exp.hardware.gpu if exp.hardware else "?"
        raise InputError(f"[tune] objective = 'tokps_per_watt': the simulator has no power model for [hardware] gpu = "
                         f"{gpu!r} (its profile gives no board_power_w, the board's power limit in watts)")


def _round_size(tune_cfg: TuneSection, starts_used: int, server_s: float, per_variant: int) -> tuple[int, str | None]:
    """How many candidates the next round measures, or why the budget allows none."""
    k = tune_cfg.candidates
    if tune_cfg.budget_starts is not None:
        k = min(k, (tune_cfg.budget_starts - starts_used) // per_variant - 1)
        if k < 1:
            return 0, f"the budget of {tune_cfg.budget_starts} server starts is spent"
    if tune_cfg.budget_server_minutes is not None and server_s / 60 >= tune_cfg.budget_server_minutes:
        return 0, f"the budget of {tune_cfg.budget_server_minutes:g} server-minutes is spent"
    return k, None


def _add_round(search: SimFirst, real_study: Any, space: Space, tune_cfg: TuneSection, index: int, run_id: str,
               configs: dict[str, dict[str, Any]], baseline_name: str,
               evaluate: Callable[[str, dict[str, Any]], Evaluation]) -> None:
    """A measured round's configurations into the search (the baseline's starts add up over the
    rounds, since it is measured in every one) and into the server study (once per round)."""
    known = {t.user_attrs.get("round_key") for t in real_study.get_trials(deepcopy=False)}
    for vname, config in configs.items():
        e = evaluate(vname, config)
        key = space.key(config)
        if key in search.real and vname == baseline_name:
            prev = search.real[key]
            e.values = prev.values + e.values
            e.starts += prev.starts
        search.add_real(e)
        if f"{index}:{key}" not in known and space.contains(config):
            _record(real_study, space, e, tune_cfg,
                    {"run": run_id, "variant": vname, "round": index, "round_key": f"{index}:{key}"})


def _check_energy_source(exp: Experiment, engine: str | None, executor: Any) -> None:
    """tok/s per watt needs the GPUs' energy: NVML on a real server here (a Ray node reads its own),
    the power model on the simulator. Refused before anything is screened or started."""
    from truthput.run.executors.local import LocalExecutor
    from truthput.experiment.engines import SIMULATED_KINDS

    if exp.tune is None or exp.tune.objective != "tokps_per_watt":
        return
    if (engine or exp.server.engine) in SIMULATED_KINDS or (executor is not None
                                                            and not isinstance(executor, LocalExecutor)):
        return
    from truthput.engines.telemetry import load_nvml

    nvml, why = load_nvml()
    if nvml is None:
        raise InputError(f"[tune] objective = 'tokps_per_watt' needs the GPUs' energy, read from NVML: {why}")
    nvml.nvmlShutdown()


def _plain_baseline(name: str) -> Any:
    from truthput.experiment.file import VariantSection

    return VariantSection(name=name)


def _config_of(space: Space, base: ServerArgv) -> dict[str, Any]:
    """The baseline command's value of each searched flag ("off" where it lacks the flag)."""
    from truthput.experiment.argv import normalised_settings, speculative_settings

    out: dict[str, Any] = {}
    settings = normalised_settings(base)
    spec = speculative_settings(base) or {}
    for p in space.params:
        canon = base.knowledge.canonical(p.flag)
        if base.knowledge.is_spec_flag(canon):
            raw: Any = spec.get("num_speculative_tokens") if "token" in canon else spec.get("method")
            if not spec:
                raw = "off"
        else:
            raw = settings.get(canon, base.get(canon))
            if raw is None:
                raw = DEFAULT
        choices = space.choices(p) or []
        match = next((c for c in choices if str(c) == str(raw)), None)
        if match is None:
            try:
                match = next((c for c in choices if isinstance(c, (int, float)) and float(c) == float(raw)), None)
            except (TypeError, ValueError):
                match = None
        out[p.flag] = match if match is not None else raw
    return out


def _choose(store: Store, rounds: list[RoundResult], search: SimFirst, space: Space, baseline: str,
            baseline_config: dict[str, Any], level: Level, tune_cfg: TuneSection):
    """The configuration decided better than the baseline on the objective's metric by the most,
    with its verdict line."""
    from truthput.report.data import run_summary

    best: tuple[float, dict[str, Any], str, str, str] | None = None
    for r in rounds:
        summary = run_summary(store, r.run_id)
        for c in r.candidates:
            vname = space.label(c)
            cmp = summary.comparison(vname, level, objective_metric(tune_cfg))
            if cmp is None or cmp.better is not True:
                continue
            tolerated = any(c.get(f) != baseline_config.get(f) for f in tune_cfg.allow_guard_change)
            if cmp.vetoed and not tolerated:
                continue  # faster, but its greedy output differs and no flag it sets is known to change numerics
            e = search.real.get(space.key(c))
            if e is None or objective_value(e, tune_cfg) <= 0:
                continue
            ratio = float(cmp.estimate.ratio)
            if best is None or ratio > best[0]:
                best = (ratio, c, cmp.line, r.run_id, vname)
    if best is None:
        return (baseline_config, f"no candidate was decided better than the baseline on {objective_figure(tune_cfg)}: "
                "keep the baseline",
                rounds[-1].run_id if rounds else None, baseline)
    return best[1], best[2], best[3], best[4]


def outcome_document(outcome: TuneOutcome, tune_cfg: TuneSection, simulated_server: bool) -> TuneDocument:
    """The search as plain data, for the terminal, the HTML report and `tune.json`."""
    s = outcome.search
    space = s.space

    def row(key: str) -> dict[str, Any]:
        sim = s.sim.get(key)
        real = s.real.get(key)
        either = real or sim
        cfg = either.config if either is not None else {}
        return {"config": space.label(cfg), "simulated": sim.mean if sim else None,
                "corrected": (sim.mean or 0.0) * s.correction.factor(cfg) if sim and sim.mean else None,
                "simulated_itl_p99_s": sim.itl_p99_s if sim else None,
                "server": real.mean if real else None, "server_itl_p99_s": real.itl_p99_s if real else None,
                "server_starts": real.starts if real else 0, "server_failure": (real.reason or real.failure)
                if real and not real.ok else None, "feasible_on_server": bool(real and objective_value(real, tune_cfg) > 0)}

    measured = [row(k) for k in s.real]
    ranked = [row(space.key(c.config)) for c in s.ranked()[:20]]
    sim_points = [{"value": e.mean, "itl_p99_s": e.itl_p99_s} for e in s.sim.values() if e.ok and e.mean]
    return TuneDocument.model_validate({
        "name": outcome.name, "objective": tune_cfg.objective, "figure": objective_figure(tune_cfg),
        "level": level_label(outcome.level), "screened": outcome.screened,
        "screen_failed": outcome.screen_failed, "screen_cpu_s": outcome.screen_cpu_s,
        "rounds": [{"index": r.index, "run": r.run_id, "candidates": [space.label(c) for c in r.candidates],
                    "winner": r.winner, "lines": r.lines} for r in outcome.rounds],
        "measured": measured, "top_simulated": ranked, "simulator_points": sim_points,
        "front": [{"config": space.label(e.config), "value": e.mean, "itl_p99_s": e.itl_p99_s} for e in outcome.front],
        "chosen": space.label(outcome.chosen) if outcome.chosen else None, "chosen_line": outcome.chosen_line,
        "chosen_run": outcome.chosen_run, "chosen_variant": outcome.chosen_variant,
        "server_minutes": outcome.server_s / 60, "server_starts": outcome.starts,
        "rank_correlation": outcome.rho, "rank_pairs": outcome.rho_n, "stop_reason": outcome.stop_reason,
        "correction": {"intercept": s.correction.intercept, "sd": s.correction.sd, "points": s.correction.n},
        "server_simulated": simulated_server,
    })
