"""Views only render: on the recorded quickstart store, every figure that the JSON export, the CSV
files, the markdown report, the HTML report and the terminal's roofline lines print is a figure of
the report document (at the precision and unit the view shows it in). A view that averaged,
re-derived or recounted anything on its own would print a number the document does not hold."""

from __future__ import annotations

import html as html_lib
import json
import math
import re
from pathlib import Path

import pytest

from report_fixture import restore_quickstart_db

NUMBER = re.compile(r"(?<![\w.])[+-]?\d+(?:\.\d+)?(?![\w.])")
SCALES = (1.0, 100.0, 1000.0)
"""A view may show a document figure as it is, as a percentage, or in ms where the document holds s."""


@pytest.fixture(scope="module")
def doc_and_store(tmp_path_factory):
    from truthput.report.data import build_report_data
    from truthput.store.db import Store

    store = Store(restore_quickstart_db(tmp_path_factory.mktemp("views") / "q.db"))
    return build_report_data(store, "latest"), store


def _leaves(x, out: set[float]) -> set[float]:
    """Every number the document holds (strings that are numbers, too: levels, labels)."""
    if isinstance(x, bool):
        return out
    if isinstance(x, (int, float)):
        out.add(float(x))
    elif isinstance(x, str):
        out.update(float(n) for n in NUMBER.findall(x))
    elif isinstance(x, dict):
        for k, v in x.items():
            _leaves(k, out)
            _leaves(v, out)
    elif isinstance(x, list):
        for v in x:
            _leaves(v, out)
    return out


def _shown(text: str, leaves: set[float]) -> bool:
    """Whether the number as printed (its decimals are its precision) is a document figure."""
    value = float(text)
    decimals = len(text.split(".")[1]) if "." in text else 0
    half = 0.5 * 10 ** -decimals + 1e-9
    return any(abs(abs(v) * s - abs(value)) <= half for v in leaves for s in SCALES)


def _unexplained(numbers: list[str], leaves: set[float]) -> list[str]:
    return sorted({n for n in numbers if not _shown(n, leaves)})


def test_the_json_export_is_the_document(doc_and_store, tmp_path):
    from truthput.report.document import ReportDocument
    from truthput.report.export import write_json

    doc, _ = doc_and_store
    path = write_json(doc, tmp_path / "r.json")
    assert ReportDocument.from_json(json.loads(path.read_text())) == doc
    assert json.loads(path.read_text()) == doc.to_dict()


def test_every_csv_figure_is_a_document_figure(doc_and_store, tmp_path):
    from report_fixture import read_csv
    from truthput.report.export import write_csv

    doc, _ = doc_and_store
    leaves = _leaves(doc.to_dict(), set())
    checked = 0
    for path in write_csv(doc, tmp_path / "csv"):
        for row in read_csv(path):
            for col, cell in row.items():
                if cell.startswith(("[", "{")):
                    continue  # a list or table kept as JSON: its numbers are the document's by construction
                try:
                    value = float(cell)
                except ValueError:
                    continue
                if math.isfinite(value):
                    checked += 1
                    assert value in leaves, f"{path.name} {col} = {cell}: not a figure of the document"
    assert checked > 500


def test_every_markdown_and_html_figure_is_a_document_figure(doc_and_store):
    from truthput.report.html import render_html
    from truthput.report.markdown import render_markdown

    doc, _ = doc_and_store
    leaves = _leaves(doc.to_dict(), set())
    md_tables = [ln for ln in render_markdown(doc).splitlines() if ln.startswith("|")]
    md_numbers = [n for ln in md_tables for n in NUMBER.findall(ln)]
    assert len(md_numbers) > 100
    assert _unexplained(md_numbers, leaves) == []
    page = render_html(doc, plots={})
    cells = re.findall(r"<td[^>]*>(.*?)</td>", page, flags=re.S)
    html_numbers = [n for c in cells for n in NUMBER.findall(html_lib.unescape(re.sub(r"<[^>]+>", " ", c)))]
    assert len(html_numbers) > 300
    assert _unexplained(html_numbers, leaves) == []


def test_the_terminal_roofline_lines_are_the_documents(doc_and_store):
    from truthput.report.data import roofline_for_run, roofline_lines

    doc, store = doc_and_store
    lines = roofline_lines(roofline_for_run(store, "latest"))
    leaves = _leaves(doc.roofline.model_dump(), set())
    numbers = [n for ln in lines[1:] for n in NUMBER.findall(ln)]
    assert len(numbers) > 20
    assert _unexplained(numbers, leaves) == []


def test_the_check_fails_on_a_figure_a_view_made_up(doc_and_store):
    """The check itself: a mean over the cells' figures is no figure of the document."""
    doc, _ = doc_and_store
    leaves = _leaves(doc.to_dict(), set())
    made_up = sum(c.tokps.value for c in doc.cells if c.tokps is not None) / len(doc.cells)
    assert _unexplained([f"{made_up:.1f}"], leaves) == [f"{made_up:.1f}"]


