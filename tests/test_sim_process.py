"""`python -m truthput.sim serve` as a subprocess, the way the runner launches it: start-up
failures in vLLM's wording with exit code 1, flag handling, readiness, SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

PY = sys.executable


def _sim(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "truthput.sim", "serve", *args], capture_output=True, text=True,
                          timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_model_too_big_for_gpu_exits_1_with_vllm_oom_wording():
    p = _sim("--sim-gpu", "RTX 3090", "--sim-model", "llama-3.1-70b", "--max-model-len", "4096")
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert any("CUDA out of memory" in ln for ln in lines)
    assert lines[-1].startswith("RuntimeError: Engine core initialization failed. See root cause above.")


def test_kv_cache_too_small_for_max_model_len_exits_1():
    p = _sim("--sim-gpu", "RTX 3090", "--sim-model", "llama-3.1-8b", "--max-model-len", "131072")
    assert p.returncode == 1
    assert "To serve at least one request with the model's max seq len (131072)" in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("RuntimeError: Engine core initialization failed")


def test_max_model_len_above_models_exits_1():
    p = _sim("--sim-gpu", "H100", "--sim-model", "qwen2.5-7b", "--max-model-len", "65536")
    assert p.returncode == 1
    assert "User-specified max_model_len (65536) is greater than the derived max_model_len" in p.stderr


def test_conflicting_speculation_settings_exit_1():
    p = _sim("--sim-gpu", "H100", "--sim-model", "llama-3.1-8b", "--spec-method", "mtp", "--spec-tokens", "3",
             "--speculative-config", '{"num_speculative_tokens":2}')
    assert p.returncode == 1
    assert "conflicting speculative settings" in p.stderr
    assert "'num_speculative_tokens'" in p.stderr and "--spec-tokens 3" in p.stderr  # names both spellings


def test_missing_model_or_gpu_says_which_flags():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRUTHPUT_SIM_")}
    p = subprocess.run([PY, "-m", "truthput.sim", "serve", "--sim-gpu", "H100", "--model", "/no/such/dir"],
                       capture_output=True, text=True, env=env, timeout=20)
    assert p.returncode == 1 and "--sim-model" in p.stderr
    p = subprocess.run([PY, "-m", "truthput.sim", "serve", "--sim-model", "llama-3.1-8b"],
                       capture_output=True, text=True, env=env, timeout=20)
    assert p.returncode == 1 and "--sim-gpu" in p.stderr


def test_help_documents_vllm_and_sim_flags():
    p = _sim("--help")
    assert p.returncode == 0
    for flag in ("--tensor-parallel-size", "--gpu-memory-utilization", "--max-num-seqs", "--kv-cache-dtype",
                 "--speculative-config", "--spec-tokens", "--sim-gpu", "--sim-profile", "--noise", "--seed"):
        assert flag in p.stdout


def test_serves_lists_ignored_flags_and_stops_on_sigterm_within_a_second():
    port = _free_port()
    proc = subprocess.Popen(
        [PY, "-m", "truthput.sim", "serve", "--model", "/models/qwen", "--sim-model", "qwen2.5-7b",
         "--sim-gpu", "H100", "--max-model-len", "8192", "--port", str(port), "--sim-startup-s", "0.3",
         "--enable-frobnication", "--frob-level", "3", "--reasoning-parser", "qwen3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        status = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    status = r.status
                    break
            except OSError:
                time.sleep(0.05)
        assert status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
            assert b'"id":"/models/qwen"' in r.read()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(5)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0  # stopped by SIGTERM before proc.wait's 5 s ran out
    ignored = [ln for ln in out.splitlines() if ln.startswith("truthput-sim: ignoring flags")]
    assert ignored and "--enable-frobnication" in ignored[0] and "--frob-level" in ignored[0]
    assert "--reasoning-parser" in ignored[0]
    assert "SIMULATOR" in out and "Application startup complete." in out


@pytest.mark.parametrize("cmd", [["truthput.sim"], ["truthput", "sim"]])
def test_both_entry_points_reach_the_parser(cmd):
    p = subprocess.run([PY, "-m", *cmd, "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "--sim-gpu" in p.stdout


def test_sigterm_with_open_streams_exits_0_within_a_second():
    import threading

    port = _free_port()
    proc = subprocess.Popen(
        [PY, "-m", "truthput.sim", "serve", "--sim-model", "llama-3.1-8b", "--sim-gpu", "RTX 3090",
         "--max-model-len", "4096", "--port", str(port), "--sim-startup-s", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def long_stream():
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=b'{"prompt":"x","max_tokens":3000,"ignore_eos":true,"stream":true}',
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                while r.readline():
                    pass
        except OSError:
            pass

    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        threads = [threading.Thread(target=long_stream, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(5)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0  # stopped by SIGTERM before proc.wait's 5 s ran out


def _outward_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, the kernel picks the route's source
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


@pytest.mark.parametrize("host", ["0", "0.0.0.0", "::"])
def test_sim_serve_with_an_all_interfaces_host_listens_on_loopback_only(host):
    """`--host 0` (or 0.0.0.0, ::) without --allow-remote: the simulator says so and listens on
    127.0.0.1 only; the machine's outward address refuses the connection."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "truthput.sim", "serve", "--sim-gpu", "H100 SXM",
                             "--sim-model", "llama-3.1-8b", "--sim-startup-s", "0", "--host", host, "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        up = False
        while time.monotonic() < deadline and not up:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                up = True
            except OSError:
                time.sleep(0.1)
        assert up, "the simulator never answered on 127.0.0.1"
        outward = _outward_address()
        if outward is not None:
            with pytest.raises(OSError):
                socket.create_connection((outward, port), timeout=2).close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert f"binding 127.0.0.1 instead of {host!r}" in out and "--allow-remote" in out


@pytest.mark.parametrize("host", ["0", "0.0.0.0", "::", "[::]"])
def test_a_server_told_to_listen_on_all_addresses_is_reached_on_loopback(host):
    """`[server] host = "0"` (or "::"): the server binds as told, and truthput's client, readiness
    probe and port checks reach it on the loopback; no 600-s wait, no traceback."""
    import asyncio

    from truthput.engines.ports import base_url, free_port
    from truthput.engines.process import ProcessEngine

    port = free_port(host)
    assert base_url(host, port) == f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "truthput.sim", "serve", "--sim-gpu", "H100 SXM", "--sim-model", "llama-3.1-8b",
            "--sim-startup-s", "0", "--host", host, "--port", str(port)]

    async def go() -> bool:
        engine = ProcessEngine("sim", argv, host, port, ready_timeout_s=30, stop_grace_s=5)
        outcome = await engine.start()
        await engine.stop()
        return outcome.ok

    ok = asyncio.run(go())
    assert ok  # ready within its ready_timeout_s (a start that is not fails)
