"""The markdown report: verdict and main tables, ready to paste into a GitHub issue or PR.

Why its own escaping: GitHub renders inline HTML in markdown, so text from servers or users
(variant names, log lines, argv) is escaped for HTML and for table pipes before it goes in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from truthput.text import capped, percent
from truthput.analyze.cells import source_label
from truthput.experiment.levels import row_header, row_level
from truthput.report.columns import FigureColumn, shown_columns
from truthput.report.document import CellRow, Figure, ReportDocument


def md_text(text: Any) -> str:
    """One table cell / inline span: no HTML tag can open ("<" escaped; "->" and "a & b" stay as
    written), pipes and newlines neutralised."""
    s = ("" if text is None else str(text)).replace("<", "&lt;")
    return s.replace("|", "\\|").replace("\r", " ").replace("\n", " ").replace("`", "'")


def _num(f: Figure | None, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    if f is None or f.value is None:
        return "–"
    return fmt.format(f.value * scale)


def _marks(f: Figure | None) -> str:
    return _codes(f.flag_codes) if f is not None else ""


def _codes(codes: list[str]) -> str:
    """' !code,code' after a flagged figure (the reasons are listed under the verdict)."""
    return " !" + ",".join(dict.fromkeys(codes)) if codes else ""


def _measured(f: Figure) -> str:
    """A measured figure with its source and flags, as every table of the report shows them."""
    flags = "".join(f" !{md_text(code)}" for code in f.flag_codes)
    return f"{_num(f)} [{md_text(f.label or f.source)}]{flags}"


_NUMBER = re.compile(r"^[+\-–]?(\d|–$)")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A pipe table; a column of figures is right-aligned, a column of words left-aligned."""
    def numeric(i: int) -> bool:
        cells = [r[i].strip() for r in rows if i < len(r) and r[i].strip()]
        return bool(cells) and all(_NUMBER.match(c) for c in cells)

    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if numeric(i) else "---" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render_markdown(doc: ReportDocument) -> str:
    run = doc.run
    tag = ", simulated" if doc.simulated else ""
    lines = [*_head(doc), *_verdict(doc), *_variants(doc), *_cells(doc, tag), *_levels(doc, tag), *_roofline(doc),
             *_speculation(doc, tag), *_audit(doc), *_claims_and_failures(doc)]
    lines += ["", f"<sub>truthput report schema {md_text(doc.schema_)}; full figures with provenance: "
                  f"`truthput report {md_text(run.id)} --json PATH`</sub>", ""]
    return "\n".join(lines)


def _head(doc: ReportDocument) -> list[str]:
    run = doc.run
    lines = [f"## truthput: {md_text(run.name)} (`{md_text(run.id)}`)", ""]
    if doc.simulated:
        lines += ["> **SIMULATED**: every figure below comes from the embedded simulator (a physics model), "
                  "not from a measurement of real hardware.", ""]
    hw, model = doc.experiment.hardware, doc.experiment.model
    lines.append(f"engine {md_text(run.engine)} · status {md_text(run.status)} · "
                 f"{md_text(hw.count) + ' × ' + md_text(hw.gpu) if hw else 'hardware not given'} · "
                 f"model {md_text((model.profile or model.path if model else None) or 'not given')} · "
                 f"seed {md_text(run.seed)} · truthput {md_text(run.versions.truthput)}")
    return lines


def _verdict(doc: ReportDocument) -> list[str]:
    lines = ["", "### Verdict", ""]
    lines += [f"- {md_text(line)}" for line in doc.verdict.lines] or ["- no verdict"]
    if doc.verdict.guard:
        lines.append("- output guard (greedy outputs vs baseline): " +
                     ", ".join(f"{md_text(k)}: {md_text(g.verdict)}" for k, g in doc.verdict.guard.items()))
    lines += [f"- **failed** {md_text(name)}: {md_text(why)}" for name, why in doc.verdict.failed.items()]
    lines += [f"- **warning** {md_text(w)}" for w in doc.warnings]
    return lines + [f"- **flagged** {md_text(f)}" for f in doc.flags]


def _variants(doc: ReportDocument) -> list[str]:
    return ["", "### Variants (argv diff vs the base command)", "",
            *_table(["variant", "diff"], [[md_text(v.name) + (" (baseline)" if v.baseline else ""),
                                           "<br>".join(md_text(x) for x in v.diff_lines) or "(no change)"]
                                          for v in doc.experiment.variants])]


