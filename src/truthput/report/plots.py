"""The report's plots as inline SVG strings (matplotlib's SVG backend, no pyplot state, no network).

Why SVG inline: the HTML report must open anywhere with no network and stay one file. Text stays
text (svg.fonttype = none) so it is searchable, and matplotlib XML-escapes every label, so a
variant named `<script>` is drawn as text. Every plot's title names the provenance of its figures;
a simulated run's plots say SIMULATED in the title.

Each function takes the report document (truthput.report.data) and returns an SVG string, or None
when the run has nothing to plot for it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Callable

from truthput.analyze.cells import source_label
from truthput.analyze.pareto import pareto_front
from truthput.report.document import CellRow, LevelRow, ReportDocument

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _figure(width: float = 7.0, height: float = 3.6, ncols: int = 1, nrows: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    from matplotlib.figure import Figure

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # a canvas to measure text on (labels are placed by their drawn size)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _svg(fig: Any, salt: str) -> str:
    import matplotlib

    matplotlib.rcParams["svg.hashsalt"] = f"truthput-{salt}"
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def _tag(doc: ReportDocument) -> str:
    return " — SIMULATED" if doc.simulated else ""


def _headline_source(doc: ReportDocument) -> str:
    """What the plotted tok/s were read from, as the cells say: "server counter", or usage where
    no counter stood (a plot's title never claims a counter that was not read)."""
    sources = list(dict.fromkeys(c.tokps.provenance for c in doc.ok_cells if c.tokps is not None))
    return " / ".join(source_label(s) for s in sources) or "server counter"


def _colour(doc: ReportDocument, name: str) -> str:
    names = doc.variant_names
    return PALETTE[names.index(name) % len(PALETTE)] if name in names else "#555555"


def _tokps(c: CellRow) -> float:
    assert c.tokps is not None and c.tokps.value is not None  # ok_cells only
    return c.tokps.value


def _x(row: LevelRow) -> float:
    """A row's level on the x axis: streams, or the offered rate."""
    return float(row.rate if row.rate is not None else (row.concurrency or 0))


def _x_label(rows: Sequence[LevelRow]) -> str:
    return ("offered rate (req/s)" if any(r.rate is not None for r in rows) else "concurrency (streams)")


def _level_axis(ax: Any, rows: Sequence[LevelRow]) -> None:
    """A log2 level axis with ticks at the measured levels only, in plain numbers ("1", "8", "2.5")."""
    from matplotlib.ticker import FixedLocator, NullLocator

    levels = sorted({_x(r) for r in rows})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(levels))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(levels, [f"{v:g}" for v in levels])
    if len(levels) == 1:
        ax.set_xlim(levels[0] / 1.5, levels[0] * 1.5)
    ax.set_xlabel(_x_label(rows))


def _plain_log_axis(axis: Any) -> None:
    """A log axis labelled in plain numbers (300, not 3x10^2)."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _pos: f"{v:g}")
    axis.set_major_formatter(fmt)
    axis.set_minor_formatter(FuncFormatter(lambda v, _pos: ""))


def place_labels(ax: Any, points: list[tuple[float, float]], texts: list[str]) -> list[Any]:
    """Annotations next to their points, none overlapping another or a point's marker, none
    crossing the axes' edge (where the SVG would clip it or a tick label would sit under it): each
    tries offsets around its point and keeps the first whose box is clear and inside (else the
    least crowded one inside, else the least crowded)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)

    def outside(b: Any) -> bool:
        return bool(b.x0 < frame.x0 or b.x1 > frame.x1 or b.y0 < frame.y0 or b.y1 > frame.y1)

    offsets = [(4, 4), (4, -12), (-4, 4), (-4, -12), (4, 14), (-4, 14), (4, -22), (-4, -22), (12, -4), (-12, -4)]
    placed: list[Any] = []
    boxes: list[Any] = []
    for (x, y), text in zip(points, texts):
        best, best_hits = None, None
        for dx, dy in offsets:
            ann = ax.annotate(text, (x, y), fontsize=7, xytext=(dx, dy), textcoords="offset points",
                              ha="left" if dx >= 0 else "right", va="bottom")
            ann.set_in_layout(False)  # the layout is fixed before labels are placed
            box = ann.get_window_extent(renderer)
            hits = sum(1 for b in boxes if b.overlaps(box)) + (1000 if outside(box) else 0)
            if hits == 0:
                if best is not None:
                    best.remove()
                best, best_hits = ann, 0
                break
            if best_hits is None or hits < best_hits:
                if best is not None:
                    best.remove()
                best, best_hits = ann, hits
            else:
                ann.remove()
        if best is not None:
            placed.append(best)
            boxes.append(best.get_window_extent(renderer))
    return placed


