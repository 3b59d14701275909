"""Small wording helpers shared by every layer that prints a count."""

from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    """ "1 trial", "2 trials" (`many` for irregular plurals)."""
    return f"{n} {noun if n == 1 else (many or noun + 's')}"


PERCENT_SHOWN = 999.0
"""Beyond this a percentage is printed as a bound: an interval from very few starts at a small
nominal level can reach +10^40% (exact, and meaningless to read)."""


def capped(x: float, fmt: str) -> str:
    """`fmt` of a percentage (without its % sign), or '>' / '<' and the bound beyond PERCENT_SHOWN."""
    if x > PERCENT_SHOWN:
        return ">" + fmt.format(PERCENT_SHOWN)
    if x < -PERCENT_SHOWN:
        return "<" + fmt.format(-PERCENT_SHOWN)
    return fmt.format(x)


def percent(x: float, fmt: str = "{:+.1f}") -> str:
    """`fmt` of a percentage with its % sign, or '>+999%' / '<-999%' beyond what is worth reading."""
    if x != x:
        return "n/a"
    text = capped(x, fmt) + "%"
    return text.replace(".0%", "%") if abs(x) > PERCENT_SHOWN else text
