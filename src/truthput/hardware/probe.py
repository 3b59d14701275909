"""Measure this machine as a CPU host: memory bandwidth (a STREAM-style triad) and matmul FLOP/s.

Why: real vLLM runs on CPUs too (vLLM-CPU), and a CPU host's ceilings are not on any datasheet a
user has at hand: its decode step streams the weights from DRAM (bandwidth-bound), its prefill is
matmuls (FLOP-bound). The probe measures both the way vLLM-CPU's kernels would see them: the triad
runs on every core it is allowed (numpy releases the GIL, one thread per core, each on its own
slice); the matmul runs in bf16 with torch when torch is importable (what vLLM-CPU computes in),
else in float32 with numpy's BLAS, and says which, with the BLAS and its thread settings.

The result is a hardware profile (a `[[gpu]]` entry with `kind = "cpu"`, TOML) that `--gpu`,
`--sim-gpu` and `[hardware] gpu` accept as a path, read like a catalog GPU. Every figure is
[measured] on this machine at probe time; the roofline's ceilings from it are model figures.

This file runs standalone too (`python path/to/probe.py` prints JSON; stdlib + numpy, torch
optional), so a probe can be taken with another interpreter (one that has torch).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any

#: Bytes per triad array per thread: far beyond any CPU cache, small enough for any host.
TRIAD_BYTES = 64 * 2**20
REPEATS = 5


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _cpuinfo(field: str) -> str | None:
    """The first CPU's `field` in /proc/cpuinfo (None off Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    return set((_cpuinfo("flags") or "").split())


def _memory_bytes() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def triad_bandwidth(threads: int, array_bytes: int = TRIAD_BYTES, repeats: int = REPEATS) -> dict[str, Any]:
    """a = b + s*c on `threads` threads at once, each on its own arrays; bytes/s of the memory
    traffic numpy really makes (copy c->a, a *= s, a += b: 2 + 2 + 3 array passes of 8-byte
    elements), best of `repeats` (STREAM's convention: the best run is the one least disturbed)."""
    import numpy as np

    n = max(1024, array_bytes // 8)
    arrays = [(np.zeros(n), np.full(n, 1.0), np.full(n, 2.0)) for _ in range(threads)]
    passes = 7

    def work(a, b, c) -> None:
        np.copyto(a, c)
        a *= 3.0
        a += b

    for a, b, c in arrays:  # touch every page once before timing
        work(a, b, c)
    times = []
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)

        def run(a, b, c) -> None:
            barrier.wait()
            work(a, b, c)

        pool = [threading.Thread(target=run, args=arr) for arr in arrays]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        times.append(time.perf_counter() - t0)
    moved = passes * 8 * n * threads
    assert all(float(a[0]) == 7.0 for a, _, _ in arrays)  # 1 + 3 * 2: the work was done
    return {"bytes_per_s": moved / min(times), "median_bytes_per_s": moved / statistics.median(times),
            "threads": threads, "bytes_per_run": moved, "method": f"numpy triad, {threads} threads x "
            f"{n * 8 / 2**20:.0f} MiB arrays, {passes} array passes counted, best of {repeats}"}


def _torch() -> Any:
    """torch where this interpreter has it (the bf16 kernels vLLM-CPU runs), else None."""
    try:
        import torch
    except Exception:
        return None
    return torch


def matmul_flops(size: int = 2048, repeats: int = REPEATS, prefer_torch: bool = True) -> dict[str, Any]:
    """FLOP/s of an n x n x n matmul (2 n^3 FLOPs), best of `repeats`: bf16 with torch when
    importable, else float32 with numpy's BLAS."""
    torch = _torch() if prefer_torch else None
    flop = 2.0 * size**3
    times = []
    if torch is not None:
        a = torch.randn(size, size, dtype=torch.bfloat16)
        b = torch.randn(size, size, dtype=torch.bfloat16)
        torch.matmul(a, b)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - t0)
        how = f"torch {torch.__version__} bf16 matmul, {torch.get_num_threads()} threads"
        dtype = "bf16"
    else:
        import numpy as np

        a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
        b = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
        a @ b
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        how = f"numpy float32 matmul ({_blas_name()}; no torch here, so not bf16)"
        dtype = "fp32"
    return {"flops": flop / min(times), "median_flops": flop / statistics.median(times), "dtype": dtype,
            "size": size, "method": f"{how}, {size}^3, best of {repeats}"}


#: Weight bytes the decode-shaped probe streams per pass: far beyond any CPU cache, as a model's are.
DECODE_WEIGHT_BYTES = 256 * 2**20
#: Rows of the decode-shaped probe: one sequence, and a batch's worth (sequences x verified drafts).
DECODE_ROWS = (1, 32)


