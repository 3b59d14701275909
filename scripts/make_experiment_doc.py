"""Write docs/experiment.md from the experiment file's model: every key of every table, with its
type, default and meaning.

The meaning is the field's own comment in `truthput/experiment/file.py` (the `# ...` on its line, or
the docstring under it), so the doc and the model cannot drift apart. Run:
.venv/bin/python scripts/make_experiment_doc.py   (tests/test_docs.py fails when a key has no entry
or no meaning, so regenerate after changing the model).
"""

from __future__ import annotations

import ast
import inspect
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from truthput.experiment import file as model

OUT = Path(__file__).resolve().parents[1] / "docs" / "experiment.md"
def tables(cls: type[BaseModel] = model.Experiment, prefix: str = "") -> list[tuple[str, type[BaseModel], str]]:
    """(table header, its model, what it is for) of every table the file can hold, walked from the
    model in its order: `[server]`, `[server.systemd_unit]`, `[[variant]]`, ..."""
    out = []
    for name, info in cls.model_fields.items():
        annotation = info.annotation
        many = typing.get_origin(annotation) is list
        for inner in typing.get_args(annotation) or (annotation,):
            inner = typing.get_args(inner)[0] if typing.get_origin(inner) is list else inner
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                what = " ".join((inner.__dict__.get("__doc__") or "").split("\n\n")[0].split())
                out.append((f"[[{prefix}{name}]]" if many else f"[{prefix}{name}]", inner, what))
                out += tables(inner, f"{prefix}{name}.")
    return out


TABLES = tables()


def field_comments(cls: type) -> dict[str, str]:
    """name -> the comment on the field's line, else the string literal right under it."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    tree = ast.parse(source)
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = lines[node.lineno - 1]
            text = ""
            if "  # " in line:
                text = line.split("  # ", 1)[1].strip()
            nxt = body[i + 1] if i + 1 < len(body) else None
            if (not text and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                text = " ".join(nxt.value.value.split())
            if not text:
                # a comment on the line(s) just above the field
                above = []
                j = node.lineno - 2
                while j >= 0 and lines[j].strip().startswith("#"):
                    above.insert(0, lines[j].strip().lstrip("#").strip())
                    j -= 1
                text = " ".join(above)
            out[node.target.id] = text
    return out


def _type(annotation: Any) -> str:
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = text.replace("typing.", "").replace("truthput.experiment.file.", "").replace("NoneType", "None")
    return text.replace("Literal", "one of ")


def _default(info: Any) -> str:
    if info.default is not PydanticUndefined:
        return "(required)" if info.default is ... else f"`{info.default!r}`"
    if info.default_factory is not None:
        try:
            return f"`{info.default_factory()!r}`"
        except TypeError:
            return "(computed)"
    return "(required)"


def entries() -> list[tuple[str, str, str, str, str]]:
    """(table, key, type, default, meaning) of every key."""
    rows = []
    for table, cls, _ in TABLES:
        comments = field_comments(cls)
        for name, info in cls.model_fields.items():
            key = info.alias or name
            meaning = info.description or comments.get(name, "")
            rows.append((table, key, _type(info.annotation), _default(info), meaning))
    return rows


def render() -> str:
    out = ["# The experiment file", "",
           "Generated from the model (`truthput/experiment/file.py`) by `scripts/make_experiment_doc.py`.",
           "Every key of every table, with its type, its default and what it does. `truthput plan FILE`",
           "checks a file without starting anything; `examples/` has complete files.", ""]
    by_table: dict[str, list[tuple[str, str, str, str, str]]] = {}
    for row in entries():
        by_table.setdefault(row[0], []).append(row)
    for table, _cls, what in TABLES:
        out += [f"## `{table}`", "", what, "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for _t, key, kind, default, meaning in by_table.get(table, []):
            cell = meaning.replace("|", "\\|")
            out.append(f"| `{key}` | {kind.replace('|', 'or')} | {default.replace('|', 'or')} | {cell} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    OUT.write_text(render())
    missing = [f"{t} {k}" for t, k, _, _, m in entries() if not m]
    print(f"wrote {OUT}; {len(missing)} keys without a meaning: {', '.join(missing)}")
    sys.exit(0)
