"""The markdown report: verdict and main tables, ready to paste into a GitHub issue or PR.

Why its own escaping: GitHub renders inline HTML in markdown, so text from servers or users
(variant names, log lines, argv) is escaped for HTML and for table pipes before it goes in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from truthput.experiment.levels import row_header, row_level
from truthput.store.db import Store


def md_text(text: Any) -> str:
    """One table cell / inline span: no HTML tag can open ("<" escaped; "->" and "a & b" stay as
    written), pipes and newlines neutralised."""
    s = ("" if text is None else str(text)).replace("<", "&lt;")
    return s.replace("|", "\\|").replace("\r", " ").replace("\n", " ").replace("`", "'")


def _num(f: dict[str, Any] | None, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    if not f or f.get("value") is None:
        return "–"
    return fmt.format(f["value"] * scale)


def _measured(f: dict[str, Any]) -> str:
    """A measured figure with its source and flags, as every table of the report shows them."""
    flags = "".join(f" !{md_text(x['code'])}" for x in f.get("flags") or [])
    return f"{_num(f)} [{md_text(f.get('label') or f.get('source'))}]{flags}"


_NUMBER = re.compile(r"^[+\-–]?(\d|–$)")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A pipe table; a column of figures is right-aligned, a column of words left-aligned."""
    def numeric(i: int) -> bool:
        cells = [r[i].strip() for r in rows if i < len(r) and r[i].strip()]
        return bool(cells) and all(_NUMBER.match(c) for c in cells)

    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if numeric(i) else "---" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render_markdown(doc: dict[str, Any]) -> str:
    sim = doc.get("simulated")
    tag = ", simulated" if sim else ""
    run = doc["run"]
    lines = [f"## truthput: {md_text(run['name'])} (`{md_text(run['id'])}`)", ""]
    if sim:
        lines += ["> **SIMULATED**: every figure below comes from the embedded simulator (a physics model), "
                  "not from a measurement of real hardware.", ""]
    hw = doc["experiment"].get("hardware")
    model = doc["experiment"].get("model")
    lines.append(f"engine {md_text(run['engine'])} · status {md_text(run['status'])} · "
                 f"{md_text(hw['count']) + ' × ' + md_text(hw['gpu']) if hw else 'hardware not given'} · "
                 f"model {md_text((model or {}).get('profile') or (model or {}).get('path') or 'not given')} · "
                 f"seed {md_text(run['seed'])} · truthput {md_text(run['versions'].get('truthput'))}")
    lines += ["", "### Verdict", ""]
    lines += [f"- {md_text(line)}" for line in doc["verdict"]["lines"]] or ["- no verdict"]
    guard = doc["verdict"].get("guard") or {}
    if guard:
        lines.append("- output guard (greedy outputs vs baseline): " +
                     ", ".join(f"{md_text(k)}: {md_text(g.get('verdict'))}" for k, g in guard.items()))
    for name, why in (doc["verdict"].get("failed") or {}).items():
        lines.append(f"- **failed** {md_text(name)}: {md_text(why)}")
    for w in doc.get("warnings") or []:
        lines.append(f"- **warning** {md_text(w)}")
    for f in doc.get("flags") or []:
        lines.append(f"- **flagged** {md_text(f)}")

    lines += ["", "### Variants (argv diff vs the base command)", ""]
    lines += _table(["variant", "diff"], [[md_text(v["name"]) + (" (baseline)" if v["baseline"] else ""),
                                           "<br>".join(md_text(x) for x in v["diff_lines"]) or "(no change)"]
                                          for v in doc["experiment"]["variants"]])

    lines += ["", f"### Throughput (output tok/s: server counter{tag}; usage placed in time where marked)", ""]
    rows = []
    for c in doc["cells"]:
        name = md_text(c["variant"]) + (" *" if c["baseline"] else "")
        if c.get("status") != "ok":
            rows.append([name, row_level(c), md_text(c["status"]), "", "", "", ""])
            continue
        t = c["tokps"]
        ci = f"{t['lo']:.1f}..{t['hi']:.1f}" if t.get("lo") is not None else "– (1 start)"
        d = c.get("delta_pct")
        delta = "baseline" if c["baseline"] else "–"
        if d and d.get("value") is not None:
            delta = f"{d['value']:+.1f}%" + (f" ({d['lo']:+.1f}..{d['hi']:+.1f})" if d.get("lo") is not None else "")
        mark = " !" + ",".join(dict.fromkeys(f["code"] for f in t.get("flags") or [])) if t.get("flags") else ""
        ps = c.get("per_stream") or {}
        ps_mark = " !" + ",".join(dict.fromkeys(f["code"] for f in ps.get("flags") or [])) if ps.get("flags") else ""
        rows.append([name, row_level(c), _num(t) + mark, ci, delta, _num(c.get("per_stream")) + ps_mark,
                     f"{_num(c.get('ttft_p50'), 1000, '{:.0f}')} / {_num(c.get('ttft_p99'), 1000, '{:.0f}')}"])
    lines += _table(["variant", row_header(doc["cells"]), "tok/s", "95% CI", "vs baseline (CI)", f"per stream [usage{tag}]",
                     f"TTFT p50/p99 ms [client clock{tag}]"], rows)
    lines += ["", "\\* baseline. tok/s = emitted-token counter delta over the steady-state window / its wall time; "
                  "the interval is over server starts."]

    roof = doc.get("roofline") or {}
    if roof.get("available"):
        lines += ["", f"### Roofline ({md_text(roof.get('gpu_count'))} × {md_text(roof['gpu'])}, "
                      f"{md_text(roof['model'])}; ceilings are model figures, not measurements)", ""]
        lines += _table(["variant", row_header(roof["cells"]), "measured tok/s", "tightest ceiling", "% of it",
                         "simulator overhead ms/step" if sim else "unexplained ms/step",
                         "reading"],
                        [[md_text(r["variant"]), row_level(r), _measured(r["measured"]),
                          _num(r["tightest_ceiling"]), _num(r["pct_of_tightest"], 1, "{:.0f}%"),
                          _num(r["unexplained_ms"]), md_text(r["reading"])] for r in roof["cells"]])
        lines += [f"- {md_text(n)}" for n in roof.get("notes") or []]

    spec = doc.get("spec_decode") or []
    if spec:
        lines += ["", f"### Speculative decoding (server counter{tag})", ""]
        lines += _table(["variant", row_header(spec), "k", "mean acceptance length", "per position"],
                        [[md_text(s["variant"]), row_level(s), md_text(s["k"]),
                          _num(s["mean_acceptance_length"], 1, "{:.3f}"),
                          ", ".join(_num(p, 1, "{:.3f}") for p in s["per_position"])] for s in spec])

    audit = [a for a in doc.get("audit") or [] if a["cause"] not in ("reference",)]
    if audit:
        lines += ["", "### Audit: other ways of counting vs the counter", ""]
        lines += _table(["variant", row_header(audit), "method", "tok/s", "vs counter", "cause"],
                        [[md_text(a["variant"]), row_level(a), md_text(a["method"]),
                          "–" if a["tokps"] is None else f"{a['tokps']:.1f}",
                          "–" if a["error_pct_vs_counter"] is None else f"{a['error_pct_vs_counter']:+.1f}%",
                          md_text(a["cause"])] for a in audit])

    claims = doc.get("claims") or {}
    if claims.get("results"):
        lines += ["", "### Claims", ""]
        lines += _table(["claim", "verdict", "why"], [[md_text(c["text"]), md_text(c["verdict"]), md_text(c["reason"])]
                                                     for c in claims["results"]])
    if doc.get("failures"):
        lines += ["", "### Failures", ""]
        for f in doc["failures"]:
            lines.append(f"- **{md_text(f['variant'])}** {md_text(f['kind'])}: {md_text(f['failure_class'])} — "
                         f"{md_text(f['reason'])}" + (f" (`{md_text(f['line'])}`)" if f.get("line") else ""))
    lines += ["", f"<sub>truthput report schema {md_text(doc['schema'])}; full figures with provenance: "
                  f"`truthput report {md_text(run['id'])} --json PATH`</sub>", ""]
    return "\n".join(lines)


def write_markdown(store: Store, run_id: str, path: str | Path) -> Path:
    from truthput.report.data import build_report_data

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_markdown(build_report_data(store, run_id)), encoding="utf-8")
    return path
