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


def test_level_ticks_are_the_measured_levels_in_plain_numbers():
    svg = plots.throughput(_doc(levels=(1, 8, 32)))
    texts = _texts(svg)
    for label in ("1", "8", "32"):
        assert label in texts
    for never in ("2", "4", "16"):  # levels not measured get no tick
        assert never not in texts
    assert "2^" not in svg and "mathdefault" not in svg


def test_no_line_joins_levels():
    import matplotlib

    from matplotlib.figure import Figure

    captured = {}
    real = Figure.savefig

    def grab(self, *a, **k):
        captured["fig"] = self
        return real(self, *a, **k)

    Figure.savefig = grab
    try:
        plots.throughput(_doc())
    finally:
        Figure.savefig = real
    ax = captured["fig"].axes[0]
    drawn = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
    assert drawn and all(ln.get_linestyle() in ("None", "none", "") for ln in drawn)
    del matplotlib


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
    from matplotlib.figure import Figure

    captured = {}
    real = Figure.savefig

    def grab(self, *a, **k):
        out = real(self, *a, **k)
        captured["fig"] = self
        return out

    Figure.savefig = grab
    try:
        assert plots.tradeoff(_doc()) is not None
    finally:
        Figure.savefig = real
    fig = captured["fig"]
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert len(boxes) == 9
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (a, b)
