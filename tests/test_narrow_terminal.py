"""The terminal's run table at 80 and 100 columns cuts no figure: every number and interval of the
wide table (the recorded quickstart run) stands whole in the narrow one; labels may wrap or
shorten. A negative control: rich's own layout, without truthput's, does cut them at 80."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from truthput.report import terminal
from truthput.store.db import Store

from report_fixture import restore_quickstart_db

FIGURE = re.compile(r"\(\S+\.\.\S+\)|[-+>]?\d+\.\d+%?")


def _table(store: Store, width: int) -> str:
    con = Console(record=True, width=width)
    terminal.print_run(store, "latest", console=con)
    text = con.export_text()
    return text[:text.index("* baseline")]


@pytest.fixture(scope="module")
def store(tmp_path_factory):  # type: ignore[no-untyped-def]
    return Store(restore_quickstart_db(tmp_path_factory.mktemp("q") / "q.db"))


@pytest.mark.parametrize("width", [80, 100])
def test_no_figure_is_cut_at_80_or_100_columns(store, width):
    wide = FIGURE.findall(_table(store, 250))
    assert len(wide) >= 20
    narrow = _table(store, width)
    assert max(len(line) for line in narrow.splitlines()) <= width
    words = {w.rstrip(",;") for w in narrow.split()}  # a figure ends a list item: "2.75,"
    missing = [f for f in wide if f not in words]
    assert not missing, (missing, narrow)


def test_without_the_layout_rich_cuts_figures_at_80_columns(store, monkeypatch):
    def plain(table, rows, width):  # type: ignore[no-untyped-def]
        for row in rows:
            table.add_row(*row)
        return table

    monkeypatch.setattr(terminal, "fit_numbers", plain)
    wide = FIGURE.findall(_table(store, 250))
    words = _table(store, 80).split()
    assert [f for f in wide if f not in words]
