"""The recorded quickstart store (tests/fixtures/report/quickstart.sql.gz) restored into a temp file.

A real simulator run with the raw scrape text removed; `make_fixture.py` beside it regenerates it.
"""

from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "report" / "quickstart.sql.gz"


def restore_quickstart_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(gzip.decompress(FIXTURE.read_bytes()).decode())
    conn.close()
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    """A CSV export read back as rows of strings."""
    import csv

    with Path(path).open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))
