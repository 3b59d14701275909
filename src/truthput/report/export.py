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
from typing import Any, Iterable, Union

from pydantic import BaseModel

from truthput.report.document import Figure, ReportDocument

FIGURE_EXTRAS = ("lo", "hi", "read_via")


def write_json(doc: ReportDocument, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc.to_dict(), indent=1, allow_nan=False, ensure_ascii=False), encoding="utf-8")
    return path


def _plain(val: Any) -> Any:
    if isinstance(val, BaseModel):
        return val.model_dump(mode="json", exclude_unset=True)
    if isinstance(val, list):
        return [_plain(v) for v in val]
    if isinstance(val, dict):
        return {k: _plain(v) for k, v in val.items()}
    return val


Row = Union[BaseModel, dict[str, Any]]


def flatten(row: Row) -> dict[str, Any]:
    """One CSV row: figures become value/unit/source columns (and lo/hi/read_via/flags where
    present); lists and mappings become JSON."""
    items = ([(k, getattr(row, k)) for k in type(row).model_fields if k in row.model_fields_set]
             if isinstance(row, BaseModel) else list(row.items()))
    out: dict[str, Any] = {}
    for key, val in items:
        if isinstance(val, Figure):
            out[key] = val.value
            out[f"{key}_unit"] = val.unit
            out[f"{key}_source"] = val.source
            for extra in FIGURE_EXTRAS:
                if extra in val.model_fields_set:
                    out[f"{key}_{extra}"] = getattr(val, extra)
            out[f"{key}_flags"] = "; ".join(f"{f.code}: {f.reason}" for f in val.flags or [])
        elif isinstance(val, (dict, list, BaseModel)):
            out[key] = json.dumps(_plain(val), ensure_ascii=False)
        else:
            out[key] = val
    return out


def _write_csv(path: Path, rows: Iterable[Row]) -> Path:
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


def _without(row: BaseModel, *names: str) -> dict[str, Any]:
    return {k: getattr(row, k) for k in type(row).model_fields if k in row.model_fields_set and k not in names}


def tables(doc: ReportDocument) -> dict[str, list[Row]]:
    """Table name -> rows, as written to CSV."""
    roof_rows: list[Row] = []
    for r in doc.roofline.cells:
        row = _without(r, "roofline", "placement", "bounds_ms")
        for name, b in r.bounds_ms.items():
            row[f"floor_{name}_ms"] = b
        roof_rows.append(row)
    spec_rows: list[Row] = []
    for s in doc.spec_decode:
        row = _without(s, "per_position")
        for p in s.per_position:
            row[f"accept_pos{p.position}"] = p
        spec_rows.append(row)
    req_rows: list[Row] = [{"variant": c.variant, "concurrency": c.concurrency, "rate": c.rate, "level": c.level,
                            "kind": kind, "value": value, "source": c.source}
                           for c in doc.latency for kind in ("ttft_ms", "itl_ms") for value in getattr(c, kind)]
    variants: list[Row] = [{"name": v.name, "baseline": v.baseline, "diff": " ; ".join(v.diff_lines),
                            "argv": shlex.join(v.argv), "speculative": v.speculative}
                           for v in doc.experiment.variants]
    return {
        "cells": list(doc.cells),
        "variants": variants,
        "audit": list(doc.audit),
        "roofline": roof_rows,
        "spec_decode": spec_rows,
        "goodput": list(doc.goodput or []),
        "latency_requests": req_rows,
        "failures": list(doc.failures),
        "telemetry": list(doc.telemetry.rows),
        "trials": list(doc.trials),
        "claims": [r.to_dict() for r in doc.claims.results],
        "warnings": [{"warning": w} for w in doc.warnings],
        "flags": [{"flag": f} for f in doc.flags],
    }


def write_csv(doc: ReportDocument, folder: str | Path) -> list[Path]:
    """One CSV per table in `folder` (created); returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [_write_csv(folder / f"{name}.csv", rows) for name, rows in tables(doc).items()]


