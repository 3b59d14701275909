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
    for line in text.splitlines():
        if not line.startswith("-") or line.startswith("-----"):
            continue
        spec = re.split(r"\s{2,}", re.sub(r",\s+", ", ", line.strip()), maxsplit=1)[0]
        names, takes = [], False
        for part in spec.split(","):
            words = part.strip().split()
            if words and words[0].startswith("-"):
                names.append(words[0])
                takes = takes or len(words) > 1
        if names:
            groups.append(names)
            if not takes:
                booleans.update(names)
    return {"build": BUILD, "source": "llama-server --help",
            "flags": sorted({n for g in groups for n in g}), "groups": groups, "booleans": sorted(booleans)}


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
