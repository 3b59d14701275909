"""The tune report: what the simulator ranked, what the server measured, the choice (a view only).

Rendered from the document `truthput.tune.driver.outcome_document` builds. The plot sets each
measured configuration's objective figure (counter tok/s, or goodput tok/s) against its p99 inter-token latency, with the simulator's screen
behind it in grey and the measured Pareto front drawn; figures from the simulator are labelled as
such, and a tune whose "server" was itself the simulator says SIMULATED.
"""

from __future__ import annotations

from typing import Any

from truthput.report.document import TuneDocument

_TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>truthput tune: {{ d.name }}</title>
<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 6px;font-size:90%}td.n{text-align:right}</style></head><body>
<h1>truthput tune: {{ d.name }}{% if d.server_simulated %} — SIMULATED server{% endif %}</h1>
<p><b>Chosen:</b> {{ d.chosen }}<br>{{ d.chosen_line }}</p>
<p>{{ d.screened }} configurations screened on the simulator ({{ d.screen_failed }} would not start) in
{{ '%.1f' % d.screen_cpu_s }} CPU-s; {{ d.server_starts }} server starts, {{ '%.1f' % d.server_minutes }}
server-minutes, over {{ d.rounds|length }} round(s); stopped: {{ d.stop_reason }}.<br>
Simulator vs server ranking (Spearman's rho over {{ d.rank_pairs }} configurations):
{{ 'n/a (fewer than 3)' if d.rank_correlation is none else '%.2f' % d.rank_correlation }}.</p>
{{ plot }}
<h2>Measured on the server ({{ d.figure }} at {{ d.level }})</h2>
<table><tr><th>configuration</th><th>simulator {{ d.figure }}</th><th>corrected</th><th>server {{ d.figure }}</th><th>starts</th>
<th>server p99 ITL ms</th><th>failure</th></tr>
{% for r in d.measured %}<tr><td>{{ r.config }}</td><td class=n>{{ f(r.simulated) }}</td>
<td class=n>{{ f(r.corrected) }}</td><td class=n>{{ f(r.server) }}</td><td class=n>{{ r.server_starts }}</td>
<td class=n>{{ ms(r.server_itl_p99_s) }}</td><td>{{ r.server_failure or '' }}</td></tr>{% endfor %}</table>
<h2>Rounds (the A/B verdict of each)</h2>
{% for r in d.rounds %}<h3>round {{ r.index }} (run {{ r.run }})</h3><ul>{% for ln in r.lines %}<li>{{ ln }}</li>{% endfor %}</ul>{% endfor %}
<h2>Best by the simulator, corrected (SIMULATED figures)</h2>
<table><tr><th>configuration</th><th>simulator {{ d.figure }}</th><th>corrected</th><th>simulator p99 ITL ms</th></tr>
{% for r in d.top_simulated %}<tr><td>{{ r.config }}</td><td class=n>{{ f(r.simulated) }}</td>
<td class=n>{{ f(r.corrected) }}</td><td class=n>{{ ms(r.simulated_itl_p99_s) }}</td></tr>{% endfor %}</table>
</body></html>
"""


def figure_text(v: Any) -> str:
    """An objective's figure as every tune view writes it: tok/s to 0.1, a tokens-per-joule
    figure (below 10) to 3 significant digits."""
    if v is None:
        return "missing"
    return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"


def _ms(v: Any) -> str:
    return "missing" if v is None else f"{v * 1000:,.0f}"


def tradeoff_plot(d: TuneDocument) -> str | None:
    """The objective's figure against p99 ITL: the simulator's screen (grey), the server's
    measurements, the front."""
    from truthput.analyze.pareto import pareto_front
    from truthput.report.plots import _figure, _svg, place_labels

    figure = "counter tok/s" if d.figure == "tok/s" else d.figure
    real = [(r.server_itl_p99_s, r.server, r.config) for r in d.measured if r.server and r.server_itl_p99_s]
    sim = [(p.itl_p99_s, p.value) for p in d.simulator_points if p.itl_p99_s]
    if not real and not sim:
        return None
    fig, (ax,) = _figure(7.0, 4.0)
    if sim:
        ax.scatter([x * 1000 for x, _ in sim], [y for _, y in sim], s=8, color="#bbbbbb",
                   label="simulator screen (SIMULATED)")
    if real:
        ax.scatter([x * 1000 for x, _, _ in real], [y for _, y, _ in real], s=28, color="#1f77b4",
                   label=f"server ({figure})" + (" — SIMULATED server" if d.server_simulated else ""))
        idx = pareto_front([(x, y) for x, y, _ in real])
        front = sorted((real[i] for i in idx), key=lambda p: p[0])
        ax.plot([x * 1000 for x, _, _ in front], [y for _, y, _ in front], color="#d62728", label="measured Pareto front")
    ax.set_xlabel("p99 inter-token latency (ms, client clock)")
    ax.set_ylabel(figure)
    ax.set_title(f"{figure} against p99 ITL")
    ax.legend(fontsize=7)
    if real:
        fig.canvas.draw()  # the final layout first: names are placed where they collide with nothing
        place_labels(ax, [(x * 1000, y) for x, y, _ in front], [name for _x, _y, name in front])
    return _svg(fig, "tune")


def render_tune_html(d: TuneDocument) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=True)
    plot = tradeoff_plot(d)
    import markupsafe

    page: str = env.from_string(_TEMPLATE).render(d=d, f=figure_text, ms=_ms, plot=markupsafe.Markup(plot or ""))
    return page
