"""Write src/truthput/experiment/llamacpp-b11434-flags.json from a built llama-server's own --help.

    .venv/bin/python scripts/make_llamacpp_flags.py [LLAMA_SERVER] [--check]

Each option line of `llama-server --help` names its spellings (`-t, --threads N`); the file keeps
every spelling, the groups of spellings that are one option, and which take no value. `--check`
compares with the shipped file instead of writing it (tests/test_argv.py runs it where the binary
is built). LLAMA_SERVER defaults to scripts/install-llama-cpp.sh's build."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "src" / "truthput" / "experiment" / "llamacpp-b11434-flags.json"
BUILD = "b11434"
DEFAULT = Path.home() / ".cache" / "truthput" / f"llama.cpp-{BUILD}" / "build" / "bin" / "llama-server"


def parse_help(text: str) -> dict:
    groups: list[list[str]] = []
    booleans: set[str] = set()
    choices: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("-") or line.startswith("-----"):
            continue
        spec = re.split(r"\s{2,}", re.sub(r",\s+", ", ", line.strip()), maxsplit=1)[0]
        names, placeholder = [], ""
        for part in re.split(r", (?=-)", spec):
            words = part.strip().split(maxsplit=1)
            if words and words[0].startswith("-"):
                names.append(words[0])
                placeholder = words[1] if len(words) > 1 else placeholder
        if names:
            groups.append(names)
            if not placeholder:
                booleans.update(names)
            listed = _choices(placeholder)
            if listed:
                choices.update({n: listed for n in names})
    return {"build": BUILD, "source": "llama-server --help",
            "flags": sorted({n for g in groups for n in g}), "groups": groups, "booleans": sorted(booleans),
            "choices": dict(sorted(choices.items()))}


def _choices(placeholder: str) -> list[str]:
    """The values a placeholder lists: `{none,linear,yarn}`, `[on|off|auto]`, `<0|1>` or a bare
    `none,draft-simple,...` (llama-server's --spec-type); [] for a free value (`N`, `FNAME`)."""
    for pattern, sep in ((r"\{([\w.-]+(?:,[\w.-]+)+)\}", ","), (r"\[(\w+(?:\|\w+)+)\]", "|"),
                         (r"<(\w+(?:\|\w+)+)>", "|"), (r"([a-z][\w-]*(?:,[a-z][\w-]*){2,})", ",")):
        m = re.fullmatch(pattern, placeholder.strip())
        if m:
            return m.group(1).split(sep)
    return []


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    binary = Path(args[0]) if args else DEFAULT
    text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60).stdout
    doc = parse_help(text)
    rendered = json.dumps(doc, indent=1) + "\n"
    if check:
        same = OUT.read_text(encoding="utf-8") == rendered
        print(f"{OUT.name}: {'up to date' if same else 'differs from ' + str(binary) + ' --help'}")
        return 0 if same else 1
    OUT.write_text(rendered, encoding="utf-8")
    print(f"wrote {OUT} ({len(doc['flags'])} spellings, {len(doc['groups'])} options)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
