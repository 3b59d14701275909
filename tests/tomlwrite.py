"""A small TOML writer for test documents built as dicts (JSON strings are TOML basic strings;
floats keep nan and inf), so malformed values can be written that no TOML library would emit."""

from __future__ import annotations

import json
import math
from typing import Any


def _val(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {_val(x)}" for k, x in v.items()) + " }"


def toml_text(doc: dict[str, Any]) -> str:
    out: list[str] = []
    for section, body in doc.items():
        if isinstance(body, list):
            for item in body:
                out.append(f"[[{section}]]")
                out.extend(f"{json.dumps(k)} = {_val(v)}" for k, v in item.items())
        elif isinstance(body, dict):
            out.append(f"[{section}]")
            out.extend(f"{json.dumps(k)} = {_val(v)}" for k, v in body.items())
        else:
            out.append(f"{section} = {_val(body)}")
    return "\n".join(out) + "\n"