def throughput(doc: ReportDocument) -> str | None:
    cells = doc.ok_cells
    if not cells:
        return None
    fig, (ax,) = _figure()
    for name in doc.variant_names:
        rows = sorted((c for c in cells if c.variant == name), key=_x)
        if not rows:
            continue
        x = [_x(c) for c in rows]
        y = [_tokps(c) for c in rows]
        lo = [_tokps(c) - c.tokps.lo if c.tokps and c.tokps.lo is not None else 0 for c in rows]
        hi = [c.tokps.hi - _tokps(c) if c.tokps and c.tokps.hi is not None else 0 for c in rows]
        # points at the measured levels only: a line would claim the levels in between
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=4, label=name, color=_colour(doc, name),
                    linestyle="none")
    _level_axis(ax, cells)
    ax.set_ylabel("output tok/s")
    ax.set_title(f"Output throughput vs load level, 95% CI [{_headline_source(doc)}{_tag(doc)}]")
    ax.legend(fontsize=8)
    return _svg(fig, "throughput")


def tradeoff(doc: ReportDocument) -> str | None:
    cells = doc.ok_cells
    if not cells:
        return None
    fig, axes = _figure(width=9.0, height=3.8, ncols=2)
    # the title first: labels are placed on the final layout
    fig.suptitle(f"Throughput-latency trade-off per variant x concurrency (Pareto front circled){_tag(doc)}")
    to_label: list[tuple[Any, list[tuple[float, float]], list[str]]] = []
    for ax, key, label in ((axes[0], "ttft_p99", "TTFT p99 (ms)"), (axes[1], "itl_p99", "ITL p99 (ms)")):
        pts: list[tuple[float, float]] = []
        meta: list[CellRow] = []
        for c in cells:
            fig_lat = getattr(c, key)
            if fig_lat is None or fig_lat.value is None:
                continue
            pts.append((fig_lat.value * 1e3, _tokps(c)))
            meta.append(c)
        if not pts:
            ax.text(0.5, 0.5, "no latency data", ha="center", transform=ax.transAxes)
            continue
        for (x, y), c in zip(pts, meta):
            ax.scatter([x], [y], color=_colour(doc, c.variant), s=30, zorder=3)
        front = sorted((pts[i] for i in pareto_front(pts)), key=lambda p: p[0])
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1, label="Pareto front", zorder=2)
        ax.scatter([p[0] for p in front], [p[1] for p in front], facecolors="none", edgecolors="k", s=90, zorder=4)
        ax.set_xlabel(f"{label} [client clock]")
        ax.set_ylabel(f"output tok/s [{_headline_source(doc)}]")
        ax.legend(fontsize=7, loc="lower right")
        to_label.append((ax, pts, [f"{c.variant} {c.level}" for c in meta]))
    if not to_label:
        return None
    # lay the axes out once (text measured, nothing rasterised), then place labels where they do not
    # collide; labels stay out of the layout, so saving it keeps these positions
    fig.draw_without_rendering()
    for ax, pts, texts in to_label:
        place_labels(ax, pts, texts)
    return _svg(fig, "tradeoff")


def _line_per_variant(ax: Any, doc: ReportDocument, rows: Sequence[Any], value: Callable[[Any], Any]) -> None:
    """One line per variant over concurrency (log2 axis), in the variant's colour."""
    for name in doc.variant_names:
        rs = sorted((r for r in rows if r.variant == name), key=_x)
        if rs:
            ax.plot([_x(r) for r in rs], [value(r) for r in rs], marker="o", linestyle="none",
                    label=name, color=_colour(doc, name))
    _level_axis(ax, rows)


