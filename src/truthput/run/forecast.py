"""What `truthput plan` says beyond the plan itself, from the store's earlier runs on this host and
from the server: the starts the stopping rule will likely need (`starts_forecast`, from the start
noise of earlier runs, else a default CV), the time the starts will take where these very servers
ran before (`learned_estimate`), and other clients of a server someone else runs
(`external_traffic`). The store is read only; an unreadable one teaches nothing."""

from __future__ import annotations

from pathlib import Path

from truthput.experiment.file import Experiment
from truthput.run.plan import Plan, metric_names_for


def starts_forecast(exp: Experiment, plan: Plan, store_path: Path, per_start_s: float | None = None) -> list[str]:
    """The plan's expected and maximum starts per variant, from the noise of earlier runs on this
    host and engine kind in the store (read only), else from the default CV."""
    import socket

    from truthput.analyze.planning import DEFAULT_START_CV, forecast
    from truthput.analyze.values import stopping_rule

    m = exp.measure
    rule = stopping_rule(m)
    if rule is None:
        return [f"sequential = false: exactly {m.starts} starts per variant, decided once at the end"]
    noise, source = None, ""
    if store_path.exists():
        noise, source = _stored_noise(store_path, plan.engine, socket.gethostname())
    cv = noise if noise is not None else DEFAULT_START_CV
    if noise is None:
        source = f"no earlier run of engine {plan.engine} on this host in {store_path}: a default start CV of " \
                 f"{DEFAULT_START_CV:.0%}"
    family = max(0, len(plan.variants) - 1) * len(plan.levels) * len(m.verdicts)
    rows = forecast(rule, len(plan.variants), len(plan.levels) * len(m.verdicts), cv)
    per_start_s = per_start_s or plan.estimate_s / max(1, len(plan.order))
    out = [f"stopping rule: first look at {rule.min_starts} starts per variant, at most {rule.max_starts}; "
           f"{family} comparisons decided together (Hochberg); if every variant differs by (simulated with {source}):"]
    out += [f"  {r.effect - 1:>4.0%}: {r.mean_starts:.1f} starts per variant on average, about "
            f"{r.mean_starts * len(plan.variants) * per_start_s / 60:.0f} min (stops at {r.distribution()}; "
            f"decided in {r.decided:.0%})" for r in rows]
    return out


def external_traffic(exp: Experiment, plan: Plan) -> list[str]:
    """A server someone else runs (engine external) watched for 3 s before anything: its
    counter moving means other clients share it (what every counter figure is then checked for)."""
    import asyncio

    if plan.engine != "external" or not exp.server.url:
        return []
    from truthput.engines.external import ExternalEngine
    from truthput.measure.scrape import other_traffic

    names = metric_names_for(exp, plan.engine)
    said, note = asyncio.run(other_traffic(ExternalEngine(exp.server.url).base_url, names.candidates("emitted_tokens"),
                                           names.candidates("running"), exp.workload.model))
    return [x for x in (said, note) if x]


def _stored_noise(store_path: Path, engine: str, hostname: str) -> tuple[float | None, str]:
    import sqlite3

    from truthput.analyze.cells import build_cells
    from truthput.analyze.planning import pooled_start_noise
    from truthput.store.db import Store

    try:
        db = Store(store_path, read_only=True)
    except Exception:  # an unreadable store gives no noise, the default applies
        return None, ""
    try:
        runs = [r for r in db.runs() if r.engine == engine
                and r.machine.get("hostname") == hostname][-5:]
        cells: list[list[list[float]]] = []
        for r in runs:
            cells.extend(c.per_start for c in build_cells(db.trial_results(r.id)) if len(c.per_start) >= 2)
        pooled = pooled_start_noise(cells)
    except (sqlite3.Error, ValueError, KeyError):
        return None, ""
    finally:
        db.close()
    if pooled is None:
        return None, ""
    sd, df = pooled
    return sd, f"the start CV of {len(runs)} earlier run(s) here: {sd:.1%} ({df} df)"


def learned_estimate(store_path: Path, plan: Plan, hostname: str) -> tuple[float, int] | None:
    """(seconds the plan's first starts will take, earlier starts it learned from): each variant's
    earlier starts of the very same server (the stored variant's argv read spelling-free, host and
    port aside) on this host in the store; a variant never started before costs what the model says.
    None: none known."""
    import sqlite3

    from truthput.analyze.planning import learned_start_s
    from truthput.experiment.argv import ServerArgv, normalised_settings
    from truthput.experiment.engines import metric_family
    from truthput.store.db import Store

    if not store_path.exists():
        return None
    family = metric_family(plan.engine)

    def key(argv: list[str]) -> str:
        return repr(sorted(normalised_settings(ServerArgv.parse(argv, engine=family)).items()))

    wanted = {key(v.argv.to_argv()): v.name for v in plan.variants}
    history: dict[str, list[tuple[float, float, int]]] = {}
    try:
        db = Store(store_path, read_only=True)
    except Exception:  # an unreadable store teaches nothing; the model's estimate stands
        return None
    try:
        for run in db.runs():
            if run.engine != plan.engine or run.machine.get("hostname") != hostname or run.is_load:
                continue
            per_start: dict[int, int] = {}
            for t in db.trial_results(run.id):
                if t.start_id is not None:
                    per_start[t.start_id] = per_start.get(t.start_id, 0) + 1
            same: dict[str, str] = {}  # that run's variant -> the plan's variant with the same server
            for v in db.variants(run.id):
                try:
                    if key(v.argv) in wanted:
                        same[v.name] = wanted[key(v.argv)]
                except Exception:  # an argv the parser no longer reads teaches nothing
                    continue
            for st in db.starts(run.id):
                if st.ready_s is None or st.started_at is None or st.stopped_at is None or st.id not in per_start:
                    continue
                name = same.get(st.variant)
                if name is not None:
                    history.setdefault(name, []).append((st.ready_s, st.stopped_at - st.started_at,
                                                         per_start[st.id]))
    except (sqlite3.Error, ValueError, KeyError):
        return None
    finally:
        db.close()
    if not history:
        return None
    model_start_s = plan.estimate_s / max(1, len(plan.order))
    trials_now = len(plan.levels) * plan.repeats
    learned = {name: learned_start_s(h, trials_now) for name, h in history.items()}
    total = sum(learned.get(name) or model_start_s for name, _i in plan.order)
    return total, sum(len(h) for h in history.values())
