"""The report's plots read as measured: level ticks at the measured levels in plain numbers, no
line between levels never measured, latency axes in plain milliseconds, trade-off labels that do
not overlap (matplotlib's own geometry, on the figures the report draws)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("matplotlib")

from truthput.report import plots  # noqa: E402


def _fig(value, unit="tok/s", source="server_counter", **extra):
    from truthput.report.document import Figure

    return Figure(value=value, unit=unit, source=source, **extra)


def _doc(levels=(1, 8, 32), variants=("base", "spec1", "nospec")):
    """A partial report document (only what the plots read), built from the document's own types."""
    from truthput.report.document import CellRow, ExperimentInfo, ReportDocument, RooflineDoc, VariantInfo

    cells = []
    for vi, v in enumerate(variants):
        for c in levels:
            tok = 100.0 * c ** 0.7 * (1 + 0.01 * vi)
            cells.append(CellRow(variant=v, concurrency=c, rate=None, level=f"c={c}", baseline=vi == 0,
                                 status="ok", tokps=_fig(tok, lo=tok * 0.97, hi=tok * 1.03),
                                 per_stream=_fig(tok / c, "tok/s/stream", "usage"),
                                 ttft_p99=_fig(0.05 + 0.001 * vi, "s", "client_clock"),
                                 itl_p99=_fig(0.02 + 0.0005 * vi, "s", "client_clock")))
    return ReportDocument.model_construct(
        simulated=False, cells=cells, latency=[], spec_decode=[], goodput=None,
        roofline=RooflineDoc(available=False),
        experiment=ExperimentInfo.model_construct(variants=[VariantInfo(name=v, position=i, baseline=i == 0, argv=[])
                                                            for i, v in enumerate(variants)]))


def _texts(svg: str) -> list[str]:
    return [t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg) if t.strip()]


def _drawn(draw, doc) -> tuple[object, object]:
    """What `draw(doc)` returned, and the figure it saved (None when it saved none), as
    matplotlib drew it: Figure.savefig is wrapped for the call."""
    from matplotlib.figure import Figure

    captured: dict[str, object] = {}
    real = Figure.savefig

    def grab(self, *a, **k):
        out = real(self, *a, **k)
        captured["fig"] = self
        return out

    Figure.savefig = grab
    try:
        result = draw(doc)
    finally:
        Figure.savefig = real
    return result, captured.get("fig")


def test_level_ticks_are_the_measured_levels_in_plain_numbers():
    svg = plots.throughput(_doc(levels=(1, 8, 32)))
    texts = _texts(svg)
    for label in ("1", "8", "32"):
        assert label in texts
    for never in ("2", "4", "16"):  # levels not measured get no tick
        assert never not in texts
    assert "2^" not in svg and "mathdefault" not in svg


def test_no_line_joins_levels():
    _svg, fig = _drawn(plots.throughput, _doc())
    ax = fig.axes[0]
    drawn = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
    assert drawn and all(ln.get_linestyle() in ("None", "none", "") for ln in drawn)


def test_latency_axes_read_plain_milliseconds():
    from truthput.report.document import LatencyRow

    doc = _doc()
    doc.latency = [LatencyRow(variant="base", concurrency=1, rate=None, level="c=1",
                              ttft_ms=[120.0, 250.0, 300.0, 900.0], itl_ms=[20.0, 30.0, 45.0],
                              n_requests=4, n_failed=0, source="client_clock", note="")]
    svg = plots.latency_distributions(doc)
    assert "10^" not in svg and "mathdefault" not in svg and "×10" not in svg


def test_tradeoff_labels_do_not_overlap():
    """Nine cells crowded into a corner: every label box clear of every other after the final draw."""
    svg, fig = _drawn(plots.tradeoff, _doc())
    assert svg is not None
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert len(boxes) == 9
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (a, b)


def _drawn_figures(doc) -> dict[str, object]:
    """Every figure the report draws for `doc`, as matplotlib drew it (captured at savefig)."""
    figures = {}
    for name, (_title, draw) in plots.PLOTS.items():
        svg, fig = _drawn(draw, doc)
        if svg is not None:
            figures[name] = fig
    return figures


def _undrawn_tick_labels(fig) -> set[int]:
    """Tick labels matplotlib keeps but does not draw (their tick lies outside the axis' view)."""
    out: set[int] = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-9
            for locs, labels in ((axis.get_majorticklocs(), axis.get_majorticklabels()),
                                 (axis.get_minorticklocs(), axis.get_minorticklabels())):
                for loc, label in zip(locs, labels):
                    if not lo - span <= loc <= hi + span:
                        out.add(id(label))
    return out


