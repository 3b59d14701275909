"""The audit: every counting method's tok/s beside the counter, per variant x concurrency, with why.

Input is what the store keeps per trial (`trials.results_json`, i.e. measure_trial's dict). Trials of
the same variant and concurrency are pooled: a method's figure is the mean over trials, its error
the mean of per-trial errors vs that trial's counter, its cause the most frequent classification.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import mean
from typing import Any, Iterable

CAUSE_ORDER = ("reference", "agrees", "unit", "window", "definition", "missing data")


def _unpack(item: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
    """(variant, concurrency, results) from a store row (with 'results') or a bare measure_trial dict."""
    results = item.get("results", item)
    if isinstance(results, str):
        import json

        results = json.loads(results)
    variant = str(item.get("variant") or results.get("variant") or "?")
    conc = int(item.get("concurrency") or results.get("concurrency") or 0)
    return variant, conc, results


def group_trials(items: Iterable[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Trials' results grouped by (variant, concurrency), failed trials left out."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for item in items:
        if item.get("status", "ok") != "ok":
            continue
        variant, conc, res = _unpack(item)
        if res.get("methods"):
            groups[(variant, conc)].append(res)
    return dict(groups)


def audit_rows(results: list[dict[str, Any]], simulated: bool = False) -> list[dict[str, Any]]:
    """One row per variant x concurrency x method: tokps, error_pct_vs_counter, cause, n_trials."""
    rows: list[dict[str, Any]] = []
    for (variant, conc), trials in sorted(group_trials(results).items()):
        order: list[str] = []
        per_method: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for res in trials:
            for r in res["methods"]:
                if r["method"] not in per_method:
                    order.append(r["method"])
                per_method[r["method"]].append(r)
        for method in order:
            rs = per_method[method]
            vals = [r["tokps"] for r in rs if r.get("tokps") is not None]
            errs = [r["error_pct_vs_counter"] for r in rs if r.get("error_pct_vs_counter") is not None]
            causes = Counter(r["cause"] for r in rs)
            cause = causes.most_common(1)[0][0]
            notes = [r.get("note", "") for r in rs if r.get("note")]
            rows.append({
                "variant": variant,
                "concurrency": conc,
                "method": method,
                "tokps": mean(vals) if vals else None,
                "error_pct_vs_counter": mean(errs) if errs else None,
                "cause": cause,
                "causes": dict(causes),
                "source": "simulator" if simulated else rs[0].get("source"),
                "measured_source": rs[0].get("source"),
                "n_trials": len(rs),
                "simulated": simulated,
                "note": notes[0] if notes else "",
            })
    return rows


def integrity_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant x concurrency: how many trials' counter identity held, and every warning raised."""
    rows = []
    for (variant, conc), trials in sorted(group_trials(results).items()):
        integ = [t.get("integrity", {}) for t in trials]
        checks = [c for t in trials for iv in (t.get("spec_decode") or {}).values() if isinstance(iv, dict)
                  for c in (iv.get("checks") or {}).values()]
        rows.append({
            "variant": variant,
            "concurrency": conc,
            "trials": len(trials),
            "identity_held": sum(1 for i in integ if i.get("holds") is True),
            "identity_failed": [i.get("message", "") for i in integ if i.get("holds") is False],
            "identity_unchecked": sum(1 for i in integ if i.get("holds") is None),
            "spec_checks_failed": [c.get("message", "") for c in checks if c.get("ok") is False],
            "warnings": sorted({w for t in trials for w in t.get("warnings", [])}),
        })
    return rows


def render_audit(rows: list[dict[str, Any]], title: str, simulated: bool = False):
    """A rich Table of the audit rows (simulated figures say so on every figure)."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("variant", "conc", "method", "tok/s", "vs counter", "cause", "trials"):
        table.add_column(col, justify="right" if col in ("conc", "tok/s", "vs counter", "trials") else "left")
    tag = " (simulated)" if simulated else ""
    prev: tuple[str, int] | None = None
    for r in rows:
        key = (r["variant"], r["concurrency"])
        if prev is not None and key != prev:
            table.add_section()
        prev = key
        tok = "-" if r["tokps"] is None else f"{r['tokps']:.1f}{tag}"
        err = "-" if r["error_pct_vs_counter"] is None else f"{r['error_pct_vs_counter']:+.1f}%{tag}"
        style = {"reference": "bold", "agrees": "green", "missing data": "dim"}.get(r["cause"], "yellow")
        table.add_row(r["variant"], str(r["concurrency"]), r["method"], tok, err,
                      f"[{style}]{r['cause']}[/{style}]", str(r["n_trials"]))
    return table
