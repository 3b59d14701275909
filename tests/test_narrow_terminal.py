"""The terminal's run table at 80 and 100 columns cuts no figure: every number and interval of the
wide table (the recorded quickstart run) stands whole in the narrow one; labels may wrap or
shorten. A negative control: rich's own layout, without truthput's, does cut them at 80. And every
command's output at COLUMNS=80 (issue 62): no table body cut, every `!flag` of the same command at
160 columns whole, no word broken into a new fragment."""

from __future__ import annotations

import os
import re
import subprocess
import sys

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


COMMANDS = [["runs"], ["report", "latest"], ["report", "latest", "--verbose"], ["audit", "latest"]]


def _run(args: list[str], store: str, columns: int) -> str:
    # a terminal of that width (rich reads COLUMNS there; TERM=dumb: no escape codes to strip)
    env = dict(os.environ, COLUMNS=str(columns), TTY_COMPATIBLE="1", TERM="dumb")
    out = subprocess.run([sys.executable, "-m", "truthput", *args, "--store", store], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-600:]
    return out.stdout


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_at_80_columns_no_figure_or_flag_is_cut(args, tmp_path):
    store = str(restore_quickstart_db(tmp_path / "q.db"))
    wide, narrow = _run(args, store, 160), _run(args, store, 80)
    assert max(len(line) for line in narrow.splitlines()) <= 80
    cut, in_body = [], False
    for line in narrow.splitlines():  # a table's body: from the rule under its header to its end
        if line.strip() and set(line.strip()) <= set("─━┡┩╇┼├┤╋ "):
            in_body = True
        elif not line.strip() or line.lstrip().startswith("└"):
            in_body = False
        elif in_body and "…" in line:
            cut.append(line)
    assert not cut, cut  # only a header label may be shortened
    for flag in set(re.findall(r"!([a-z_]+)", wide)):
        assert re.search(rf"!{flag}\b", narrow), flag
    words = lambda text: {w for w in re.findall(r"[A-Za-z_]{6,}", text)}  # noqa: E731
    broken = {w for w in words(narrow) - words(wide) if not any(w in x for x in words(wide))}
    assert not broken, broken  # no word split mid-way into a new fragment


def test_a_table_too_wide_for_80_columns_keeps_every_figure_and_flag_whole():
    """More columns than 80 columns hold even at each column's longest word (a load row, a run with
    its extra figure columns): the rows become blocks of `header: value` lines, no figure cut."""
    from rich.table import Table
    from rich.text import Text

    from truthput.report.console import fit_numbers

    headers = ["variant", "req/s", "output tok/s (95% CI)\n[server counter]", "tok/s per stream", "TTFT p50 ms",
               "tokens per request", "vs baseline (95% CI)", "prefix-cache hits %", "replay late p99 ms",
               "starts x trials"]
    rows = [["default", "5.4935", Text("210.6 (208.0..213.2)"), "125.2", "39.5", "39.8", "baseline", "68", "1.9",
             "3 x 2"],
            ["one_seq", "5.4935", Text("172.6 (157.9..188.7) !host_interference"), "195.7", "1205.9", "39.8",
             "-18.0% (-27.3..-7.6)", "63", "1.7", "3 x 2"]]
    table = Table()
    for h in headers:
        table.add_column(Text(h))  # as the views give them: "[server counter]" is text, not markup
    con = Console(record=True, width=80)
    con.print(fit_numbers(table, rows, 80))
    text = con.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    words = set(text.split())
    for row in rows:
        for cell in row:
            assert all(w in words for w in str(cell).split()), (cell, text)
    assert "[server counter]" in " ".join(text.split())  # a header's provenance kept