def _points(doc: ReportDocument, rows: Sequence[Any], value: Callable[[Any], Any], ylabel: str, title: str,
            name: str) -> str | None:
    """One figure of one value per variant over the levels (`rows` with a value; None: no plot)."""
    if not rows:
        return None
    fig, (ax,) = _figure()
    _line_per_variant(ax, doc, rows, value)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n[usage, client clock{_tag(doc)}]")
    ax.legend(fontsize=8)
    return _svg(fig, name)


def per_stream(doc: ReportDocument) -> str | None:
    return _points(doc, [c for c in doc.ok_cells if c.per_stream is not None and c.per_stream.value is not None],
                   lambda c: c.per_stream.value, "tok/s per stream",
                   "Per-stream decode speed vs concurrency (median)", "per_stream")


def goodput(doc: ReportDocument) -> str | None:
    rows = [r for r in doc.goodput or [] if r.good_tokens_per_s.value is not None]
    return _points(doc, rows, lambda r: r.good_tokens_per_s.value, "good tok/s",
                   f"Goodput under SLO ({rows[0].slo.text() if rows else ''})", "goodput")


def latency_distributions(doc: ReportDocument) -> str | None:
    cells = doc.latency
    if not any(c.ttft_ms or c.itl_ms for c in cells):
        return None
    fig, axes = _figure(width=9.0, height=3.8, ncols=2)
    styles = ("-", "--", ":", "-.")
    levels = sorted({_x(c) for c in cells})
    for ax, key, label in ((axes[0], "ttft_ms", "TTFT per request (ms)"),
                           (axes[1], "itl_ms", "mean ITL per request (ms)")):
        for c in cells:
            xs, ys = c.ecdf(key)
            if not xs:
                continue
            ax.step(xs, ys, where="post", color=_colour(doc, c.variant),
                    linestyle=styles[levels.index(_x(c)) % len(styles)],
                    label=f"{c.variant} {c.level}")
        ax.set_xscale("log")
        _plain_log_axis(ax.xaxis)
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests ≤ x")
    for ax in (axes[1], axes[0]):  # the legend where there are lines (a trial may have no ITL: one token each)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
            break
    fig.suptitle(f"TTFT and ITL distributions (ECDF) [client clock, requests table{_tag(doc)}]")
    return _svg(fig, "latency")


def acceptance(doc: ReportDocument) -> str | None:
    rows = [s for s in doc.spec_decode if s.per_position]
    if not rows:
        return None
    fig, (ax,) = _figure()
    styles = ("-", "--", ":", "-.")
    levels = sorted({_x(s) for s in rows})
    for s in rows:
        x = [(p.position or 0) + 1 for p in s.per_position]
        y = [p.value for p in s.per_position]
        mal = s.mean_acceptance_length.value
        ax.plot(x, y, marker="o", color=_colour(doc, s.variant),
                linestyle=styles[levels.index(_x(s)) % len(styles)],
                label=f"{s.variant} {s.level}" + (f" (mean length {mal:.2f})" if mal else ""))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(sorted({(p.position or 0) + 1 for s in rows for p in s.per_position}))
    ax.set_title(f"Speculative acceptance per position [server counter{_tag(doc)}]")
    ax.legend(fontsize=7)
    return _svg(fig, "acceptance")


