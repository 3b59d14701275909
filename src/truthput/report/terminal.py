"""One clear terminal summary of a run (like hyperfine's): a table per variant x concurrency, the
verdict, failures, and warnings. Every column names its source; a simulated run says so on every figure.
"""

from __future__ import annotations

import json
from statistics import mean, median
from typing import Any

from truthput.measure.figures import fig, headline_tokps
from truthput.store.db import Store




def cell_rows(store: Store, run_id: str) -> list[dict]:
    """Per variant x concurrency: the figures the table and the reports show."""
    from truthput.analyze.stats import cell_estimate, noise_warnings, ratio_estimate

    run_id = store.resolve_run(run_id)
    variants = [v["name"] for v in store.variants(run_id)]
    baseline = next((v["name"] for v in store.variants(run_id) if v["is_baseline"]), None)
    trials = store.trial_results(run_id)
    failed = {s["variant"]: f"{s['failure_class']}: {s['failure_reason']}" for s in store.starts(run_id)
              if s["status"] == "failed" and s["failure_class"]}
    levels = sorted({t["concurrency"] for t in trials})
    per: dict[tuple[str, int], dict[int, list[float]]] = {}
    extra: dict[tuple[str, int], dict[str, list[float]]] = {}
    for t in trials:
        key = (t["variant"], t["concurrency"])
        r = t["results"]
        val, source = headline_tokps(r)
        e = extra.setdefault(key, {"per_stream": [], "ttft_p50": [], "itl_p50": [], "usage": [], "sources": set()})
        if t["status"] == "ok" and val is not None:
            per.setdefault(key, {}).setdefault(t["start_index"], []).append(float(val))
            e["sources"].add(source)
        for name, path in (("per_stream", ("per_stream", "decode_tps_median")), ("ttft_p50", ("latency", "ttft", "p50")),
                           ("itl_p50", ("latency", "itl", "p50")), ("usage", ("throughput", "usage_window"))):
            v = fig(r, *path)
            if isinstance(v, (int, float)):
                e[name].append(float(v))
    n_cmp = max(1, len([v for v in variants if v != baseline]))
    rows = []
    for v in variants:
        for c in levels or [None]:
            key = (v, c)
            starts = per.get(key)
            row: dict[str, Any] = {"variant": v, "concurrency": c, "baseline": v == baseline}
            if not starts:
                row["status"] = f"failed: {failed[v]}" if v in failed else "no data"
                rows.append(row)
                continue
            groups = [starts[s] for s in sorted(starts)]
            est = cell_estimate(groups)
            row.update(status="ok", tokps=est.mean, lo=est.lo, hi=est.hi, n_starts=est.n_starts,
                       n_trials=est.n_trials, cv=est.cv_within, warning=est.warning,
                       noise=[w for w in ([est.warning] if est.warning else []) + noise_warnings(groups)])
            e = extra.get(key, {})
            row["sources"] = sorted(e.get("sources", ()))
            row["per_stream"] = median(e["per_stream"]) if e.get("per_stream") else None
            row["ttft_p50"] = median(e["ttft_p50"]) if e.get("ttft_p50") else None
            row["itl_p50"] = median(e["itl_p50"]) if e.get("itl_p50") else None
            if baseline and v != baseline and per.get((baseline, c)):
                base_groups = [per[(baseline, c)][s] for s in sorted(per[(baseline, c)])]
                try:
                    r = ratio_estimate(groups, base_groups, n_comparisons=n_cmp)
                    row.update(delta_pct=r.pct, delta_lo=r.pct_lo, delta_hi=r.pct_hi, significant=r.significant)
                except Exception as exc:  # too little data for an interval
                    row.update(delta_pct=(est.mean / mean(sum(base_groups, [])) - 1) * 100, delta_note=str(exc))
            rows.append(row)
    return rows


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None or x != x else fmt.format(x)


def make_console(stderr: bool = False, **kwargs):
    """A rich Console; when output is not a terminal (CI logs, pipes) lines are not wrapped at 80."""
    from rich.console import Console

    con = Console(stderr=stderr, **kwargs)
    if not con.is_terminal:
        con = Console(stderr=stderr, width=160, **kwargs)
    return con