@pytest.mark.parametrize("source", ["quickstart", "crowded", "crowded-levels"])
def test_no_text_of_any_plot_is_clipped_or_overprinted(source, tmp_path):
    """Every text a plot draws (titles, axis labels, tick labels, legends, annotations), measured by
    matplotlib's renderer after the final layout: inside the figure (not clipped by the SVG's edge)
    and clear of every other text of the figure (no overprint). On the recorded quickstart run's
    report document, and on a crowded synthetic one (three variants x three levels)."""
    from matplotlib.text import Text

    if source == "crowded-levels":
        from truthput.report.document import LatencyRow

        doc = _doc()
        for c in doc.cells:
            c.tpot_p50 = _fig(0.011 * (c.concurrency or 1) ** 0.3, "s", "client_clock")
            c.e2e_p50 = _fig(2.5 * (c.concurrency or 1) ** 0.3, "s", "client_clock")
        doc.latency = [LatencyRow(
            variant=c.variant, concurrency=c.concurrency, rate=None, level=c.level, ttft_ms=[100.0, 200.0],
            itl_ms=[10.0, 12.0], n_requests=2, n_failed=0, source="client_clock", note="",
            requests_per_s=_fig(1.5 * c.concurrency, "req/s", "client_clock"),
            prompt_tps=_fig(900.0 * c.concurrency, "tok/s", "usage"),
            kv_usage_max=_fig(min(1.0, 0.03 * c.concurrency), "fraction", "server_counter"),
            waiting_mean=_fig(max(0.0, c.concurrency - 16.0), "requests", "server_counter"),
            preemptions=_fig(3.0 if c.concurrency == 32 else 0.0, "requests", "server_counter"))
            for c in doc.cells]
        figures = _drawn_figures(doc)
        assert "levels" in figures
    elif source == "quickstart":
        from report_fixture import restore_quickstart_db

        from truthput.report.data import build_report_data
        from truthput.store.db import Store

        store = Store(restore_quickstart_db(tmp_path / "q.db"), read_only=True)
        doc = build_report_data(store, store.resolve_run("latest"))
    else:
        doc = _doc()
    figures = _drawn_figures(doc)
    assert figures
    for name, fig in figures.items():
        fig.set_dpi(72)  # the SVG's own resolution: laid out again there, as the saved SVG was
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        edge = fig.bbox
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
                 and id(t) not in _undrawn_tick_labels(fig)]
        boxes = []
        for t in texts:
            box = t.get_window_extent(renderer)
            if box.width == 0 or box.height == 0:
                continue
            assert (box.x0 >= edge.x0 - 1 and box.y0 >= edge.y0 - 1 and box.x1 <= edge.x1 + 1
                    and box.y1 <= edge.y1 + 1), f"{name}: {t.get_text()!r} clipped at the figure's edge ({box})"
            boxes.append((t.get_text(), box))
        for i, (ta, a) in enumerate(boxes):
            for tb, b in boxes[i + 1:]:
                inter_w = min(a.x1, b.x1) - max(a.x0, b.x0)
                inter_h = min(a.y1, b.y1) - max(a.y0, b.y0)
                assert not (inter_w > 1 and inter_h > 1), f"{name}: {ta!r} overprints {tb!r}"


def test_the_tune_reports_names_do_not_overprint():
    """Six measured configurations on one Pareto front, close together: every name is drawn clear
    of the others and inside the figure (the tune report's plot uses the same label placement)."""
    from truthput.report.document import TuneCorrection, TuneDocument, TuneRow
    from truthput.report.tune import tradeoff_plot

    rows = [TuneRow(config=f"--max-num-seqs={16 * (i + 1)} --spec-tokens={i % 3}", server=1000.0 + 60 * i,
                    server_itl_p99_s=0.020 + 0.0015 * i, server_starts=2) for i in range(6)]
    doc = TuneDocument(name="t", objective="max tok/s", figure="tok/s", level="c=32", screened=40, screen_failed=0,
                       screen_cpu_s=1.0, measured=rows, server_minutes=3.0, server_starts=12,
                       correction=TuneCorrection())
    svg, fig = _drawn(tradeoff_plot, doc)
    assert svg is not None
    fig.set_dpi(72)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    names = [t for t in fig.axes[0].texts if t.get_text().startswith("--max")]
    assert len(names) == 6
    boxes = [t.get_window_extent(renderer) for t in names]
    for i, a in enumerate(boxes):
        assert fig.bbox.x0 <= a.x0 and a.x1 <= fig.bbox.x1 and fig.bbox.y0 <= a.y0 and a.y1 <= fig.bbox.y1
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
