"""A stored run's summary: the record the run kept when it ended, or recomputed from its trials.

Every view that shows cells, comparisons or the verdict (the terminal table, `truthput report`, the
report document and its exports, `runs`, `unit`) gets it here, so they show the decision the run
made (`analyze.summary.StoredSummary`), with the cells' figures rebuilt from the trials. A run
that has no record of the current schema (still running, interrupted before its end, or stored by
an older truthput) is recomputed from its trials. A run of `truthput load` has no experiment file:
its single variant is its own baseline and the design defaults apply.
"""

from __future__ import annotations

from truthput.analyze.cells import build_cells
from truthput.analyze.summary import RunSummary, StoredSummary, summarize
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


def stored_summary(store: Store, run_id: str) -> StoredSummary | None:
    """The summary the run stored when it ended (None: none of the current schema)."""
    return StoredSummary.from_json(store.run(run_id).summary_json)


def run_summary(store: Store, run_id: str) -> RunSummary:
    """Cells, verdict, failures and guard of a stored run: its stored decision where it has one,
    else recomputed from its trials."""
    run_id = store.resolve_run(run_id)
    record = stored_summary(store, run_id)
    if record is None:
        return compute_summary(store, run_id)
    baseline, _ = run_design(store, run_id)
    cells = build_cells(store.trial_results(run_id), [v.name for v in store.variants(run_id)], baseline,
                        record.failed)
    return record.summary(cells)


def stored_guard_texts(store: Store, run_id: str) -> dict[str, list[str]]:
    """The output guard's texts a run kept (a resumed run compares new outputs with them)."""
    record = stored_summary(store, run_id)
    if record is not None:
        return record.guard_texts
    return dict((store.run(run_id).summary or {}).get("guard_texts") or {})


def compute_summary(store: Store, run_id: str, guard_texts: dict[str, list[str]] | None = None) -> RunSummary:
    """Decide the run from its trials now (the run loop, at each look of its stopping rule).
    `guard_texts`: the output guard's texts when the caller has newer ones than the stored record."""
    run_id = store.resolve_run(run_id)
    run = store.run(run_id)
    variants = store.variants(run_id)
    baseline, measure = run_design(store, run_id)
    if guard_texts is None:
        guard_texts = stored_guard_texts(store, run_id)
    placements = {}
    for s in store.starts(run_id):
        info = s.info
        if info.get("placement"):
            placements[int(s.id)] = info["placement"]
    return summarize(store.trial_results(run_id), [v.name for v in variants], store.failed_variants(run_id),
                     baseline, measure, bool(run.simulated), guard_texts,
                     placements=placements or None)
