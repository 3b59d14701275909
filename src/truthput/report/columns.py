"""The figure columns of the cell table, one list for every view that lays the table out (the
terminal, the markdown, the HTML; JSON and CSV hold every field of `CellRow` as it is): a new figure
of a cell is its field in `analyze.tables.CellRow`, computed there, and one line here.

A column shows one or more of a row's figures ("p50 / p99"), scaled and formatted alike, with the
flags on them; a row without a figure (a failed cell) shows it missing, so no view pads a failed
row by position.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from truthput.analyze.rows import Figure, FlagRef
from truthput.analyze.tables import CellRow


@dataclass(frozen=True)
class FigureColumn:
    header: str
    source: str
    """The provenance the header names ("usage", "client clock")."""
    keys: tuple[str, ...]
    """The `CellRow` figures it shows, joined by " / "."""
    scale: float = 1.0
    fmt: str = "{:.1f}"
    terminal: str = "column"
    """How the terminal, whose width is short, shows it: "column" in its table, "line" under it
    (where the server gave it), "none" (the reports have it)."""
    brief: str | None = None
    """The terminal's header where its column shows the first figure alone."""
    second: tuple[float, str] | None = None
    """(scale, format) of the figures after the first, where they differ from its."""

    def for_terminal(self) -> FigureColumn:
        """The column as the terminal's table shows it (its first figure alone, where it is brief)."""
        return self if self.brief is None else replace(self, header=self.brief, keys=self.keys[:1])

    def figures(self, row: CellRow) -> list[Figure | None]:
        return [getattr(row, k) for k in self.keys]

    def scale_of(self, i: int) -> float:
        return self.second[0] if i and self.second else self.scale

    def fmt_of(self, i: int) -> str:
        return self.second[1] if i and self.second else self.fmt

    def text(self, row: CellRow, missing: str = "-") -> str:
        """The figures as text: "35.2 / 80.1", `missing` for each one the row lacks."""
        return " / ".join(missing if f is None or f.value is None else self.fmt_of(i).format(f.value * self.scale_of(i))
                          for i, f in enumerate(self.figures(row)))

    def shown(self, row: CellRow) -> bool:
        """Whether the row has any of the column's figures."""
        return any(f is not None and f.value is not None for f in self.figures(row))

    def flags(self, row: CellRow) -> list[FlagRef]:
        return [flag for f in self.figures(row) if f is not None for flag in f.flags or []]

    def percent_fmt(self, i: int = 0) -> str:
        """The i-th figure's format as jinja's `format` filter takes it ("%.1f")."""
        return self.fmt_of(i).replace("{:", "%").replace("}", "")


CELL_FIGURES = (
    FigureColumn("tok/s per stream", "usage", ("per_stream",)),
    FigureColumn("TTFT p50 / p99 ms", "client clock", ("ttft_p50", "ttft_p99"), 1000.0, brief="TTFT p50 ms"),
    FigureColumn("ITL p50 / p99 ms", "client clock", ("itl_p50", "itl_p99"), 1000.0, terminal="none"),
    FigureColumn("tokens per request", "usage", ("completion_tokens",)),
    FigureColumn("prefix-cache hits %", "server counter", ("prefix_cache_hit_rate",), 100.0, "{:.0f}", terminal="line"),
    FigureColumn("replay late p99 ms", "client clock", ("replay_late_p99",), 1000.0, terminal="line"),
    FigureColumn("drafts accepted % / tokens a step", "server counter", ("acceptance_rate", "mean_acceptance_length"),
                 100.0, "{:.0f}", terminal="line", second=(1.0, "{:.2f}")),
)


def shown_columns(rows: list[CellRow]) -> list[FigureColumn]:
    """The figure columns some row has a figure or a flag for (a run without speculation or a replay
    gets no empty column for them; a flag is never hidden with its column)."""
    return [col for col in CELL_FIGURES if any(col.shown(r) or col.flags(r) for r in rows)]
