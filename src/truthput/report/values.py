"""The per-start values behind a verdict, as a file a user can read and recompute from.

JSON (`truthput report RUN --values FILE.json`): the baseline, the design (`[measure]`) and one
entry per server start. CSV (`--values FILE.csv`): one row per trial value, columns metric,
variant, concurrency, rate, round, trial, value; the baseline and design are then given to
`truthput decide` (`--baseline`, `--experiment`).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from truthput.analyze.rows import DocModel, LevelRow
from truthput.analyze.values import StartValues
from truthput.errors import InputError
from truthput.experiment.file import MeasureSection
from truthput.experiment.levels import level_from_json, level_json

CSV_COLUMNS = ["metric", "variant", "concurrency", "rate", "round", "trial", "value"]


class StartEntry(LevelRow):
    """One server start's values of one verdict metric at one level (a trial's figure each)."""

    metric: str
    variant: str
    round: int
    """The round of starts it belongs to: round k runs every variant once."""
    values: list[float]


class ValuesFile(DocModel):
    """The values file (JSON): what `truthput decide` recomputes the verdict from."""

    schema_: str = Field("truthput-values/1", alias="schema")
    baseline: str | None = None
    simulated: bool = False
    measure: MeasureSection = Field(default_factory=MeasureSection)
    """The run's design (`[measure]`): looks, margin, confidence."""
    starts: list[StartEntry]

    model_config = {"populate_by_name": True}


def write_values(path: Path, values: Sequence[StartValues], baseline: str, measure: MeasureSection,
                 simulated: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(CSV_COLUMNS)
            for v in values:
                lv = level_json(v.level)
                for i, x in enumerate(v.values):
                    w.writerow([v.metric, v.variant, lv["concurrency"] if lv["concurrency"] is not None else "",
                                lv["rate"] if lv["rate"] is not None else "", v.round, i, repr(x)])
        return
    doc = ValuesFile(baseline=baseline, simulated=simulated, measure=measure,
                     starts=[StartEntry(metric=v.metric, variant=v.variant, **level_json(v.level),
                                        round=v.round, values=list(v.values)) for v in values])
    path.write_text(doc.model_dump_json(by_alias=True, indent=1) + "\n", encoding="utf-8")


def read_values(path: Path) -> tuple[list[StartValues], str | None, MeasureSection | None, bool]:
    """(values, baseline or None, design or None, simulated) from a file `write_values` wrote (or a
    user did)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    if path.suffix.lower() == ".csv":
        return check_starts(path, _read_csv(path, text)), None, None, False
    try:
        doc = ValuesFile.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise InputError(f"{path}: not a truthput values file ({where}: {first['msg']})") from None
    starts = [StartValues(s.metric, s.variant, s.key, s.round, tuple(s.values)) for s in doc.starts]
    return check_starts(path, starts), doc.baseline, doc.measure, doc.simulated


def check_starts(path: Path, starts: list[StartValues], look: int | None = None) -> list[StartValues]:
    """Refuse what no run produces: the same start twice (it would count as one more start), a
    cell whose rounds skip one (round k exists only once rounds 0..k-1 ran), or a `look` beyond
    the starts the values hold."""
    from truthput.experiment.levels import level_label

    seen: dict[tuple[str, str, Any], list[int]] = {}
    for s in starts:
        rounds = seen.setdefault((s.metric, s.variant, s.level), [])
        if s.round in rounds:
            raise InputError(f"{path}: {s.variant} {level_label(s.level)} ({s.metric}) has round {s.round} twice; "
                             "each server start is one entry")
        rounds.append(s.round)
    for (metric, variant, level), rounds in seen.items():
        missing = sorted(set(range(max(rounds) + 1)) - set(rounds))
        if missing:
            raise InputError(f"{path}: {variant} {level_label(level)} ({metric}) has rounds "
                             f"{', '.join(map(str, sorted(rounds)))} but not {', '.join(map(str, missing))}: "
                             "a run's rounds are 0, 1, 2, ... with none missing")
    most = max((len(r) for r in seen.values()), default=0)
    if look is not None and not 1 <= look <= most:
        raise InputError(f"{path}: --look {look}: the values hold {most} start(s) per variant at most "
                         f"(give 1..{most})")
    return starts


def _read_csv(path: Path, text: str) -> list[StartValues]:
    rows = list(csv.DictReader(text.splitlines()))
    if not rows or set(CSV_COLUMNS) - set(rows[0]):
        raise InputError(f"{path}: expected CSV columns {', '.join(CSV_COLUMNS)}")
    by: dict[tuple[str, str, Any, int], list[tuple[int, float]]] = {}
    for n, r in enumerate(rows, start=2):
        try:
            level = level_from_json({"concurrency": int(r["concurrency"]) if r["concurrency"] else None,
                                     "rate": float(r["rate"]) if r["rate"] else None})
            key = (r["metric"], r["variant"], level, int(r["round"]))
            trial = int(r["trial"] or 0)
            if any(t == trial for t, _x in by.get(key, [])):
                raise InputError(f"{path}, line {n}: {r['variant']} round {r['round']} trial {trial} "
                                 f"({r['metric']}) appears twice")
            by.setdefault(key, []).append((trial, float(r["value"])))
        except (ValueError, TypeError) as exc:
            raise InputError(f"{path}, line {n}: {exc}") from None
    return [StartValues(m, v, lv, rd, tuple(x for _t, x in sorted(vals))) for (m, v, lv, rd), vals in by.items()]
