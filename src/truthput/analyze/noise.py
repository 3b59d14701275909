"""Why a cell's figures vary from start to start, where its trials show a likely cause: other
processes on the host, or the server's threads and truthput's own client on the same cores — each
with the setting that addresses it. Said beside the cell's noise warning (`analyze.stats.noise_warnings`)."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from truthput.measure.model import TrialResults

SHARED_CORES_SLACK = 0.25
"""Server + client using all but this much of the host's cores: they contend for them."""


def likely_noise_cause(results: Sequence[TrialResults]) -> str | None:
    """The likely cause of start-to-start spread the cell's ok trials can see, or None."""
    if not results:
        return None
    busy = [r for r in results if any(f.code == "host_interference" for f in r.headline().flags)]
    if busy:
        return (f"likely cause: other processes used this host's CPU in {len(busy)} of {len(results)} trials "
                "(host_interference): measure on a quiet host, or pin the server ([server] cpus) and the client "
                "([workload] client_cpus) to cores nothing else uses")
    server = [r.interference.server_cores.number() for r in results if r.interference.server_cores is not None]
    client = [r.client.selfcheck.cpu_util for r in results
              if r.client.selfcheck is not None and r.client.selfcheck.cpu_util is not None]
    cores = next((r.interference.host_cores for r in results if r.interference.host_cores), None)
    known = [x for x in server if x is not None]
    if not cores or not known or not client:
        return None
    used = median(known) + median(client)
    if used < cores - SHARED_CORES_SLACK:
        return None
    return (f"likely cause: the server ({median(known):.2f} cores) and truthput's client ({median(client):.2f}) "
            f"used all {cores} of this host's cores between them: unless they are pinned apart already, do so with "
            "[server] cpus and "
            "[workload] client_cpus (docs/experiment.md), or give the server fewer threads than cores "
            "(llama.cpp's -t, vLLM-CPU's VLLM_CPU_OMP_THREADS_BIND)")
