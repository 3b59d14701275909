"""Where a run's report document is written: the one place files are written from it, for `truthput
run` (HTML and markdown side by side in its reports folder) and `truthput report` (each file the
user names).

Why build the document once: every file renders the same document, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from truthput.report.document import ReportDocument

if TYPE_CHECKING:
    from truthput.analyze.audit import Audit
    from truthput.analyze.summary import RunSummary
    from truthput.store.db import Store


@dataclass(frozen=True)
class ReportTargets:
    """The files to write; None: not that one."""

    html: Path | None = None
    md: Path | None = None
    json: Path | None = None
    csv_dir: Path | None = None

    @classmethod
    def run_folder(cls, folder: str | Path, run_id: str) -> ReportTargets:
        """What `truthput run` writes: <folder>/<run id>.html and .md."""
        stem = Path(folder) / report_stem(run_id)
        return cls(html=stem.with_name(stem.name + ".html"), md=stem.with_name(stem.name + ".md"))

    def any(self) -> bool:
        return any((self.html, self.md, self.json, self.csv_dir))


def report_stem(run_id: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in run_id)


def _write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_reports(doc: ReportDocument, targets: ReportTargets) -> list[Path]:
    """Render `doc` to each target; the paths written, in the order html, md, json, csv."""
    written: list[Path] = []
    if targets.html is not None:
        from truthput.report.html import render_html

        written.append(_write_text(targets.html, render_html(doc)))
    if targets.md is not None:
        from truthput.report.markdown import render_markdown

        written.append(_write_text(targets.md, render_markdown(doc)))
    if targets.json is not None:
        from truthput.report.export import write_json

        written.append(write_json(doc, targets.json))
    if targets.csv_dir is not None:
        from truthput.report.export import write_csv

        written += write_csv(doc, targets.csv_dir)
    return written


@dataclass
class RunFiles:
    """`truthput run`'s writer of a finished run's files (`run.outcome.ReportWriter`): its HTML and
    markdown reports and its winning units in `folder`, from the summary the run handed over; keeps
    the document it built (the terminal's roofline lines read it)."""

    folder: Path
    document: ReportDocument | None = None
    audit: Audit | None = None
    """The run's audit, made once for the document and the terminal's matrix."""

    def __call__(self, store: Store, store_path: Path, run_id: str, summary: RunSummary) -> list[Path]:
        from truthput.analyze.audit import audit_of
        from truthput.report.data import build_report_data
        from truthput.report.units import write_winner_units

        self.audit = audit_of(store.trial_results(run_id), bool(store.run(run_id).simulated))
        self.document = build_report_data(store, run_id, summary, self.audit)
        files = write_reports(self.document, ReportTargets.run_folder(self.folder, run_id))
        return files + write_winner_units(store, store_path, run_id, self.folder, summary)