def decode_matmul_flops(weight_bytes: int = DECODE_WEIGHT_BYTES, rows: tuple[int, int] = DECODE_ROWS,
                        repeats: int = 2 * REPEATS - 1, prefer_torch: bool = True) -> dict[str, Any]:
    """FLOP/s of the rows a decode step adds: a stack of transformer-shaped weight matmuls (up and
    down projections, 4096 x 1024, far beyond the caches) run at rows[0] and rows[1] rows, and the
    added rows' FLOPs over the added time (median of `repeats`). On a CPU this is what one more
    sequence or verified draft costs; a square matmul's rate, reused from cache, runs faster than a
    decode step's rows do, and the first row's time is the weights' streaming, already priced by
    the triad's bandwidth."""
    torch = _torch() if prefer_torch else None
    wide, narrow = 4096, 1024
    item = 2 if torch is not None else 4
    pairs = max(1, weight_bytes // (2 * wide * narrow * item))
    params = 2 * wide * narrow * pairs
    if torch is not None:
        mats = [(torch.randn(wide, narrow, dtype=torch.bfloat16), torch.randn(narrow, wide, dtype=torch.bfloat16))
                for _ in range(pairs)]
        linear = torch.nn.functional.linear

        def once(m: int) -> float:
            x = torch.randn(m, narrow, dtype=torch.bfloat16)
            t0 = time.perf_counter()
            for up, down in mats:
                linear(linear(x, up), down)
            return time.perf_counter() - t0
        how = f"torch {torch.__version__} bf16 linear, {torch.get_num_threads()} threads"
    else:
        import numpy as np

        rng = np.random.default_rng(0)
        arrays = [(rng.standard_normal((narrow, wide), dtype=np.float32),
                   rng.standard_normal((wide, narrow), dtype=np.float32)) for _ in range(pairs)]

        def once(m: int) -> float:
            x = rng.standard_normal((m, narrow), dtype=np.float32)
            t0 = time.perf_counter()
            for up, down in arrays:
                (x @ up) @ down
            return time.perf_counter() - t0
        how = f"numpy float32 matmul ({_blas_name()}; no torch here, so not bf16)"
    times = {}
    for m in rows:
        once(m)
        times[m] = statistics.median(once(m) for _ in range(repeats))
    added = times[rows[1]] - times[rows[0]]
    flops = 2.0 * params * (rows[1] - rows[0]) / added if added > 0 else None
    return {"flops": flops, "seconds": {str(m): t for m, t in times.items()}, "weight_bytes": params * item,
            "method": f"{how}, {pairs} x ({wide}x{narrow} up, {narrow}x{wide} down) at {rows[0]} and "
                      f"{rows[1]} rows, the added rows' FLOPs over the added time, median of {repeats}"}


def _blas_name() -> str:
    try:
        import numpy as np

        cfg = np.show_config(mode="dicts")  # numpy >= 1.25
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return f"BLAS {blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:
        return "BLAS unknown"


def measure(prefer_torch: bool = True) -> dict[str, Any]:
    """Everything the profile needs, measured now, with the settings that shaped it."""
    cores = _cores()
    flags = _cpu_flags()
    threads_env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                               "VLLM_CPU_OMP_THREADS_BIND") if k in os.environ}
    return {
        "cpu_model": _cpu_model(),
        "cores": len(cores),
        "core_ids": cores,
        "memory_bytes": _memory_bytes(),
        "bf16_instructions": sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile")),
        "python": sys.executable,
        "thread_settings": threads_env,
        "blas": _blas_name(),
        "triad": triad_bandwidth(len(cores)),
        "matmul": matmul_flops(prefer_torch=prefer_torch),
        "decode_matmul": decode_matmul_flops(prefer_torch=prefer_torch),
        "at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def profile_toml(facts: dict[str, Any], name: str | None = None) -> str:
    """The measured host as a hardware entry: what `--gpu PATH` / `[hardware] gpu = PATH` read."""
    cores = int(facts["cores"])
    label = name or f"{facts['cpu_model']} ({cores} cores, probed)"
    memory = facts.get("memory_bytes") or 0.0
    decode_flops = (facts.get("decode_matmul") or {}).get("flops")
    source = (f"measured by `truthput hardware probe` on {facts['at']}: {facts['triad']['method']}; "
              f"{facts['matmul']['method']}"
              + (f"; decode rows: {facts['decode_matmul']['method']}" if decode_flops else ""))
    lines = [
        "# A CPU host measured by `truthput hardware probe` (figures are [measured] on this machine).",
        f"# python {facts['python']}; thread settings {json.dumps(facts['thread_settings'])}; "
        f"bf16 instructions {', '.join(facts['bf16_instructions']) or 'none'}",
        "[[gpu]]",
        f"name = {json.dumps(label)}",
        'kind = "cpu"',
        f"cores = {cores}",
        f"memory_bytes = {memory:.0f}",
        f"mem_bw_Bps = {facts['triad']['bytes_per_s']:.4g}",
        f"bf16_flops = {facts['matmul']['flops']:.4g}   # {facts['matmul']['dtype']} matmul",
        *([f"decode_flops = {decode_flops:.4g}   # the rows a decode step adds"] if decode_flops else []),
        f"sources = [{json.dumps(source)}]",
        "[gpu.interconnect]",
        'kind = "none"',
        "bandwidth_Bps = 0",
        "latency_s = 0",
        'source = "one host: no tensor-parallel link"',
        "",
    ]
    return "\n".join(lines)


GPU_COPY_BYTES = 2 * 2**30
"""Bytes of the device-to-device copy the GPU probe times (each byte read once and written once)."""


def measure_gpu(device: int = 0, size: int = 8192, repeats: int = REPEATS) -> dict[str, Any]:
    """One CUDA GPU, measured with torch: its name and memory, its memory bandwidth (a device
    copy: bytes read + written over the time) and its bf16 matmul FLOP/s (size^3), best of
    `repeats`; the board's power limit from NVML where nvidia-ml-py is installed."""
    torch = _torch()
    if torch is None or not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU that torch can use here (the GPU probe needs torch with CUDA)")
    dev = torch.device("cuda", device)
    props = torch.cuda.get_device_properties(dev)
    src = torch.empty(GPU_COPY_BYTES // 2, dtype=torch.float16, device=dev).normal_()
    dst = torch.empty_like(src)

    def timed(fn: Any) -> list[float]:
        fn()
        torch.cuda.synchronize(dev)
        out = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(dev)
            out.append(start.elapsed_time(end) / 1e3)
        return out

    copy_s = timed(lambda: dst.copy_(src))
    del src, dst
    a = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
    mm_s = timed(lambda: torch.matmul(a, b))
    power_w = None
    try:
        import pynvml

        pynvml.nvmlInit()
        power_w = pynvml.nvmlDeviceGetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(device)) / 1e3
    except Exception:
        pass
    moved = 2.0 * GPU_COPY_BYTES
    return {"name": props.name, "memory_bytes": float(props.total_memory), "board_power_w": power_w,
            "copy": {"bytes_per_s": moved / min(copy_s), "median_bytes_per_s": moved / statistics.median(copy_s),
                     "method": f"torch {torch.__version__} device copy of {GPU_COPY_BYTES / 2**30:g} GiB (read + "
                               f"write), CUDA events, best of {repeats}"},
            "matmul": {"flops": 2.0 * size**3 / min(mm_s), "median_flops": 2.0 * size**3 / statistics.median(mm_s),
                       "dtype": "bf16", "method": f"torch bf16 matmul {size}^3 on the GPU, best of {repeats}"},
            "at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def gpu_profile_toml(facts: dict[str, Any], name: str | None = None) -> str:
    """The measured GPU as a hardware entry (its measured bandwidth and matmul rate are its ceilings)."""
    label = name or f"{facts['name']} (probed)"
    source = f"measured by `truthput hardware probe --gpu` on {facts['at']}: {facts['copy']['method']}; " \
             f"{facts['matmul']['method']}"
    return "\n".join([
        "# A GPU measured by `truthput hardware probe --gpu` (figures are [measured] on this machine).",
        "[[gpu]]",
        f"name = {json.dumps(label)}",
        f"memory_gib = {facts['memory_bytes'] / 2**30:.1f}",
        f"mem_bw_Bps = {facts['copy']['bytes_per_s']:.4g}",
        f"bf16_flops = {facts['matmul']['flops']:.4g}",
        *([f"board_power_w = {facts['board_power_w']:.0f}"] if facts.get("board_power_w") else []),
        f"sources = [{json.dumps(source)}]",
        "[gpu.interconnect]",
        'kind = "none"',
        "bandwidth_Bps = 0",
        "latency_s = 0",
        'source = "one GPU measured: no tensor-parallel link"',
        "",
    ])


if __name__ == "__main__":
    print(json.dumps(measure_gpu() if "--gpu" in sys.argv else measure(prefer_torch="--no-torch" not in sys.argv)))
