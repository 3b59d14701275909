"""A stored run's summary, recomputed from its trials by `truthput.analyze.summary` for every view.

Every view that shows cells, comparisons or the verdict (the terminal table, `truthput report`, the
report document and its exports) gets them here, so they show the same numbers. A run of
`truthput load` has no experiment file: its single variant is its own baseline and the design
defaults apply.
"""

from __future__ import annotations


from truthput.analyze.summary import RunSummary, summarize
from truthput.experiment.file import MeasureSection
from truthput.store.db import Store


def run_design(store: Store, run_id: str) -> tuple[str, MeasureSection]:
    """The run's baseline and `[measure]` design (defaults for a `truthput load` run, or an
    experiment whose schema changed)."""
    from truthput.errors import TruthputError
    from truthput.experiment.file import parse_experiment

    run = store.run(run_id)
    variants = store.variants(run.id)
    baseline = next((v.name for v in variants if v.is_baseline), variants[0].name if variants else "")
    try:
        exp = parse_experiment(run.experiment_toml or "", run.experiment_path or "stored experiment")
        return exp.experiment.baseline, exp.measure
    except TruthputError:
        return baseline, MeasureSection()


def run_summary(store: Store, run_id: str, guard_texts: dict[str, list[str]] | None = None) -> RunSummary:
    """Cells, verdict, failures and guard of a stored run (`guard_texts`: the output guard's texts
    when the caller has newer ones than the stored summary)."""
    run_id = store.resolve_run(run_id)
    run = store.run(run_id)
    variants = store.variants(run_id)
    baseline, measure = run_design(store, run_id)
    prev = run.summary or {}
    placements = {}
    for s in store.starts(run_id):
        info = s.info
        if info.get("placement"):
            placements[int(s.id)] = info["placement"]
    return summarize(store.trial_results(run_id), [v.name for v in variants], store.failed_variants(run_id),
                     baseline, measure, bool(run.simulated), guard_texts or prev.get("guard_texts") or {},
                     placements=placements or None)
