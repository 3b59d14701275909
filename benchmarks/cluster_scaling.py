"""Wall time of a large plan against the number of nodes, by a timing model of the Ray executor.

The plan is a real one (`runner.build_plan` on a generated experiment: 100 variants of a TP=1 vLLM
command, --max-num-seqs x --spec-tokens x --kv-cache-dtype, 3 starts each, 4 load levels), and the
placement is the executor's own decision (`executors.ray_cluster.pick_node`): the plan's
interleaved order, dealt to the least-used free node, as many starts per node at once as its GPUs
hold. What is modelled, not measured, is each start's duration: a server restart of RESTART_S
(vLLM's load + readiness on a GPU box; ~60 s) plus every level's warm-up and trial windows, each
start drawn +-JITTER around that (servers and windows vary), and the driver's own cost per start
(DRIVER_S: actor creation, the trial commits). Nodes have 8 GPUs; each start reserves 1 or 2
(tensor parallel), so a node runs 4-8 servers side by side.

    .venv/bin/python benchmarks/cluster_scaling.py [--variants 100] [--nodes 1-10] [--gpus 8]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

RESTART_S = 60.0
DRIVER_S = 0.5
JITTER = 0.15


def experiment_text(n_variants: int) -> str:
    seqs = [16, 32, 64, 128, 256]
    spec = [0, 1, 2, 3, 4]
    kv = ["auto", "fp8"]
    tp = [1, 2]
    lines = ["[experiment]", 'name = "scaling"', 'baseline = "v0"', "", "[server]", 'engine = "vllm"',
             'command = ["vllm", "serve", "/models/m"]', "", "[hardware]", 'gpu = "H100 SXM"', "count = 8", "",
             "[workload]", "concurrency = [1, 4, 16, 64]", "duration_s = 30", "warmup_s = 5", "",
             "[measure]", "starts = 3", "repeats = 1", "sequential = false", ""]
    for i, (s, k, d, t) in enumerate(itertools.islice(itertools.product(seqs, spec, kv, tp), n_variants)):
        sets = {"--max-num-seqs": s, "--kv-cache-dtype": d, "--tensor-parallel-size": t}
        if k:
            sets.update({"--spec-method": "ngram", "--spec-tokens": k})
        body = ", ".join(f'"{a}" = {b!r}'.replace("'", '"') for a, b in sets.items())
        lines += ["[[variant]]", f'name = "v{i}"', f"set = {{ {body} }}", ""]
    return "\n".join(lines)


def simulate(plan, wants, n_nodes: int, gpus: int, seed: int) -> tuple[float, float]:
    """(wall seconds, mean GPU occupancy) of the plan on n_nodes nodes, in virtual time."""
    from truthput.cluster import Node
    from truthput.run.executors.ray_cluster import pick_node

    rng = random.Random(seed)
    nodes = [Node(node_id=f"n{i}", address=f"10.0.0.{i}", gpus=gpus, cpus=64, accelerator=None, labels={},
                  head=i == 0, gpu_type="H100", driver="x") for i in range(n_nodes)]
    busy = {n.node_id: 0 for n in nodes}
    used = {n.node_id: 0 for n in nodes}
    wl = plan.levels
    per_start = RESTART_S + len(wl) * (5.0 + plan.repeats * (30.0 + 3.0))
    queue = list(plan.order)
    events: list[tuple[float, str, int]] = []
    now, driver_free, gpu_s = 0.0, 0.0, 0.0
    while queue or events:
        while queue:
            name, _ = queue[0]
            need = wants[name]
            node = pick_node(need, nodes, busy, used)
            if node is None:
                break
            queue.pop(0)
            busy[node.node_id] += 1
            used[node.node_id] += 1
            begin = max(now, driver_free)
            driver_free = begin + DRIVER_S  # the driver places one start at a time
            length = per_start * rng.uniform(1 - JITTER, 1 + JITTER)
            gpu_s += length * need.gpus
            heapq.heappush(events, (begin + length, node.node_id, need.gpus))
        now, node_id, _g = heapq.heappop(events)
        busy[node_id] -= 1
    return now, gpu_s / (now * n_nodes * gpus)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", type=int, default=100)
    ap.add_argument("--nodes", default="1-10")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    from truthput.run.executors.ray_cluster import Need
    from truthput.experiment.argv import int_flag
    from truthput.run.plan import build_plan
    from truthput.experiment.file import parse_experiment

    exp = parse_experiment(experiment_text(args.variants), "scaling.toml")
    plan = build_plan(exp)
    wants = {v.name: Need(v.name, int_flag(v.argv, ("--tensor-parallel-size",), v.name), None, {})
             for v in plan.variants}
    lo, _, hi = args.nodes.partition("-")
    counts = range(int(lo), int(hi or lo) + 1)
    serial = sum(RESTART_S + len(plan.levels) * (5.0 + plan.repeats * 33.0) for _ in plan.order)
    print(f"{len(plan.variants)} variants x {exp.measure.starts} starts = {len(plan.order)} server starts, "
          f"{len(plan.levels)} levels each; one box, one server at a time: {serial / 3600:.1f} h")
    print(f"{'nodes':>5} {'GPUs':>5} {'wall (median of ' + str(args.seeds) + ')':>20} {'speed-up':>9} "
          f"{'vs 1 node':>9} {'GPU busy':>9}")
    base = None
    for n in counts:
        runs = sorted(simulate(plan, wants, n, args.gpus, seed) for seed in range(args.seeds))
        wall, occ = runs[len(runs) // 2]
        base = base or wall
        print(f"{n:>5} {n * args.gpus:>5} {wall / 60:>17.1f} min {serial / wall:>8.1f}x {base / wall:>8.2f}x "
              f"{occ:>8.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
