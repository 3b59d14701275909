"""Small wording helpers shared by every layer that prints a count."""

from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    """ "1 trial", "2 trials" (`many` for irregular plurals)."""
    return f"{n} {noun if n == 1 else (many or noun + 's')}"
