"""Load levels: how hard one trial pushes the server.

A closed loop's level is its number of streams (an `int`); an open loop's is the request rate it
offers (a `Rate`, requests per second). A level is a plain number that sorts as one, so cells,
verdicts and views key on it directly; a `Rate` reads as "2 req/s" instead of "c=2" and never
equals a number of streams, so two runs of different kinds share no cell.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, Union


class Rate(float):
    """An open-loop level: requests per second offered, whatever the server does with them."""

    def __repr__(self) -> str:
        return f"Rate({float(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rate) and float(self) == float(other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(("req/s", float(self)))

    def __str__(self) -> str:
        return f"{float(self):g} req/s"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """Stored as `{"rate": x}`, so a stored level reads back a Rate, never a number of streams."""
        from pydantic_core import core_schema

        def load(doc: Any) -> Rate:
            if isinstance(doc, Rate):
                return doc
            if isinstance(doc, Mapping) and set(doc) == {"rate"}:
                return Rate(float(doc["rate"]))
            raise ValueError(f"not a rate: {doc!r}")

        return core_schema.no_info_plain_validator_function(
            load, serialization=core_schema.plain_serializer_function_ser_schema(lambda r: {"rate": float(r)}))


Level = Union[int, Rate]
"""A closed loop's streams (int) or an open loop's offered rate (Rate)."""


def is_rate(level: object) -> bool:
    return isinstance(level, Rate)


def level_label(level: Level | None) -> str:
    """How a level reads in every view: "c=4" (streams) or "2 req/s" (offered rate)."""
    if level is None:
        return ""
    return str(level) if isinstance(level, Rate) else f"c={level}"


def level_header(levels: Iterable[Level]) -> str:
    """A table's level column heading: "conc." (streams) or "req/s" (offered rate)."""
    return "req/s" if any(isinstance(x, Rate) for x in levels) else "conc."


def level_cell(level: Level) -> str:
    """A level in a table column headed by `level_header`: "4" streams or "2.5" req/s."""
    return f"{float(level):g}" if isinstance(level, Rate) else str(int(level))


def level_value(level: Level) -> float | int:
    """The level as a JSON number (a Rate as a plain float)."""
    return float(level) if isinstance(level, Rate) else int(level)


def level_json(level: Level) -> dict[str, float | int | str | None]:
    """What exports and reports keep of a level: both keys, one of them null, and the label."""
    if isinstance(level, Rate):
        return {"concurrency": None, "rate": float(level), "level": level_label(level)}
    return {"concurrency": int(level), "rate": None, "level": level_label(level)}


def level_from_json(doc: Any) -> Level:
    """The level an export row or a stored document names (`level_json`'s inverse); `doc` is a
    mapping (a JSON row) or a typed document row with `rate` and `concurrency` attributes."""
    if isinstance(doc, Mapping):
        rate, conc = doc.get("rate"), doc.get("concurrency")
    else:
        rate, conc = getattr(doc, "rate", None), getattr(doc, "concurrency", None)
    if rate is not None:
        return Rate(float(rate))
    return int(conc or 0)


def row_level(row: Any) -> str:
    """A document row's level in a table column headed by `row_header`."""
    return level_cell(level_from_json(row))


def row_header(rows: Iterable[Any]) -> str:
    """The level column heading for document rows ("conc." or "req/s")."""
    return level_header(level_from_json(r) for r in rows)


class _Leveled(Protocol):
    @property
    def concurrency(self) -> int: ...


def level_of(trial: _Leveled) -> Level:
    """A stored trial's level: its offered rate where it has one (open loop), else its streams."""
    rate = getattr(trial, "rate", None)
    if rate is not None:
        return Rate(float(rate))
    load = getattr(getattr(trial, "results", None), "load", None)
    if load is not None and getattr(load, "mode", "closed") == "open" and getattr(load, "level", 0):
        return Rate(float(load.level))  # stores written before the rate column
    return int(trial.concurrency)
