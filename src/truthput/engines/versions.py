"""What machine and which engine version produced a run (stored in `runs.machine_json` and
`starts.engine_version`).

Why: a throughput figure is meaningless without the hardware, driver and engine version behind
it; two runs can only be compared when these are known. Everything here is best effort: a field
that cannot be read is None, never an exception.
"""

from __future__ import annotations

import functools
import os
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENGINE_VERSION_TIMEOUT_S = 60.0
# How each engine's Python package reports its version.
_VERSION_SNIPPETS = {
    "vllm": "import vllm; print(vllm.__version__)",
    "sglang": "import sglang; print(sglang.__version__)",
}
_REPO_ROOT = Path(__file__).resolve().parents[3]


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _os_name() -> str:
    try:
        info = platform.freedesktop_os_release()
        return f"{info.get('PRETTY_NAME', info.get('NAME', 'Linux'))} (kernel {platform.release()})"
    except (OSError, AttributeError):
        return f"{platform.system()} {platform.release()}"


def _truthput_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("truthput")
    except Exception:
        try:
            import truthput

            return getattr(truthput, "__version__", None)
        except Exception:
            return None


def git_commit(repo: Path = _REPO_ROOT) -> dict[str, Any] | None:
    """The repo's HEAD commit and whether the tree has uncommitted changes; None when truthput
    does not run from a git checkout (an installed wheel must not report some other repo's commit)."""
    if not (repo / ".git").exists() or not (repo / "src" / "truthput").is_dir():
        return None
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_metadata(nvml: ModuleType | None = None) -> dict[str, Any]:
    """GPU names, memory, driver and CUDA driver version via NVML; {"available": False, reason}
    without it."""
    from truthput.engines.telemetry import _shutdown, load_nvml

    mod, why = load_nvml(nvml)
    if mod is None:
        return {"available": False, "reason": f"no NVML: {why}"}
    try:
        info: dict[str, Any] = {"available": True, "gpus": []}
        try:
            info["driver"] = _text(mod.nvmlSystemGetDriverVersion())
        except Exception:
            info["driver"] = None
        try:
            cuda = int(mod.nvmlSystemGetCudaDriverVersion())
            info["cuda"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        except Exception:
            info["cuda"] = None
        for i in range(mod.nvmlDeviceGetCount()):
            h = mod.nvmlDeviceGetHandleByIndex(i)
            gpu: dict[str, Any] = {"index": i}
            try:
                gpu["name"] = _text(mod.nvmlDeviceGetName(h))
            except Exception:
                gpu["name"] = None
            try:
                gpu["memory_bytes"] = int(mod.nvmlDeviceGetMemoryInfo(h).total)
            except Exception:
                gpu["memory_bytes"] = None
            info["gpus"].append(gpu)
        return info
    finally:
        _shutdown(mod)


def machine_metadata(nvml: ModuleType | None = None) -> dict[str, Any]:
    """Host, OS, CPU, memory, Python, truthput version + git commit, GPUs (NVML when present)."""
    return {
        "hostname": socket.gethostname(),
        "os": _os_name(),
        "arch": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": _memory_bytes(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "truthput_version": _truthput_version(),
        "git": git_commit(),
        "gpu": gpu_metadata(nvml),
    }


@functools.lru_cache(maxsize=32)
def _run_version(python: str, engine: str, timeout: float) -> str | None:
    snippet = _VERSION_SNIPPETS.get(engine)
    if snippet is None:
        return None
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run([python, "-c", snippet], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else None


@functools.lru_cache(maxsize=32)
def _binary_version(exe: str, timeout: float) -> str | None:
    """`llama-server --version` prints e.g. "version: 1 (515e855)" (to stderr)."""
    import re

    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^version:\s*(.+)$", proc.stdout + "\n" + proc.stderr, re.MULTILINE)
    return m.group(1).strip() if m else None


def engine_version(python_exe_or_argv: str | Sequence[str], engine: str = "vllm",
                   timeout: float = ENGINE_VERSION_TIMEOUT_S) -> str | None:
    """The engine's version as the engine itself reports it, cached per executable: for Python
    engines its interpreter runs `import vllm; print(vllm.__version__)` (sglang likewise); for
    llama.cpp the server binary runs `--version`. None when it cannot be told (import fails,
    timeout, unknown engine)."""
    if engine == "llamacpp":
        argv = shlex.split(python_exe_or_argv) if isinstance(python_exe_or_argv, str) else list(python_exe_or_argv)
        return _binary_version(argv[0], timeout) if argv else None
    from truthput.experiment.flagcheck import engine_python

    argv = shlex.split(python_exe_or_argv) if isinstance(python_exe_or_argv, str) else list(python_exe_or_argv)
    python = engine_python(argv)
    if python is None:
        return None
    return _run_version(python, engine, timeout)
