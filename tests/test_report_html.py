"""The HTML and markdown reports: every section present, SIMULATED banner, and escaping (a log line,
variant name, argv or prompt holding <script> shows as text, never as markup)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from report_fixture import restore_quickstart_db

XSS = '<script>alert("pwned")</script>'
IMG = '<img src=x onerror=alert(1)>'


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    return restore_quickstart_db(tmp_path_factory.mktemp("html") / "q.db")


@pytest.fixture(scope="module")
def html(db_path):
    from truthput.report.data import build_report_data
    from truthput.report.html import render_html
    from truthput.store.db import Store

    return render_html(build_report_data(Store(db_path), "latest"))


def test_sections_and_plots(html):
    for sec in ("verdict", "experiment", "cells", "throughput", "tradeoff", "goodput", "per_stream", "latency",
                "acceptance", "roofline", "audit", "claims", "failures", "telemetry", "trials"):
        assert f'id="{sec}"' in html, sec
    for plot in ("throughput", "tradeoff", "per_stream", "levels", "latency", "acceptance", "roofline"):
        assert f'id="plot-{plot}"' in html, plot
    assert html.count("<svg") == 7
    assert 'id="simulated-banner"' in html and "SIMULATED" in html
    assert "no GPU telemetry" in html and "time busy" in html
    assert "c=1: nospec is 54% slower than original" in html
    assert "<script" not in html.lower()
    # self-contained: nothing is fetched (namespace URIs in the SVG metadata are names, not loads)
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', html)
    assert "url(http" not in html and "@import" not in html


def test_untrusted_text_is_escaped(db_path, tmp_path):
    from truthput.report.data import build_report_data
    from truthput.report.html import render_html
    from truthput.report.markdown import render_markdown
    from truthput.store.db import Store

    copy = tmp_path / "xss.db"
    shutil.copy(db_path, copy)
    s = Store(copy)
    rid = s.resolve_run("latest")
    # a failing start whose log holds markup, a variant whose name and argv hold it
    sid = s.begin_start(rid, "nospec", 9, ["vllm", XSS], 8000)
    s.update_start(sid, status="failed", failure_class="crash_under_load", failure_reason=f"died {IMG}",
                   failure_line=XSS, log_excerpt=f"INFO ok\nERROR {XSS}\n{IMG}")
    s.conn.execute("UPDATE variants SET name = ?, argv_json = ? WHERE run_id = ? AND name = 'spec1'",
                   (f"spec1{XSS}", f'["vllm", "--x", "{IMG}"]', rid))
    s.conn.execute("UPDATE trials SET variant = ? WHERE run_id = ? AND variant = 'spec1'", (f"spec1{XSS}", rid))
    s.conn.commit()
    doc_model = build_report_data(s, rid)
    doc = doc_model.to_dict()
    out = render_html(doc_model)
    low = out.lower()
    assert "<script" not in low
    assert "<img" not in low and "onerror=alert" not in low.replace("onerror=alert(1)&gt;", "")
    assert "&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;" in out  # shown as text
    assert "&lt;img src=x onerror=alert(1)&gt;" in out
    md = render_markdown(doc_model)
    assert "<script" not in md.lower() and "&lt;script" in md
    assert "<img" not in md.lower()


def test_safe_svg_refuses_script():
    from truthput.report.html import safe_svg

    assert safe_svg('<svg><text>a &lt;script&gt;</text></svg>') is not None
    assert safe_svg('<svg><script>alert(1)</script></svg>') is None
    assert safe_svg('<svg><rect onload="x()"/></svg>') is None


def test_markdown_main_tables(db_path):
    from truthput.report.data import build_report_data
    from truthput.report.markdown import render_markdown
    from truthput.store.db import Store

    doc_model = build_report_data(Store(db_path), "latest")

    doc = doc_model.to_dict()
    md = render_markdown(doc_model)
    assert md.startswith("## truthput: quickstart")
    assert "**SIMULATED**" in md
    assert "### Verdict" in md and "### Throughput" in md and "### Roofline" in md
    row = next(c for c in doc["cells"] if c["variant"] == "nospec" and c["concurrency"] == 8)
    assert f"| nospec | 8 | {row['tokps']['value']:.1f} |" in md


def test_pareto_front():
    from truthput.analyze.pareto import pareto_front

    # (latency, tok/s): b dominates a (lower latency, more tok/s); c is faster but slower to respond
    pts = [(10.0, 100.0), (5.0, 120.0), (50.0, 300.0), (60.0, 250.0)]
    assert pareto_front(pts) == [1, 2]


def test_the_audit_is_collapsed_and_the_verdicts_diagnostics_sit_apart(tmp_path):
    """The verdict's list holds decisions; how the data looked (noise) sits in its own collapsed
    section; the audit table is collapsed by default, its row count in the summary."""
    import re

    from report_fixture import restore_quickstart_db

    from truthput.report.data import build_report_data
    from truthput.report.html import render_html
    from truthput.store.db import Store

    store = Store(restore_quickstart_db(tmp_path / "q.db"), read_only=True)
    doc = build_report_data(store, store.resolve_run("latest"))
    html = render_html(doc)
    verdict = html[html.index('<section id="verdict">'):html.index("</section>", html.index('<section id="verdict">'))]
    main_list = verdict[:verdict.index('<details id="verdict-diagnostics">')]
    assert ": noise: " not in main_list and ": noise: " in verdict
    assert re.search(r'<details id="audit-details"><summary>\d+ rows', html)
    assert '<details id="audit-details" open' not in html


def test_a_percentage_past_reading_is_capped_in_every_view(db_path):
    """A ratio of 1e95 (a zero baseline's neighbour, a broken figure) prints as >+999%, never as a
    96-digit number: markdown, HTML, the compare gate's lines and the terminal's formatter."""
    from truthput.report.data import build_report_data
    from truthput.report.html import render_html
    from truthput.report.markdown import render_markdown
    from truthput.report.terminal import delta_text
    from truthput.store.db import Store

    doc = build_report_data(Store(db_path, read_only=True), "latest")
    cell = next(c for c in doc.cells if c.delta_pct is not None and c.delta_pct.value is not None)
    cell.delta_pct.value, cell.delta_pct.lo, cell.delta_pct.hi = 1e95, -5e94, 3e96
    for audit in doc.audit:
        if audit.error_pct_vs_counter is not None:
            audit.error_pct_vs_counter = 2e40
    for text in (render_markdown(doc), render_html(doc)):
        assert not re.search(r"\d{5,}(?:\.\d)?%", text), re.search(r".{40}\d{5,}%.{10}", text)
        assert "+999%" in text  # (">" is "&gt;" in the HTML)
    cell.delta_pct.value, cell.delta_pct.lo, cell.delta_pct.hi = 1e95, -50.0, 1e96
    assert delta_text(cell).startswith(">+999%") and ">+999" in delta_text(cell)[6:]
