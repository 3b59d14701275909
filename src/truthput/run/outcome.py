"""A run from start to files: the library entry point `truthput run` is a thin shell around.

`run_and_report` runs (or resumes) the experiment, hands it to the caller's writer of reports and
winning units (`ReportWriter`: the command line gives `report.files.write_run_files`; run/ imports
nothing from report/), and says how it ended: which variants were measured, which failed and why,
the exit status the command line gives it (0; 1: nothing measured; 3: some variant never measured;
4: a variant's requests succeeded but no source gave its tok/s), and every file written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from truthput.analyze.summary import RunSummary
from truthput.events import EventSink
from truthput.experiment.file import Experiment
from truthput.run.executors.base import Executor
from truthput.store.db import Store

class ReportWriter(Protocol):
    def __call__(self, store: Store, store_path: Path, run_id: str, summary: RunSummary) -> list[Path]:
        """Write the run's reports and units (the files written)."""


NOTHING_MEASURED = 1
SOME_NEVER_MEASURED = 3
NO_FIGURE = 4


@dataclass
class RunOutcome:
    run_id: str
    status: str
    """The run's stored status: done, failed (nothing measured) or interrupted."""
    summary: RunSummary
    measured: list[str]
    failed: dict[str, str]
    """Variant -> why it has no measurement (a failed start, every request an error)."""
    never_measured: list[str]
    no_figure: list[str] = field(default_factory=list)
    """Variants whose requests succeeded but whose trials have no tok/s from any source (no
    counter, no usage: the measurement could not be made)."""
    files: list[Path] = field(default_factory=list)
    """The reports and winning units written."""

    @property
    def exit_status(self) -> int:
        if not self.measured:
            return NOTHING_MEASURED
        if self.never_measured:
            return SOME_NEVER_MEASURED
        return NO_FIGURE if self.no_figure else 0

    def problem(self) -> str | None:
        """One line for a run that did not measure every variant, else None."""
        if not self.measured:
            why = "; ".join(f"{k}: {v}" for k, v in self.failed.items()) or "every trial failed"
            return f"no variant produced a measurement ({why}); run {self.run_id} is stored as failed"
        if self.never_measured:
            # a variant that never measured cannot be compared: the verdict is about the others
            why = "; ".join(f"{v}: {self.failed.get(v, 'no trial succeeded')}" for v in self.never_measured)
            return f"{len(self.never_measured)} variant(s) never measured ({why})"
        if self.no_figure:
            why = "; ".join(f"{v}: {note}" for v, note in self.no_figure_why.items())
            return f"no tok/s figure could be made for {', '.join(self.no_figure)} ({why})"
        return None

    @property
    def no_figure_why(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for c in self.summary.cells:
            if c.variant in self.no_figure and c.variant not in out:
                notes = [t.results.headline().note for t in c.trials if t.status == "ok"]
                out[c.variant] = next((n for n in notes if n), "no source gave a figure")
        return out


def outcome_of(store: Store, run_id: str, status: str, summary: RunSummary) -> RunOutcome:
    """What a finished run measured and what it failed, from its store."""
    trials = store.trial_results(run_id)
    measured = {t.variant for t in trials if t.status == "ok"}
    failed = store.failed_variants(run_id)
    for t in trials:  # a server that started but answered every request with an error
        if t.variant not in measured and t.variant not in failed and t.error:
            failed[t.variant] = t.error if len(t.error) <= 300 else t.error[:297] + "..."
    names = [v.name for v in store.variants(run_id)]
    with_figure = {c.variant for c in summary.cells if c.per_start}
    return RunOutcome(run_id, status, summary, [n for n in names if n in measured], failed,
                      [n for n in names if n not in measured],
                      no_figure=[n for n in names if n in measured and n not in with_figure])


async def run_and_report(exp: Experiment, exp_text: str, exp_path: str | None, store: Store, store_path: Path, *,
                         engine: str | None = None, resume: str | None = None,
                         progress: Callable[[str], None] | EventSink | None = None,
                         sim_target: dict[str, Any] | None = None, executor: Executor | None = None,
                         write_files: ReportWriter | None = None) -> RunOutcome:
    """Run (or resume) the experiment, then hand it to `write_files` for its reports and winning
    units (None: no files). The summary is the one the run computed as it ended."""
    from truthput.analyze.summary import summary_of
    from truthput.run.loop import execute
    from truthput.store.summary import summary_inputs

    ran = await execute(exp, exp_text, exp_path, store, engine=engine, resume=resume, progress=progress,
                        sim_target=sim_target, executor=executor)
    out = outcome_of(store, ran.run_id, ran.status, ran.summary or summary_of(summary_inputs(store, ran.run_id)))
    if write_files is not None and out.measured:  # a run that measured nothing has nothing to report
        out.files = write_files(store, store_path, ran.run_id, out.summary)
    return out