SCHEMA_DOC = Path(__file__).resolve().parents[1] / "docs" / "export-schema.md"


def _documented_rows() -> dict[str, str]:
    """docs/export-schema.md's top-level table: `key` -> the text that documents it."""
    rows: dict[str, str] = {}
    text = SCHEMA_DOC.read_text(encoding="utf-8")
    top = text[text.index("## Top level"):text.index("## CSV files")]
    for line in top.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not cells[1].strip().startswith("`"):
            continue
        for key in re.findall(r"`([^`]+)`", cells[1]):
            rows[key] = cells[2]
    return rows


def _described_keys() -> dict[str, set[str]]:
    """The generated key list's keys that carry their field's docstring, by section."""
    text = SCHEMA_DOC.read_text(encoding="utf-8")
    out: dict[str, set[str]] = {}
    for block in text.split("\n### `")[1:]:
        section = block.split("`", 1)[0]
        out[section] = set(re.findall(r"^- `([^`]+)`: [^\n]*?\. ", block, flags=re.M))
    return out


def test_the_generated_key_list_is_fresh():
    """docs/export-schema.md's key list is what scripts/make_schema_doc.py writes from the models."""
    import sys

    sys.path.insert(0, str(SCHEMA_DOC.parents[1] / "scripts"))
    from make_schema_doc import render

    page = SCHEMA_DOC.read_text(encoding="utf-8")
    assert page == render(page), "docs/export-schema.md's key list is stale: run scripts/make_schema_doc.py"


def test_every_key_of_the_document_is_documented_in_the_export_schema(doc_and_store):
    """The JSON export's schema page is tested against the document: a key added (or dropped)
    without its line in docs/export-schema.md fails here."""
    doc = doc_and_store[0].to_dict()
    rows = _documented_rows()
    top = {k.split("[")[0].split(".")[0] for k in rows}
    assert set(doc) == top, f"undocumented: {sorted(set(doc) - top)}; documented but absent: {sorted(top - set(doc))}"

    described = _described_keys()

    def words(key: str) -> set[str]:
        return set(re.findall(r"[a-z_0-9]+", rows[key])) | described.get(key, set())

    sections = {"cells[]": doc["cells"], "trials[]": doc["trials"], "latency[]": doc["latency"],
                "spec_decode[]": doc["spec_decode"], "audit[]": doc["audit"], "failures[]": doc["failures"],
                "roofline.cells[]": doc["roofline"]["cells"], "experiment.variants[]": doc["experiment"]["variants"],
                "run": [doc["run"]], "experiment": [doc["experiment"]], "verdict": [doc["verdict"]],
                "roofline": [doc["roofline"]], "telemetry": [doc["telemetry"]], "claims": [doc["claims"]]}
    missing = {name: sorted({k for r in rs for k in r} - words(name) - {"level", "rate", "concurrency"})
               for name, rs in sections.items()}
    assert all(not v for v in missing.values()), f"keys without a word in docs/export-schema.md: {missing}"


CHANGED_SINCE_PINNED = {
    ("recorded/20261201-073331-load-3f84", "terminal"):
        "report of a load run prints `load`'s own tables (one view of a load run), latency at 2 decimals",
    ("recorded/20261201-073331-load-3f84", "json"):
        "a load run compares nothing: its export holds no verdict (the pinned one held a design's alpha, 0.05)",
}
"""Views of the pinned runs that changed on purpose since the pins were written, and why."""


@pytest.mark.slow
def test_every_view_of_the_recorded_stores_shows_the_figures_it_showed_before(tmp_path):
    """tests/fixtures/report/view_figures.json holds, per recorded run and view, the decimal numbers
    the views showed before the views were restructured (made by make_view_figures.py beside it from
    00f9587); each must still be shown (a view may show more)."""
    import sqlite3
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "report"))
    import make_view_figures as pinned

    pins = json.loads(pinned.OUT.read_text())
    checked = 0
    for name, gz in pinned.STORES.items():
        db = pinned.restore(gz, tmp_path / f"{name}.db")
        for (run_id,) in sqlite3.connect(db).execute("SELECT id FROM runs ORDER BY created_at"):
            (tmp_path / run_id).mkdir()
            now = pinned.views(db, run_id, tmp_path / run_id)
            for view, figures in pins[f"{name}/{run_id}"].items():
                if (f"{name}/{run_id}", view) in CHANGED_SINCE_PINNED:
                    continue
                assert set(figures) <= set(now[view]), (run_id, view, sorted(set(figures) - set(now[view]))[:20])
                checked += len(figures)
    assert checked > 1500
