"""`plan`'s time estimate learns from the store: the earlier starts of the very same servers on this
host give each start's time (readiness plus its trials), in place of the model's guess. Known truth:
the recorded quickstart run's own start rows (launch, ready, stop) and trial counts, summed by hand."""

from __future__ import annotations

from pathlib import Path
from statistics import median

from truthput.run.forecast import learned_estimate
from truthput.experiment.file import parse_experiment
from truthput.run.plan import build_plan
from truthput.store.db import Store

from report_fixture import restore_quickstart_db


def test_the_estimate_is_the_earlier_starts_of_the_same_servers(tmp_path):
    path = restore_quickstart_db(tmp_path / "q.db")
    db = Store(path, read_only=True)
    (run,) = db.runs()
    plan = build_plan(parse_experiment(run.experiment_toml, "recorded"))
    trials = db.trial_results(run.id)
    by_variant: dict[str, list[tuple[float, float]]] = {}
    for st in db.starts(run.id):
        n = sum(1 for t in trials if t.start_id == st.id)
        by_variant.setdefault(st.variant, []).append((st.ready_s, (st.stopped_at - st.started_at - st.ready_s) / n))
    now = len(plan.levels) * plan.repeats
    truth = sum(median(r for r, _ in by_variant[name]) + now * median(x for _, x in by_variant[name])
                for name, _i in plan.order)
    learned = learned_estimate(Path(path), plan, run.machine["hostname"])
    assert learned is not None and learned[1] == len(db.starts(run.id))
    assert abs(learned[0] - truth) < 1e-6 and abs(learned[0] - plan.estimate_s) > 1.0
    # another host's starts teach nothing: the model's estimate stands
    assert learned_estimate(Path(path), plan, "another-host") is None
