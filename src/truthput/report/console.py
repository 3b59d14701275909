"""The terminal's console and table layout, shared by every terminal view (the run's table and
verdict, `load`'s tables, the audit, `runs`, the progress display)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def make_console(stderr: bool = False, **kwargs: Any) -> Any:
    """A rich Console; when output is not a terminal (CI logs, pipes) lines are not wrapped at 80."""
    from rich.console import Console

    con = Console(stderr=stderr, **kwargs)
    if not con.is_terminal:
        con = Console(stderr=stderr, width=160, **kwargs)
    return con


NARROW = 120
"""Below this many columns a table drops its heavy borders, so its figures keep their width."""


def fit_numbers(table: Any, rows: Sequence[Sequence[Any]], width: int) -> Any:
    """`table` with `rows` added, laid out so that a narrow terminal wraps a figure at its spaces or
    shortens a header label, never cuts a number ("(232.8..521.6)" stays whole): each column gets
    at least its longest word (a short cell such as "2 x 1" counts as one), the rest of the width
    goes to the columns by what they would like more; below NARROW columns the borders are light."""
    from rich import box

    if width < NARROW:
        table.box = box.SIMPLE_HEAD
    from rich.text import Text

    def plain(x: Any) -> str:  # what the cell shows: markup ("[green]equal[/green]") takes no room
        return Text.from_markup(x).plain if isinstance(x, str) else str(x)

    texts = [[plain(row[i]) for row in rows] + [plain(c.header)] for i, c in enumerate(table.columns)]
    lows = [max([len(w) for t in col[:-1] for w in ([t] if len(t) <= 8 or c.no_wrap else t.split())] or [1])
            for col, c in zip(texts, table.columns)]
    highs = [max(len(line) for t in col for line in t.splitlines() or [""]) for col in texts]
    highs = [max(lo, hi) for lo, hi in zip(lows, highs)]
    pad = sum(table._get_padding_width(i) for i in range(len(table.columns))) + table._extra_width
    room = width - pad
    # header words whole where there is room for them, then lines whole
    mids = [min(hi, max(lo, max((len(w) for w in col[-1].split()), default=1)))
            for lo, hi, col in zip(lows, highs, texts)]
    if sum(highs) > room >= sum(lows):
        base, top = (mids, highs) if sum(mids) <= room else (lows, mids)
        spare, want = room - sum(base), [t - b for b, t in zip(base, top)]
        total = sum(want) or 1
        widths = [b + spare * w // total for b, w in zip(base, want)]
        for column, w in zip(table.columns, widths):
            column.width = w
    elif room < sum(lows):
        return _stacked(table, rows, texts)  # the figures whole: a block per row, a line per column
    for row in rows:
        table.add_row(*row)
    return table


def _stacked(table: Any, rows: Sequence[Sequence[Any]], texts: Sequence[Sequence[str]]) -> Any:
    """`table` too wide for the terminal even with each column at its longest word: each row as a
    block of `header: value` lines (a terminal would otherwise cut figures and flags at its edge)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    out = Table(title=table.title, box=box.SIMPLE, show_header=False, pad_edge=False)
    # the values keep their longest word whole; the headers wrap into what is left
    longest = max((len(w) for col in texts for t in col[:-1] for w in t.split()), default=1)
    out.add_column(style="dim")
    out.add_column(min_width=longest)
    headers = [" ".join(col[-1].split()) for col in texts]
    for i, row in enumerate(rows):
        for header, cell in zip(headers, row):
            out.add_row(Text(header), cell)  # a header's "[server counter]" is text, not markup
        if i < len(rows) - 1:
            out.add_section()
    return out