def _cells(doc: ReportDocument, tag: str) -> list[str]:
    """The cell table, column by column (`report.columns.CELL_FIGURES` gives the figure columns)."""
    def tokps(c: CellRow) -> str:
        t = c.tokps
        if not c.ok or t is None:
            return md_text(c.status)
        label = f" [{md_text(source_label(t.provenance))}]" if doc.headline.marks(t.provenance) else ""
        return _num(t) + label + _marks(t)

    def interval(c: CellRow) -> str:
        t = c.tokps
        if not c.ok or t is None:
            return ""
        return f"{t.lo:.1f}..{t.hi:.1f}" if t.lo is not None and t.hi is not None else "– (1 start)"

    def delta(c: CellRow) -> str:
        d = c.delta_pct
        if c.baseline or d is None or d.value is None:
            return "baseline" if c.baseline else "–"
        return percent(d.value) + (f" ({capped(d.lo, '{:+.1f}')}..{capped(d.hi, '{:+.1f}')})"
                                   if d.lo is not None and d.hi is not None else "")

    def figures(col: FigureColumn) -> Callable[[CellRow], str]:
        return lambda c: col.text(c, "–") + _codes([f.code for f in col.flags(c)])

    columns: list[tuple[str, Callable[[CellRow], str]]] = [
        ("variant", lambda c: md_text(c.variant) + (" *" if c.baseline else "")),
        (row_header(doc.cells), row_level), ("tok/s", tokps), ("95% CI", interval), ("vs baseline (CI)", delta),
        *((f"{col.header} [{col.source}{tag}]", figures(col)) for col in shown_columns(doc.cells))]
    return ["", f"### Throughput (output tok/s: {doc.headline.label}{tag})", "",
            *_table([h for h, _r in columns], [[render(c) for _h, render in columns] for c in doc.cells]),
            "", f"\\* baseline. tok/s = {md_text(doc.headline.definition)}; the interval is over server starts."
            + (f" Prefix-cache hits beside what the workload shares by design: "
               f"{md_text(doc.experiment.workload_shares)}." if doc.experiment.workload_shares else "")]


def _levels(doc: ReportDocument, tag: str) -> list[str]:
    if not doc.latency:
        return []
    cells = {(c.variant, c.level): c for c in doc.cells}
    rows = []
    for r in doc.latency:
        cell = cells.get((r.variant, r.level))
        rows.append([
            md_text(r.variant), row_level(r), _num(r.requests_per_s, 1, "{:.2f}"), _num(r.prompt_tps),
            _num(cell.tpot_p50 if cell else None, 1000), f"{_num(cell.e2e_p50 if cell else None, 1, '{:.2f}')} / "
            f"{_num(cell.e2e_p90 if cell else None, 1, '{:.2f}')}", _num(r.kv_usage_max, 100, "{:.0f}%"),
            f"{_num(r.waiting_mean)} / {_num(r.waiting_max, 1, '{:.0f}')}", _num(r.preemptions)])
    return ["", f"### Requests, latency and what the server saw (medians over trials{tag})", "",
            *_table(["variant", row_header(doc.latency), "req/s [client clock]", "prompt tok/s [usage]",
                     "TPOT p50 ms", "E2E p50 / p90 s", "KV-cache use max [server]", "waiting mean / max [server]",
                     "preemptions per trial [server]"], rows)]


def _roofline(doc: ReportDocument) -> list[str]:
    roof = doc.roofline
    if not roof.available:
        return []
    lines = ["", f"### Roofline ({md_text(roof.gpu_count)} × {md_text(roof.gpu)}, "
                 f"{md_text(roof.model)}; ceilings are model figures, not measurements)", ""]
    lines += _table(["variant", row_header(roof.cells), "measured tok/s", "tightest ceiling", "% of it",
                     "simulator overhead ms/step" if doc.simulated else "unexplained ms/step", "reading"],
                    [[md_text(r.variant), row_level(r), _measured(r.measured),
                      _num(r.tightest_ceiling), _num(r.pct_of_tightest, 1, "{:.0f}%"),
                      _num(r.unexplained_ms), md_text(r.reading)] for r in roof.cells])
    return lines + [f"- {md_text(n)}" for n in roof.notes]


def _speculation(doc: ReportDocument, tag: str) -> list[str]:
    if not doc.spec_decode:
        return []
    return ["", f"### Speculative decoding (server counter{tag})", "",
            *_table(["variant", row_header(doc.spec_decode), "k", "mean acceptance length", "per position"],
                    [[md_text(s.variant), row_level(s), md_text(s.k), _num(s.mean_acceptance_length, 1, "{:.3f}"),
                      ", ".join(_num(p, 1, "{:.3f}") for p in s.per_position)] for s in doc.spec_decode])]


def _audit(doc: ReportDocument) -> list[str]:
    audit = [a for a in doc.audit if a.cause != "reference"]
    if not audit:
        return []
    return ["", f"### Audit: other ways of counting vs {doc.audit_against}", "",
            *_table(["variant", row_header(audit), "method", "tok/s", "vs headline", "cause"],
                    [[md_text(a.variant), row_level(a), md_text(a.method),
                      "–" if a.tokps is None else f"{a.tokps:.1f}",
                      "–" if a.error_pct_vs_counter is None else percent(a.error_pct_vs_counter),
                      md_text(a.cause)] for a in audit])]


def _claims_and_failures(doc: ReportDocument) -> list[str]:
    lines = []
    if doc.claims.results:
        lines += ["", "### Claims", ""]
        lines += _table(["claim", "verdict", "why"], [[md_text(c.text), md_text(c.verdict), md_text(c.reason)]
                                                     for c in doc.claims.results])
    if doc.failures:
        lines += ["", "### Failures", ""]
        lines += [f"- **{md_text(f.variant)}** {md_text(f.kind)}: {md_text(f.failure_class)} — {md_text(f.reason)}"
                  + (f" (`{md_text(f.line)}`)" if f.line else "") for f in doc.failures]
    return lines