def print_run(store: Store, run_id: str, console=None) -> None:
    from rich.table import Table

    con = console or make_console()
    run_id = store.resolve_run(run_id)
    run = store.run(run_id)
    sim = bool(run["simulated"])
    tag = ", simulated" if sim else ""
    title = f"run {run_id} ({run['status']})"
    if sim:
        con.print("[bold yellow]SIMULATED[/bold yellow]: every figure below comes from the embedded simulator "
                  "(a physics model), not from a measurement of real hardware.")
    t = Table(title=title)
    t.add_column("variant")
    t.add_column("conc.", justify="right")
    t.add_column(f"output tok/s (95% CI)\n\\[server counter{tag}]", justify="right")
    t.add_column(f"tok/s per stream\n\\[usage{tag}]", justify="right")
    t.add_column(f"TTFT p50 ms\n\\[client clock{tag}]", justify="right")
    t.add_column("vs baseline (95% CI)\n\\[ratio of counters]", justify="right")
    t.add_column("starts x trials")
    for row in cell_rows(store, run_id):
        name = row["variant"] + (" *" if row["baseline"] else "")
        if row.get("status") != "ok":
            t.add_row(name, _f(row["concurrency"], "{}"), f"[red]{row['status']}[/red]", "-", "-", "-", "-")
            continue
        tokps = _f(row["tokps"])
        if row.get("sources") and row["sources"] != ["server_counter"]:
            tokps += " [yellow]\\[usage: no counter][/yellow]"
        if row.get("lo") is not None and row.get("lo") == row.get("lo"):
            tokps += f" ({_f(row['lo'])}..{_f(row['hi'])})"
        delta = "baseline" if row["baseline"] else "-"
        if "delta_pct" in row:
            delta = f"{row['delta_pct']:+.1f}%"
            if row.get("delta_lo") is not None and row.get("delta_lo") == row.get("delta_lo"):
                delta += f" ({row['delta_lo']:+.1f}..{row['delta_hi']:+.1f})"
        ttft = row.get("ttft_p50")
        per_start = row["n_trials"] / max(row["n_starts"], 1)
        t.add_row(name, str(row["concurrency"]), tokps, _f(row.get("per_stream")),
                  _f(ttft * 1000 if ttft is not None else None), delta, f"{row['n_starts']} x {per_start:g}")
    con.print(t)
    noisy = [(r["variant"], r["concurrency"], w) for r in cell_rows(store, run_id) for w in dict.fromkeys(r.get("noise") or [])]
    for v, c, w in noisy[:8]:
        con.print(f"[yellow]noise[/yellow] {v} c={c}: {w}")
    con.print("* baseline. Output tok/s = delta of the server's emitted-token counter over the steady-state window "
              "(all N streams in flight) / the window's wall time.")
    if run["summary_json"]:
        summary = json.loads(run["summary_json"])
        lines = summary.get("verdict_lines") or []
        if lines:
            con.print("[bold]Verdict[/bold]")
            for line in lines:
                con.print(f"  {line}")
        for name, why in (summary.get("failed") or {}).items():
            con.print(f"[red]failed[/red] {name}: {why}")
        stopping = summary.get("stopping")
        if stopping:
            used = stopping.get("starts_used")
            fixed = stopping.get("fixed_design_starts")
            line = f"stopping rule ({stopping.get('method')} alpha spending): {used} server starts per variant"
            if fixed:
                line += f"; a fixed design would have needed {fixed} for the same precision"
            con.print(line)
    for w in trial_warnings(store, run_id):
        con.print(f"[yellow]warning[/yellow]: {w}")


def trial_warnings(store: Store, run_id: str) -> list[str]:
    """Trials whose figures may be distorted: the batch never settled, or the client was the bottleneck."""
    out = []
    for t in store.trial_results(run_id):
        client = t["results"].get("client") or {}
        where = f"{t['variant']} c={t['concurrency']} start {t['start_index'] + 1} trial {t['trial_index'] + 1}"
        if client.get("never_settled"):
            out.append(f"{where}: the {t['concurrency']} streams never all generated at once (no steady state)")
        check = client.get("selfcheck") or {}
        if check.get("client_bound"):
            out.append(f"{where}: client-bound ({check.get('reason')}): the load generator may have distorted it")
        if t["status"] != "ok" and t.get("error"):
            out.append(f"{where}: {t['error']}")
    return out


def print_audit_matrix(store: Store, run_id: str, console=None) -> None:
    """The audit in one table: each counting method's error vs the server counter, per cell.

    Rows are methods, columns are variant@concurrency; the cause class stands beside each method.
    `truthput audit RUN_ID` prints the long form with tok/s and notes.
    """
    from rich.table import Table

    from truthput.analyze.audit import audit_rows, integrity_rows

    con = console or make_console()
    run_id = store.resolve_run(run_id)
    sim = bool(store.run(run_id)["simulated"])
    items = [{"variant": t["variant"], "concurrency": t["concurrency"], "results": t["results"]}
             for t in store.trial_results(run_id) if t["status"] == "ok" and t["results"].get("methods")]
    if not items:
        return
    rows = audit_rows(items, simulated=sim)
    cells = sorted({(r["variant"], r["concurrency"]) for r in rows}, key=lambda k: (k[1], k[0]))
    methods: list[str] = []
    for r in rows:
        if r["method"] not in methods:
            methods.append(r["method"])
    by = {(r["method"], r["variant"], r["concurrency"]): r for r in rows}
    t = Table(title="Audit: every counting method vs the server counter (error %)" + (", simulated" if sim else ""))
    t.add_column("method")
    t.add_column("cause")
    for v, c in cells:
        t.add_column(f"{v}\nc={c}", justify="right")
    for m in methods:
        causes = [by[(m, v, c)]["cause"] for v, c in cells if (m, v, c) in by]
        cause = max(set(causes), key=causes.count) if causes else "-"
        vals = []
        for v, c in cells:
            r = by.get((m, v, c))
            e = r["error_pct_vs_counter"] if r else None
            vals.append("-" if e is None else ("ref" if r["cause"] == "reference" else f"{e:+.1f}%"))
        t.add_row(m, cause, *vals)
    con.print(t)
    integ = integrity_rows(items)
    held = sum(r["identity_held"] for r in integ)
    total = sum(r["trials"] for r in integ)
    failed = [m for r in integ for m in r["identity_failed"]]
    spec_failed = [m for r in integ for m in r["spec_checks_failed"]]
    con.print(f"Whole-trial identity (counter delta == sum of usage.completion_tokens): held in {held} of {total} trials"
              + (f"; [red]failed[/red]: {failed[0]}" if failed else ""))
    if spec_failed:
        con.print(f"[red]spec-decode checks failed[/red]: {spec_failed[0]}")
    warnings = sorted({w for r in integ for w in r["warnings"]})
    for w in warnings[:5]:
        con.print(f"[yellow]warning[/yellow]: {w}")
