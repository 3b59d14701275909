"""The HTML report: one self-contained file (inline CSS and SVG, no script, no network).

Why jinja2 with autoescape ON: log lines, prompts, variant names and argv come from servers and
users; every one of them is escaped, so a log line holding `<script>` shows as text. The only
markup inserted unescaped is matplotlib's SVG, which is checked to hold no script or event handler.
"""

from __future__ import annotations

import re
from typing import Any

from truthput.analyze.cells import source_label
from truthput.experiment.levels import row_header, row_level
from truthput.report.columns import shown_columns
from truthput.report.document import ReportDocument

SECTIONS = (
    ("verdict", "Verdict"), ("experiment", "Experiment"), ("cells", "Throughput table"),
    ("throughput", "Throughput vs concurrency"), ("tradeoff", "Trade-off"), ("goodput", "Goodput"),
    ("per_stream", "Per-stream speed"), ("levels", "Per-level figures"), ("latency", "Latency distributions"), ("acceptance", "Speculation"),
    ("roofline", "Roofline"), ("audit", "Audit and claims"), ("failures", "Failures"),
    ("telemetry", "GPU telemetry"), ("trials", "Raw trials"),
)

PLOT_SECTIONS = (
    ("throughput", "Throughput vs concurrency",
     "Output tok/s ({headline}) over the steady-state window; bars: 95% interval over server starts."),
    ("tradeoff", "Throughput-latency trade-off",
     "Each point is one variant at one concurrency: tok/s ({headline}) against TTFT p99 and ITL p99 (client clock). Circled: the Pareto front (no other cell is both faster and lower-latency)."),
    ("goodput", "Goodput under the experiment's SLOs",
     "Completion tokens (usage) of requests that met every latency target and finished in the window, per second."),
    ("per_stream", "Per-stream speed vs concurrency",
     "Median per request of (completion tokens - 1) / (last chunk - first token): what one user sees, not aggregate throughput."),
    ("levels", "Requests, latency and the server's queue per level",
     "Medians over each cell's trials. Top: requests finished inside the window per second, TPOT and end-to-end latency (client clock). Bottom: the server's own /metrics at the scrapes inside the window: KV-cache use (highest), requests waiting (mean), preemptions (counter delta)."),
    ("latency", "TTFT and ITL distributions",
     "Empirical CDFs over every request of the cell, from the requests table (client clock)."),
    ("acceptance", "Speculative acceptance per position",
     "Share of drafts whose token at this position was accepted, from the engine's spec-decode counters over the window."),
    ("roofline", "% of roofline and unexplained time per step",
     "Left: measured tok/s as a share of the tightest physical ceiling (model, peak datasheet figures). Right: the measured time per decode step split into the tightest floor and what no modelled resource explains."),
)

ABSENT = {
    "throughput": "no successful cell to plot",
    "tradeoff": "no latency figures to plot",
    "goodput": "no SLOs set in the experiment, so no goodput (set ttft_ms / itl_ms / e2e_ms targets)",
    "per_stream": "no per-stream figures",
    "levels": "no request or server figures per level",
    "latency": "no request timings stored",
    "acceptance": "no speculative decoding in this run (or no spec-decode counters exposed)",
    "roofline": "no roofline for this run",
}

_UNSAFE_SVG = re.compile(r"<\s*script|\son[a-z]+\s*=|javascript:|<\s*foreignObject", re.IGNORECASE)


def safe_svg(svg: str | None) -> str | None:
    """matplotlib's SVG, refused if it holds anything executable (it never should)."""
    if svg is None:
        return None
    if _UNSAFE_SVG.search(svg):
        return None
    return svg


def _environment() -> Any:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("truthput.report", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    del StrictUndefined  # lenient: an absent optional key renders as empty
    env.filters["plain"] = plain_value
    env.filters["pct"] = _pct
    return env


def plain_value(value: Any) -> str:
    """A metadata value as a person reads it: a mapping as "key value, ...", a list comma-separated,
    never a Python repr."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {plain_value(v)}" for k, v in value.items() if v not in (None, "", [], {}))
    if isinstance(value, (list, tuple)):
        return ", ".join(plain_value(v) for v in value) or "none"
    return "" if value is None else str(value)


def _pct(x: float, sign: bool = True) -> str:
    """A percentage as the terminal and markdown show it: beyond +-999% a bound (">+999%"), so one
    start's runaway interval cannot stretch a table off the page."""
    from truthput.text import capped, percent

    return percent(x) if sign else capped(x, "{:+.1f}")


def render_html(doc: ReportDocument, plots: dict[str, str | None] | None = None) -> str:
    """The HTML page for a report document (plots made here unless given)."""
    if plots is None:
        from truthput.report.plots import render_plots

        plots = render_plots(doc)
    absent = dict(ABSENT)
    if not doc.roofline.available:
        absent["roofline"] = f"no roofline: {doc.roofline.reason}"
    template = _environment().get_template("report.html.j2")
    page: str = template.render(doc=doc, plots={k: safe_svg(v) for k, v in plots.items()}, sections=SECTIONS,
                           plot_sections=[(k, title, caption.replace("{headline}", doc.headline.label))
                                          for k, title, caption in PLOT_SECTIONS], absent=absent, level_header=row_header(doc.cells),
                           level_cell=row_level, source_label=source_label, cell_figures=shown_columns(doc.cells))
    return page
