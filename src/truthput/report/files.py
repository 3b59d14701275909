"""The reports `truthput run` writes at the end of every run: HTML and markdown side by side.

Why build the document once: both files render the same dict, so they cannot disagree.
"""

from __future__ import annotations

from pathlib import Path

from truthput.store.db import Store


def report_stem(run_id: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in run_id)


def write_reports(store: Store, run_id: str, folder: str | Path) -> list[Path]:
    """<folder>/<run id>.html and .md; returns their paths."""
    from truthput.report.data import build_report_data
    from truthput.report.html import render_html
    from truthput.report.markdown import render_markdown

    run_id = store.resolve_run(run_id)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    doc = build_report_data(store, run_id)
    html_path = folder / f"{report_stem(run_id)}.html"
    md_path = folder / f"{report_stem(run_id)}.md"
    html_path.write_text(render_html(doc), encoding="utf-8")
    md_path.write_text(render_markdown(doc), encoding="utf-8")
    return [html_path, md_path]