def roofline(doc: ReportDocument) -> str | None:
    rows = doc.roofline.cells
    if not rows:
        return None
    fig, axes = _figure(width=9.0, height=3.8, ncols=2)
    labels = [f"{r.variant}\n{r.level}" for r in rows]
    colours = [_colour(doc, r.variant) for r in rows]
    pct = [r.pct_of_tightest.value or 0.0 for r in rows]
    axes[0].bar(range(len(rows)), pct, color=colours)
    axes[0].axhline(70, color="k", ls="--", lw=1, label="binding threshold (70%)")
    axes[0].set_xticks(range(len(rows)), labels, fontsize=7)
    axes[0].set_ylabel("% of the tightest ceiling")
    axes[0].set_ylim(0, max(100, max(pct) * 1.1))
    axes[0].legend(fontsize=7)
    floor = [(r.measured_step_ms.value or 0.0) - (r.unexplained_ms.value or 0.0) for r in rows]
    unexplained = [r.unexplained_ms.value or 0.0 for r in rows]
    axes[1].bar(range(len(rows)), floor, color="#999999", label="tightest step floor (model)")
    axes[1].bar(range(len(rows)), unexplained, bottom=floor, color=colours, alpha=0.6,
                label="simulator's modelled overhead" if doc.simulated else "unexplained")
    axes[1].set_xticks(range(len(rows)), labels, fontsize=7)
    axes[1].set_ylabel("ms per decode step")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Where the wall is: measured [{_headline_source(doc)}{_tag(doc)}] vs roofline [model]")
    return _svg(fig, "roofline")


def level_figures(doc: ReportDocument) -> str | None:
    """Six panels against the level, one marker per variant: the client's req/s, TPOT p50 and E2E
    p50, and what the server's own /metrics said inside the window (KV-cache use, waiting queue,
    preemptions). A panel the engine has no series for says so instead of plotting zeros."""
    rows = doc.latency
    if not rows:
        return None
    cells = {(c.variant, c.level): c for c in doc.cells}

    def cell_value(r: Any, key: str, scale: float) -> float | None:
        f = getattr(cells.get((r.variant, r.level)), key, None)
        return None if f is None or f.value is None else f.value * scale

    def row_value(key: str, scale: float = 1.0) -> Callable[[Any], float | None]:
        def read(r: Any) -> float | None:
            f = getattr(r, key)
            return None if f is None or f.value is None else f.value * scale
        return read

    panels: list[tuple[str, str, Callable[[Any], float | None]]] = [
        ("requests/s", "client clock", row_value("requests_per_s")),
        ("TPOT p50 (ms)", "client clock", lambda r: cell_value(r, "tpot_p50", 1000.0)),
        ("E2E latency p50 (s)", "client clock", lambda r: cell_value(r, "e2e_p50", 1.0)),
        ("KV-cache use, max (%)", "server gauge", row_value("kv_usage_max", 100.0)),
        ("requests waiting, mean", "server gauge", row_value("waiting_mean")),
        ("preemptions per trial", "server counter", row_value("preemptions")),
    ]
    if not any(read(r) is not None for _t, _s, read in panels for r in rows):
        return None
    fig, axes = _figure(width=9.0, height=5.2, ncols=3, nrows=2)
    for ax, (title, source, read) in zip(axes, panels):
        known = [r for r in rows if read(r) is not None]
        ax.set_title(f"{title} [{source}]", fontsize=8)
        if not known:
            ax.text(0.5, 0.5, "no such series\nin this run's scrapes" if source != "client clock"
                    else "no request finished\ninside the window",
                    ha="center", va="center", transform=ax.transAxes, fontsize=8, color="#777777")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        _line_per_variant(ax, doc, known, read)
        ax.set_ylim(bottom=0)
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        for hh, ll in zip(h, lab):
            if ll not in labels:
                handles.append(hh)
                labels.append(ll)
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6), fontsize=8)
    fig.suptitle(f"Requests, latency and the server's own queue per load level (medians over trials){_tag(doc)}")
    return _svg(fig, "levels")


PLOTS: dict[str, tuple[str, Callable[[ReportDocument], str | None]]] = {
    "throughput": ("Throughput vs concurrency", throughput),
    "tradeoff": ("Throughput-latency trade-off", tradeoff),
    "goodput": ("Goodput under the SLOs", goodput),
    "per_stream": ("Per-stream speed vs concurrency", per_stream),
    "levels": ("Requests, latency and the server's queue per level", level_figures),
    "latency": ("TTFT and ITL distributions", latency_distributions),
    "acceptance": ("Speculative acceptance per position", acceptance),
    "roofline": ("% of roofline and unexplained time per step", roofline),
}


def render_plots(doc: ReportDocument) -> dict[str, str | None]:
    """name -> SVG (None when the run has nothing for that plot)."""
    return {name: fn(doc) for name, (_title, fn) in PLOTS.items()}
