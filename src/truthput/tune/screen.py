"""Screening on the simulator: many configurations in virtual time, in a few subprocesses.

The core launches the simulator, never imports it: each batch goes to `python -m truthput.sim
batch` (JSON lines in, JSON lines out) with the same `sim serve` argv a real-time start would get,
so a configuration is refused or priced exactly as it would be when served. Batches are split over
the cores (one process per core), since each configuration costs CPU time, not wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from truthput.engines.factory import sim_argv, sim_requirements
from truthput.errors import TruthputError
from truthput.experiment.argv import ServerArgv, variant_argv
from truthput.experiment.engines import metric_family
from truthput.experiment.file import Experiment
from truthput.experiment.levels import Level, is_rate
from truthput.load.virtual import VirtualLoad
from truthput.tune.search import Evaluation
from truthput.tune.space import Space


def mean_length(value: Any, what: str) -> int:
    """A workload length (an int or a distribution table) as the fixed length the screen uses."""
    if isinstance(value, int):
        return value
    from truthput.load.workload import _as_dist

    return max(1, int(round(_as_dist(value, what).expected)))


def screen_load(exp: Experiment, level: Level) -> VirtualLoad:
    """The load every configuration is screened under (virtual seconds): the experiment's own
    warm-up and window, so the screen predicts what a trial will measure. A closed loop of
    `concurrency` streams, or with `rate` an open loop whose goodput is counted against the SLOs."""
    wl = exp.workload
    rate = float(level) if is_rate(level) else None
    slo = exp.slo if rate is not None else None
    return VirtualLoad(concurrency=0 if rate is not None else int(level),
                       input_tokens=mean_length(wl.input_tokens, "input_tokens"),
                       output_tokens=mean_length(wl.output_tokens, "output_tokens"),
                       duration_s=float(wl.duration_s or 30.0), warmup_s=wl.warmup_s, rate=rate, arrival=wl.arrival,
                       max_in_flight=wl.max_in_flight, slo_ttft_ms=slo.ttft_ms if slo else None,
                       slo_itl_ms=slo.itl_ms if slo else None, slo_e2e_ms=slo.e2e_ms if slo else None)


def batch_lines(exp: Experiment, space: Space, configs: Sequence[dict[str, Any]], load: VirtualLoad,
                starts: int, seed: int, extra_argv: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One `sim batch` line per configuration: its `sim serve` argv and the load."""
    sim_requirements(exp)
    base = ServerArgv.parse(exp.server.command, engine=metric_family("sim"))
    lines = []
    for i, config in enumerate(configs):
        v = space.variant(base, config)
        argv = variant_argv(base, set=v.set, remove=v.remove, where=f"[tune] {v.name!r}")
        launched = sim_argv(exp, argv, "127.0.0.1", 0, seed)
        serve_args = launched[launched.index("serve") + 1:]
        lines.append({"id": i, "argv": [*serve_args, *extra_argv], **load.line(), "starts": starts, "seed": seed})
    return lines


def run_batch(lines: Sequence[dict[str, Any]], workers: int | None = None,
              python: str | None = None) -> list[dict[str, Any]]:
    """Evaluate batch lines in `workers` simulator processes; results in the lines' order."""
    if not lines:
        return []
    workers = max(1, min(workers or (os.cpu_count() or 1), len(lines)))
    chunks = [list(lines[i::workers]) for i in range(workers)]

    def one(chunk: list[dict[str, Any]]) -> list[dict[str, Any]]:
        text = "".join(json.dumps(x) + "\n" for x in chunk)
        proc = subprocess.run([python or sys.executable, "-m", "truthput.sim", "batch"], input=text,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise TruthputError(f"simulator batch (python -m truthput.sim batch) failed: {last}")
        return [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, chunks))
    out: list[dict[str, Any]] = [{}] * len(lines)
    for w, res in enumerate(results):
        for j, r in enumerate(res):
            out[w + j * workers] = r
    return out


def to_evaluation(config: dict[str, Any], result: dict[str, Any], source: str = "simulator",
                  figure: str = "tokps") -> Evaluation:
    """A batch result as an evaluation of the objective's figure, the result's field `figure`
    (`tune.search.screen_field`: tokps, goodput or tokps_per_w)."""
    if not result.get("ok"):
        return Evaluation(config, source, False, failure=result.get("failure") or "failed",
                          reason=result.get("reason") or "", starts=0)
    values = list(result.get(figure) or [])
    return Evaluation(config, source, True, values=values, ttft_p99_s=result.get("ttft_p99_s"),
                      itl_p99_s=result.get("itl_p99_s"), starts=len(values))


def screen(exp: Experiment, space: Space, configs: Sequence[dict[str, Any]], load: VirtualLoad, starts: int = 1,
           seed: int = 0, extra_argv: Sequence[str] = (), workers: int | None = None,
           figure: str = "tokps") -> list[Evaluation]:
    """Each configuration on the simulator in virtual time, scored on the result field `figure`."""
    lines = batch_lines(exp, space, configs, load, starts, seed, extra_argv)
    return [to_evaluation(c, r, figure=figure) for c, r in zip(configs, run_batch(lines, workers))]
