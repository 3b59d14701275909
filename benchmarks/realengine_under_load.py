"""The real-engine tests while a second process loads every core: do they still pass?

Why: CI machines and users' hosts are shared. The real-engine tests (real vLLM on the CPU,
llama-server, Ray) must assert what stays true on a busy host -- bounded by starts and the
engines' own counters, not by the host's speed. This starts one busy-looping process per core
(a second "user" of the machine, at the same priority), runs `pytest -m realengine -n 0` beside
it, and prints the outcome, the wall time and the load average the tests saw.

    .venv/bin/python benchmarks/realengine_under_load.py            # every real-engine test
    .venv/bin/python benchmarks/realengine_under_load.py -k cache   # a subset (pytest's -k)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", default=None, help="pytest -k expression (default: every real-engine test)")
    ap.add_argument("--loaders", type=int, default=len(os.sched_getaffinity(0)),
                    help="busy processes beside the tests (default: one per core)")
    ap.add_argument("--limit-s", type=float, default=3600.0, help="give up after this many seconds")
    args = ap.parse_args()
    stop_at = time.time() + args.limit_s
    loaders = [multiprocessing.Process(target=_burn, args=(stop_at,), daemon=True) for _ in range(args.loaders)]
    for p in loaders:
        p.start()
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "realengine", "-n", "0", "-p", "no:cacheprovider"]
    if args.k:
        cmd += ["-k", args.k]
    print(f"{args.loaders} busy processes on {len(os.sched_getaffinity(0))} cores; running: {' '.join(cmd[2:])}",
          flush=True)
    t0 = time.monotonic()
    loads: list[float] = []
    # pytest's output goes to a file, not a pipe: a pipe nobody reads fills (64 KiB of failures) and
    # blocks pytest at its summary
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            while proc.poll() is None:
                loads.append(os.getloadavg()[0])
                time.sleep(10)
        finally:
            for p in loaders:
                p.terminate()
            proc.wait()
        log.seek(0)
        out = log.read()
    wall = time.monotonic() - t0
    summary = [line for line in out.splitlines() if " passed" in line or " failed" in line or "FAILED" in line
               or " error" in line]
    print("\n".join(summary[-12:]) or out[-3000:])
    failed = [line for line in out.splitlines() if line.startswith("E   ")]
    print("\n".join(failed[:20]))
    loads.sort()
    if loads:
        print(f"load average (1 min) while the tests ran: median {loads[len(loads) // 2]:.1f}, max {loads[-1]:.1f}")
    print(f"real-engine tests under load: exit {proc.returncode}, {wall:.0f} s")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
