"""Machine-readable exports: the JSON report document and one CSV per table, with loaders.

The JSON export *is* the report document (schema "truthput-report/1", docs/export-schema.md), so
it holds every figure with its provenance. CSV files flatten figure objects into columns:
`<name>` (value), `<name>_unit`, `<name>_source` and, where present, `<name>_lo` / `<name>_hi`.
"""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path
from typing import Any, Iterable

from truthput.errors import StoreError
from truthput.report.data import SCHEMA

FIGURE_EXTRAS = ("lo", "hi", "read_via", "flags")


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, allow_nan=False, ensure_ascii=False), encoding="utf-8")
    return path


def load_report(path: str | Path) -> dict[str, Any]:
    """A JSON export read back; a clear error when it is not one (or of a schema this version cannot read)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{path}: no such report file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path}: not a JSON report ({exc})") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith("truthput-report/"):
        raise StoreError(f"{path}: not a truthput report (no 'schema': '{SCHEMA}')")
    if schema != SCHEMA:
        raise StoreError(f"{path}: report schema {schema!r}; this truthput reads {SCHEMA!r}")
    return doc


def _is_figure(x: Any) -> bool:
    return isinstance(x, dict) and "value" in x and "unit" in x


def flatten(row: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: figure objects become value/unit/source columns; lists and dicts become JSON."""
    out: dict[str, Any] = {}
    for key, val in row.items():
        if _is_figure(val):
            out[key] = val["value"]
            out[f"{key}_unit"] = val.get("unit")
            out[f"{key}_source"] = val.get("source")
            for extra in FIGURE_EXTRAS:
                if extra == "flags":
                    out[f"{key}_flags"] = "; ".join(f"{f.get('code')}: {f.get('reason')}" for f in val.get("flags") or [])
                elif extra in val:
                    out[f"{key}_{extra}"] = val[extra]
        elif isinstance(val, (dict, list)):
            out[key] = json.dumps(val, ensure_ascii=False)
        else:
            out[key] = val
    return out


def _write_csv(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    flat = [flatten(r) for r in rows]
    cols: list[str] = []
    for r in flat:
        for k in r:
            if k not in cols:
                cols.append(k)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=cols or ["empty"])
        w.writeheader()
        for r in flat:
            w.writerow(r)
    return path


def tables(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Table name -> rows, as written to CSV."""
    roof_rows = []
    for r in (doc.get("roofline") or {}).get("cells") or []:
        row = {k: v for k, v in r.items() if k not in ("roofline", "placement", "bounds_ms")}
        for name, b in r["bounds_ms"].items():
            row[f"floor_{name}_ms"] = b
        roof_rows.append(row)
    spec_rows = []
    for s in doc.get("spec_decode") or []:
        row = {k: v for k, v in s.items() if k != "per_position"}
        for p in s["per_position"]:
            row[f"accept_pos{p['position']}"] = p
        spec_rows.append(row)
    req_rows = []
    for c in doc.get("latency") or []:
        for kind in ("ttft_ms", "itl_ms"):
            for value in c[kind]:
                req_rows.append({"variant": c["variant"], "concurrency": c["concurrency"], "rate": c.get("rate"),
                                 "level": c.get("level"), "kind": kind,
                                 "value": value, "source": c["source"]})
    variants = [{"name": v["name"], "baseline": v["baseline"], "diff": " ; ".join(v["diff_lines"]),
                 "argv": shlex.join(v["argv"]), "speculative": v["speculative"]}
                for v in doc["experiment"]["variants"]]
    return {
        "cells": doc.get("cells") or [],
        "variants": variants,
        "audit": doc.get("audit") or [],
        "roofline": roof_rows,
        "spec_decode": spec_rows,
        "goodput": doc.get("goodput") or [],
        "latency_requests": req_rows,
        "failures": doc.get("failures") or [],
        "telemetry": (doc.get("telemetry") or {}).get("rows") or [],
        "trials": doc.get("trials") or [],
        "claims": (doc.get("claims") or {}).get("results") or [],
        "warnings": [{"warning": w} for w in doc.get("warnings") or []],
        "flags": [{"flag": f} for f in doc.get("flags") or []],
    }


def write_csv(doc: dict[str, Any], folder: str | Path) -> list[Path]:
    """One CSV per table in `folder` (created); returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [_write_csv(folder / f"{name}.csv", rows) for name, rows in tables(doc).items()]


def read_csv(path: str | Path) -> list[dict[str, str]]:
    """A CSV export read back as rows of strings (numbers parse with float())."""
    with Path(path).open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))
