"""What a stored run's summary is decided from, read from the store (`SummaryInputs`): its trials,
variants, failures, baseline and design, the output guard's texts, where each start ran, and the
record the run kept when it ended. The store only reads: `analyze.summary.summary_of` decides (the
stored decision where the run kept one of the current schema, else computed from the trials now).
A run of `truthput load` has no experiment file: its single variant is its own baseline, the design
defaults apply, and nothing is compared.
"""

from __future__ import annotations

import json
from typing import Any

from truthput.analyze.summary import SummaryInputs
from truthput.experiment.cache import cache_changes
from truthput.experiment.file import MeasureSection
from truthput.store.db import Store


def run_design(store: Store, run_id: str) -> tuple[str, MeasureSection]:
    """The run's baseline and `[measure]` design (defaults for a `truthput load` run, or an
    experiment whose schema changed)."""
    run = store.run(run_id)
    variants = store.variants(run.id)
    baseline = next((v.name for v in variants if v.is_baseline), variants[0].name if variants else "")
    exp = None if run.is_load else store.experiment(run.id)[0]
    return (exp.experiment.baseline, exp.measure) if exp is not None else (baseline, MeasureSection())


def stored_guard_texts(store: Store, run_id: str) -> dict[str, list[str]]:
    """The output guard's texts a run kept (a resumed run compares new outputs with them)."""
    try:
        kept = json.loads(store.run(run_id).summary_json or "{}")
    except ValueError:
        return {}
    return dict(kept.get("guard_texts") or {}) if isinstance(kept, dict) else {}


def summary_inputs(store: Store, run_id: str, guard_texts: dict[str, list[str]] | None = None) -> SummaryInputs:
    """Everything a stored run's summary is decided from. `guard_texts`: the output guard's texts
    when the caller has newer ones than the stored record (the run loop)."""
    run_id = store.resolve_run(run_id)
    run = store.run(run_id)
    baseline, measure = run_design(store, run_id)
    placements: dict[int, dict[str, Any]] = {int(s.id): s.info["placement"] for s in store.starts(run_id)
                                             if s.info.get("placement")}
    variants = store.variants(run_id)
    base = next((v for v in variants if v.name == baseline), None)
    changes = {v.name: cache_changes(v.diff.get("diff") or {}, v.env, base.env if base else {}) for v in variants
               if v.name != baseline}
    return SummaryInputs(
        trials=store.trial_results(run_id), variants=[v.name for v in variants], cache_changes=changes,
        failed=store.failed_variants(run_id), baseline=baseline, measure=measure, simulated=bool(run.simulated),
        guard_texts=stored_guard_texts(store, run_id) if guard_texts is None else guard_texts,
        placements=placements, record=run.summary_json, compares=not run.is_load,
        before_load=[e.message for e in store.events(run_id) if e.kind == "other_traffic"],
        prompt_source=exp.workload.prompt_source if (exp := store.experiment(run_id)[0]) is not None else "synthetic")
